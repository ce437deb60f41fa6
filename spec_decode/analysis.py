"""The paper's analysis (Leviathan et al. 2023, Section 3) and measurements.

alpha is the expected acceptance rate, gamma the number of draft tokens per
iteration, c the cost of one draft step relative to one target step, and
c_hat the draft's arithmetic operations per token relative to the target's.
The paper assumes scoring gamma + 1 tokens costs the target as much as one
step (true when decoding is memory-bound on an accelerator); `verify_cost`
below relaxes that for machines where it does not hold, such as CPUs.
"""

import itertools
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np

from spec_decode.decoding import DecodeResult
from spec_decode.model import Model
from spec_decode.model import model as model_lib


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


def prefix_distributions(dists: Sequence[Any], depth: int, name: str
                         ) -> list:
  """Per-prefix distributions as arrays indexed [x_1, ..., x_i, :].

  Element i of `dists` is the distribution after a prefix of i tokens:
  either one [vocab] vector (the same after every prefix) or an array of
  shape [vocab] * (i + 1) (context dependent).
  """
  if len(dists) < depth:
    raise ValueError(f'{name} must hold at least {depth} distributions, got '
                     f'{len(dists)}.')
  arrays = [np.asarray(d, np.float64) for d in dists[:depth]]
  vocab = arrays[0].shape[-1]
  tree = []
  for i, array in enumerate(arrays):
    shape = (vocab,) * (i + 1)
    if array.ndim == 1 and array.shape == (vocab,):
      array = np.broadcast_to(array, shape)
    if array.shape != shape:
      raise ValueError(f'{name}[{i}] must have shape ({vocab},) or {shape}, '
                       f'got {array.shape}.')
    if np.any(array < 0) or not np.allclose(array.sum(-1), 1.0, atol=1e-5):
      raise ValueError(f'{name}[{i}] must hold probability distributions.')
    # Exactly normalised in float64: block verification's guarantee (never
    # fewer accepted tokens than token by token) holds for distributions;
    # float32 inputs off by 1e-7 would break it by ~1e-9.
    tree.append(array / array.sum(-1, keepdims=True))
  return tree


def accepted_given_block(p_path, q_path, block, verification: str) -> float:
  """E[accepted tokens | draft block] under one verification rule."""
  gamma = len(block)
  ratios = [p_path[i][x] / q_path[i][x] for i, x in enumerate(block)]
  if verification == 'token':
    # Accepted while every token so far passed: sum_k prod_{i<=k} min(1, r_i).
    return float(np.sum(np.cumprod(np.minimum(ratios, 1.0))))
  weights = [1.0]
  for ratio in ratios:
    weights.append(min(weights[-1] * ratio, 1.0))
  keep = []
  for i in range(1, gamma + 1):
    if i == gamma:
      keep.append(weights[gamma])
      continue
    residual = np.maximum(weights[i] * p_path[i] - q_path[i], 0.0).sum()
    denominator = residual + 1.0 - weights[i]
    keep.append(residual / denominator if denominator > 0 else 1.0)
  # tau is the largest i whose uniform falls under h_i.
  expected, none_longer = 0.0, 1.0
  for i in range(gamma, 0, -1):
    expected += i * keep[i - 1] * none_longer
    none_longer *= 1.0 - keep[i - 1]
  return expected


def _expected_accepted(p: Sequence[Any], q: Sequence[Any],
                       verification: str) -> float:
  gamma = len(q)
  if gamma < 1:
    raise ValueError('q must hold at least one distribution (gamma >= 1).')
  q_tree = prefix_distributions(q, gamma, 'q')
  p_tree = prefix_distributions(p, gamma + 1, 'p')
  vocab = q_tree[0].shape[-1]
  if p_tree[0].shape[-1] != vocab:
    raise ValueError('p and q must share a vocabulary.')
  total = 0.0
  for block in itertools.product(range(vocab), repeat=gamma):
    q_path = [q_tree[i][block[:i]] for i in range(gamma)]
    probability = float(np.prod([q_path[i][x] for i, x in enumerate(block)]))
    if probability > 0.0:
      p_path = [p_tree[i][block[:i]] for i in range(gamma + 1)]
      total += probability * accepted_given_block(p_path, q_path, block,
                                                   verification)
  return total


def expected_accepted_tokens_token(p: Sequence[Any], q: Sequence[Any]
                                   ) -> float:
  """EXACT E[accepted draft tokens per iteration], token verification.

  Enumerates every draft block (vocab^gamma of them: small vocabularies
  only). With context-independent distributions equal at every position
  this is alpha + ... + alpha^gamma, Eq. 1 minus the one extra token.

  Args:
    p: gamma + 1 target distributions; element i (after i tokens) is a
      [vocab] vector or a [vocab] * (i + 1) array indexed by the prefix.
    q: gamma draft distributions in the same form; len(q) is gamma.

  Returns:
    The expected accepted count; tokens per iteration is this plus 1.
  """
  return _expected_accepted(p, q, 'token')


def expected_accepted_tokens_block(p: Sequence[Any], q: Sequence[Any]
                                   ) -> float:
  """EXACT E[accepted draft tokens per iteration], block verification.

  Same arguments as `expected_accepted_tokens_token`, in float64,
  independently of `spec_decode.block_verification`. The paper's
  motivating example (p = (1/3, 2/3), q = (2/3, 1/3), gamma 2) gives 11/9
  against token verification's 10/9.

  Returns:
    The expected accepted count (never below token verification's);
    tokens per iteration is this plus 1.
  """
  return _expected_accepted(p, q, 'block')


def expected_tokens_per_iteration(p: Sequence[Any], q: Sequence[Any],
                                  verification: str = 'token') -> float:
  """EXACT E[tokens emitted per target call]: accepted plus one.

  Args:
    p: gamma + 1 target distributions (see `expected_accepted_tokens_token`).
    q: gamma draft distributions.
    verification: 'token' or 'block'.

  Returns:
    1 + E[accepted tokens].
  """
  if verification not in ('token', 'block'):
    raise ValueError(f"verification must be 'token' or 'block', got "
                     f'{verification!r}.')
  return 1.0 + _expected_accepted(p, q, verification)


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


def c_hat(target: Model, draft: Model) -> float:
  """Arithmetic-operations ratio per token, from decoder parameter counts."""
  return (model_lib.parameter_count(draft.params['decoder'])
          / model_lib.parameter_count(target.params['decoder']))


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
    `alpha` (empirical), `alpha_beta` (Corollary 3.6),
    `tokens_per_target_call` (emitted: the last call of an output keeps
    only the tokens up to its end), `accepted_per_target_call` (what the
    rule accepted, plus the one token every call adds: what
    `candidate_analysis` predicts), and with several candidates per row
    `first_token_acceptance` (P_k, averaged over calls; else None).
  """
  if isinstance(results, DecodeResult):
    results = [results]
  lengths = _pooled(results, 'lengths').sum()
  calls = _pooled(results, 'target_calls')
  accepted = _pooled(results, 'draft_tokens_accepted').sum()
  first = None
  if all(r.first_token_acceptance is not None for r in results):
    rates = _pooled(results, 'first_token_acceptance')
    active = calls > 0
    first = (float(np.average(rates[active], weights=calls[active]))
             if active.any() else None)
  total_calls = max(calls.sum(), 1)
  return {'alpha': empirical_alpha(results),
          'alpha_beta': corollary_alpha(results),
          'tokens_per_target_call': float(lengths / total_calls),
          'accepted_per_target_call': float(1.0 + accepted / total_calls),
          'first_token_acceptance': first}
