"""The paper's analysis (Leviathan et al. 2023, Section 3) and measurements.

alpha is the expected acceptance rate, gamma the number of draft tokens per
iteration, c the cost of one draft step relative to one target step, and
c_hat the draft's arithmetic operations per token relative to the target's.
The paper assumes scoring gamma + 1 tokens costs the target as much as one
step (true when decoding is memory-bound on an accelerator); `verify_cost`
below relaxes that for machines where it does not hold, such as CPUs.
"""

import functools
from typing import Any, Callable, Dict, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import benchmark
from spec_decode import compile as compile_lib
from spec_decode.decoding import DecodeResult
from spec_decode.model import init_cache
from spec_decode.model import Model
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding


def _check_alpha(alpha):
  alpha = np.asarray(alpha, np.float64)
  if np.any((alpha < 0) | (alpha > 1)):
    raise ValueError(f'alpha must be in [0, 1], got {alpha}.')
  return alpha


def _check_gamma(gamma):
  gamma = np.asarray(gamma)
  if np.any(gamma < 0) or not np.all(np.equal(np.mod(gamma, 1), 0)):
    raise ValueError(f'gamma must be a non-negative integer, got {gamma}.')
  return gamma.astype(np.float64)


def expected_tokens(alpha, gamma):
  """E[tokens per iteration] = (1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1).

  Args:
    alpha: Acceptance rate in [0, 1] (scalar or array).
    gamma: Draft tokens per iteration.

  Returns:
    The expected number of tokens each target call produces (gamma + 1 at
    alpha = 1).
  """
  alpha, gamma = _check_alpha(alpha), _check_gamma(gamma)
  with np.errstate(divide='ignore', invalid='ignore'):
    value = (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)
  return np.where(alpha == 1.0, gamma + 1.0, value)[()]


def walltime_improvement(alpha, gamma, c, verify_cost=1.0):
  """Expected speedup over baseline decoding (Theorem 3.8).

  Args:
    alpha: Acceptance rate.
    gamma: Draft tokens per iteration.
    c: Draft step time over target step time.
    verify_cost: Time of one target call on gamma + 1 tokens over one
      single-token step; 1 in the paper.

  Returns:
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + verify_cost)).
  """
  return expected_tokens(alpha, gamma) / (
      _check_gamma(gamma) * np.asarray(c, np.float64) + verify_cost)


def expected_target_calls(alpha: float, gamma: int, length: int) -> float:
  """E[target calls] to emit `length` tokens, when the output must stop there.

  Eq. 1 counts tokens per call on an endless output. A real output stops at
  EOS (or its length limit), so its last call keeps only the tokens up to
  the end: short outputs get fewer tokens per call than Eq. 1 says, whatever
  the implementation. With i.i.d. acceptance (the paper's assumption) a call
  emits K = k tokens with probability alpha^(k-1) (1 - alpha) for k <= gamma
  and alpha^gamma for k = gamma + 1; then
  E[calls(n)] = 1 + sum_k P(K = k) E[calls(max(n - k, 0))], E[calls(0)] = 0.

  Args:
    alpha: Acceptance rate in [0, 1].
    gamma: Draft tokens per iteration (>= 0).
    length: Tokens to emit (>= 0).

  Returns:
    The expected number of target calls (`length` at alpha = 0).
  """
  alpha = float(_check_alpha(alpha))
  gamma = int(_check_gamma(gamma))
  length = int(length)
  if length < 0:
    raise ValueError(f'length must be >= 0, got {length}.')
  # P(K = k) for k = 1 .. gamma + 1.
  emitted = np.array([alpha ** (k - 1) * (1.0 - alpha) for k in
                      range(1, gamma + 1)] + [alpha ** gamma])
  calls = np.zeros(length + 1)
  for n in range(1, length + 1):
    rest = np.maximum(n - np.arange(1, gamma + 2), 0)
    calls[n] = 1.0 + float(np.dot(emitted, calls[rest]))
  return float(calls[length])


def walltime_improvement_at_lengths(alpha: float, gamma: int, c: float,
                                    lengths: Sequence[int],
                                    verify_cost: float = 1.0) -> float:
  """Theorem 3.8 for outputs of the given lengths instead of endless ones.

  Baseline decoding takes one target step per token; speculative decoding
  takes `expected_target_calls` iterations per output, each costing
  gamma c + verify_cost target steps. Tends to `walltime_improvement` as the
  lengths grow.

  Args:
    alpha: Acceptance rate.
    gamma: Draft tokens per iteration.
    c: Draft step time over target step time.
    lengths: Output lengths in tokens (e.g. the baseline's, which greedy
      speculative decoding reproduces).
    verify_cost: Target call on gamma + 1 tokens over one step.

  Returns:
    sum(lengths) / (sum of expected calls x (gamma c + verify_cost)).
  """
  lengths = [int(n) for n in lengths]
  if not lengths or sum(lengths) == 0:
    raise ValueError('lengths must contain at least one non-zero length.')
  calls = {n: expected_target_calls(alpha, gamma, n) for n in set(lengths)}
  total_calls = sum(calls[n] for n in lengths)
  return float(sum(lengths) / (total_calls * (gamma * float(c)
                                              + float(verify_cost))))


def optimal_gamma(alpha: float, c: float, max_gamma: int = 32,
                  verify_cost=None) -> int:
  """The gamma in [1, max_gamma] with the largest walltime improvement.

  Args:
    alpha: Acceptance rate.
    c: Cost coefficient.
    max_gamma: Largest gamma considered.
    verify_cost: None for the paper's model, or a function gamma -> cost of
      verifying gamma + 1 tokens (relative to one step).

  Returns:
    The best gamma (ties go to the smaller one).
  """
  gammas = np.arange(1, max_gamma + 1)
  costs = (np.ones_like(gammas, dtype=np.float64) if verify_cost is None
           else np.array([verify_cost(g) for g in gammas], np.float64))
  values = walltime_improvement(alpha, gammas, c, costs)
  return int(gammas[int(np.argmax(values))])


def ops_factor(alpha, gamma, c_hat):
  """Factor by which arithmetic operations grow (Theorem 3.11).

  Returns:
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)).
  """
  return (_check_gamma(gamma) * np.asarray(c_hat, np.float64)
          + _check_gamma(gamma) + 1.0) / expected_tokens(alpha, gamma)


def _pooled(results: Union[DecodeResult, Sequence[DecodeResult]], field: str
            ) -> np.ndarray:
  """One statistic of one or several results, rows concatenated."""
  if isinstance(results, DecodeResult):
    results = [results]
  return np.concatenate([np.ravel(np.asarray(getattr(r, field), np.float64))
                         for r in results])


def empirical_alpha(results: Union[DecodeResult, Sequence[DecodeResult]]
                    ) -> float:
  """Accepted / examined draft tokens, pooled over rows and results.

  alpha is the chance that a draft token is accepted when the target
  examines it. Tokens after the first rejection of an iteration are never
  examined, so accepted / proposed would estimate alpha(1 - alpha^gamma) /
  ((1 - alpha) gamma) instead (0.31 for alpha 0.63, gamma 5).

  Args:
    results: Speculative `DecodeResult`s.

  Returns:
    The pooled rate (NaN when nothing was examined).
  """
  examined = _pooled(results, 'verified_positions').sum()
  accepted = _pooled(results, 'draft_tokens_accepted').sum()
  return float(accepted / examined) if examined else float('nan')


def corollary_alpha(results: Union[DecodeResult, Sequence[DecodeResult]]
                    ) -> float:
  """Mean beta over every examined position (Corollary 3.6), pooled.

  Args:
    results: Speculative `DecodeResult`s.

  Returns:
    The pooled mean of beta (NaN when nothing was examined).
  """
  counts = _pooled(results, 'verified_positions')
  beta = _pooled(results, 'mean_beta')
  valid = counts > 0
  if not valid.any():
    return float('nan')
  return float(np.average(beta[valid], weights=counts[valid]))


@functools.lru_cache(maxsize=None)
def _decode_steps_function(config):
  """A compiled loop of decoder calls, each fed the previous argmax.

  Timing calls inside one compiled loop, as the decoders make them, leaves
  out the per-call dispatch a separately jitted step would add (a large part
  of a small draft's step on a CPU). Feeding each call the previous call's
  argmax keeps the compiler from hoisting work out of the loop, and the trip
  count is a traced argument, so the loop is a real while loop (the
  decoders' loops are) rather than one the compiler may unroll.
  """

  def run(params, tokens, start, cache, encoded, steps):
    chunk_len = tokens.shape[1]

    def body(i, carry):
      tokens, cache = carry
      logits, cache = decode_chunk(config, params, tokens,
                                   start + i * chunk_len, cache, encoded)
      return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache

    return jax.lax.fori_loop(0, steps, body, (tokens, cache))[0]

  return compile_lib.decoder_jit(run)


@functools.lru_cache(maxsize=None)
def _prepare_function(config):
  # One compiled encoder per config, not one per timing (a new `partial`
  # each time would be traced and compiled again).
  return jax.jit(functools.partial(prepare_decoding, config))


def timed_decoder_calls(model: Model, encoder_input_tokens: Any,
                         chunk_len: int, position: int, steps: int,
                         cache_steps: Optional[int] = None
                         ) -> Callable[[], Any]:
  """A zero-argument callable running `steps` decoder calls of `chunk_len`.

  Args:
    model: The model.
    encoder_input_tokens: int [batch, enc_len] inputs.
    chunk_len: Tokens per row per call.
    position: Decoder position of the first call.
    steps: Calls per run.
    cache_steps: Size the cache for this many calls (>= steps); callables
      with equal `cache_steps` share one compiled loop whatever `steps`.

  Returns:
    The callable.
  """
  enc = jnp.asarray(encoder_input_tokens, jnp.int32)
  batch = enc.shape[0]
  config = model.config
  encoded = _prepare_function(config)(model.params, enc)
  cache_steps = max(steps, cache_steps or steps)
  cache = init_cache(config, batch, position + cache_steps * chunk_len + 8)
  run = _decode_steps_function(config)
  tokens = jnp.ones((batch, chunk_len), jnp.int32)
  start = jnp.full((batch,), position, jnp.int32)
  count = jnp.asarray(steps, jnp.int32)
  return lambda: run(model.params, tokens, start, cache, encoded, count)


def decoder_step_seconds(model: Model, encoder_input_tokens: Any,
                         chunk_len: int = 1, repeats: int = 20,
                         position: int = 8, steps: int = 8) -> float:
  """Median time of one decoder call scoring `chunk_len` tokens per row.

  Args:
    model: The model.
    encoder_input_tokens: int [batch, enc_len] inputs.
    chunk_len: Tokens each call scores per row (1 for a decoding step,
      gamma + 1 for a verification).
    repeats: Timed runs (their median counts).
    position: Decoder position of the first call.
    steps: Calls per timed run, inside one compiled loop.

  Returns:
    Seconds per call.
  """
  call = timed_decoder_calls(model, encoder_input_tokens, chunk_len,
                              position, steps)
  return benchmark.median(benchmark.interleaved_timings(
      {'calls': call}, repeats, warmup=2)['calls']) / steps


def measure_costs(target: Model, draft: Model, encoder_input_tokens: Any,
                  gamma: int, repeats: int = 20, steps: int = 8
                  ) -> Dict[str, float]:
  """Measures c and the verification cost on this machine.

  The three kinds of call are timed in turn (interleaved), each inside a
  compiled loop of `steps` calls, so a noisy neighbour slows all of them
  alike and per-call dispatch is left out, as inside the decoders.

  Args:
    target: The target.
    draft: The draft.
    encoder_input_tokens: int [batch, enc_len] inputs.
    gamma: Draft tokens per iteration (the target scores gamma + 1).
    repeats: Timed runs per kind of call.
    steps: Calls per timed run.

  Returns:
    `c`: draft step / target step (one token each); `verify_cost`: target
    call on gamma + 1 tokens / target step; and the raw seconds.
  """
  calls = {
      'target_step_seconds': (target, 1),
      'draft_step_seconds': (draft, 1),
      'target_verify_seconds': (target, gamma + 1),
  }
  timings = benchmark.interleaved_timings(
      {name: timed_decoder_calls(model, encoder_input_tokens, chunk_len,
                                  8, steps)
       for name, (model, chunk_len) in calls.items()}, repeats, warmup=2)
  seconds = {name: benchmark.median(values) / steps
             for name, values in timings.items()}
  return {'c': seconds['draft_step_seconds'] / seconds['target_step_seconds'],
          'verify_cost': (seconds['target_verify_seconds']
                          / seconds['target_step_seconds']),
          **seconds}


def parameter_count(model: Model, decoder_only: bool = False) -> int:
  params = model.params['decoder'] if decoder_only else model.params
  return int(sum(np.prod(np.shape(x))
                 for x in jax.tree_util.tree_leaves(params)))


def c_hat(target: Model, draft: Model) -> float:
  """Arithmetic-operations ratio per token, from decoder parameter counts."""
  return parameter_count(draft, True) / parameter_count(target, True)


def predicted_speedup(alpha: float, gamma: int, costs: Dict[str, float],
                      include_verify_cost: bool = True) -> float:
  """Theorem 3.8 with measured c (and, optionally, verification cost)."""
  verify = costs['verify_cost'] if include_verify_cost else 1.0
  return float(walltime_improvement(alpha, gamma, costs['c'], verify))


def summarize_result(results: Union[DecodeResult, Sequence[DecodeResult]]
                     ) -> Dict[str, Optional[float]]:
  """Acceptance figures of one or several speculative `DecodeResult`s.

  Args:
    results: Speculative `DecodeResult`s (pooled over rows and results).

  Returns:
    `alpha` (empirical), `alpha_beta` (Corollary 3.6) and
    `tokens_per_target_call`.
  """
  lengths = _pooled(results, 'lengths').sum()
  calls = _pooled(results, 'target_calls').sum()
  return {'alpha': empirical_alpha(results),
          'alpha_beta': corollary_alpha(results),
          'tokens_per_target_call': float(lengths / max(calls, 1))}
