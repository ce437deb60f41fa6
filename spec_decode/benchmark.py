"""Timing helpers: interleaved, warmed-up, medians; decoder calls as timed.

These machines are shared and noisy, so comparisons are ratios measured in one
run: every variant is compiled and run once first, then the variants take
turns, and each call waits for its result (`block_until_ready`). The paper's
cost terms (c, the cost of scoring gamma + 1 tokens) are timed here, inside
compiled loops of decoder calls as the decoders make them; the formulas that
use them are in `analysis`.
"""

import contextlib
import functools
import statistics
import time
from typing import (Any, Callable, Dict, List, Mapping, NamedTuple,
                    Optional, Sequence, Tuple, Union)

import jax
import jax.numpy as jnp

from spec_decode import adaptive
from spec_decode import compile as compile_lib
from spec_decode import decoding
from spec_decode import kernels
from spec_decode import speculative
from spec_decode.model import init_cache
from spec_decode.model import Model
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding
from spec_decode.sampling import SamplingConfig


def time_call(fn: Callable[[], Any]) -> float:
  """Seconds one call takes, waiting until its device arrays are ready."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def balanced_orders(count: int) -> List[List[int]]:
  """Orders of `count` variants in which each follows every other equally
  often (a Williams design: `count` rows, twice that for an odd count).

  A call can run slower right after a different program than after itself
  (caches hold the last program's data). A fixed order gives each variant
  the same predecessor every time, which biases the ratios between them;
  rows taken in turn spread the predecessors evenly.
  """
  first, low, high = [0], 1, count - 1
  while len(first) < count:
    first.append(low)
    low += 1
    if len(first) < count:
      first.append(high)
      high -= 1
  rows = [[(v + shift) % count for v in first] for shift in range(count)]
  if count % 2:
    rows += [row[::-1] for row in rows]
  return rows


def interleaved_timings(fns: Mapping[str, Callable[[], Any]], repeats: int,
                        warmup: int = 1, start: int = 0
                        ) -> Dict[str, List[float]]:
  """Times several variants in turn after warming each up.

  Each repeat runs every variant once, in the next order of
  `balanced_orders`, so no variant always follows the same other one.

  Args:
    fns: Name -> zero-argument callable returning device arrays.
    repeats: Timed calls per variant.
    warmup: Untimed calls per variant first (compilation).
    start: The first repeat's row of `balanced_orders` (a caller timing
      many inputs passes the rows used so far, so they keep rotating).

  Returns:
    Name -> list of seconds per call.
  """
  for fn in fns.values():
    for _ in range(warmup):
      time_call(fn)
  names = list(fns)
  orders = balanced_orders(len(names))
  timings = {name: [] for name in fns}
  for repeat in range(repeats):
    for index in orders[(start + repeat) % len(orders)]:
      timings[names[index]].append(time_call(fns[names[index]]))
  return timings


def median(values: List[float]) -> float:
  return float(statistics.median(values))


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

  def run(params, prepared, tokens, start, cache, encoded, steps):
    chunk_len = tokens.shape[1]

    def body(i, carry):
      tokens, cache = carry
      logits, cache = decode_chunk(config, params, tokens,
                                   start + i * chunk_len, cache, encoded,
                                   prepared)
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
                         cache_length: Optional[int] = None
                         ) -> Callable[[], Any]:
  """A zero-argument callable running `steps` decoder calls of `chunk_len`.

  Args:
    model: The model.
    encoder_input_tokens: int [batch, enc_len] inputs.
    chunk_len: Tokens per row per call.
    position: Decoder position of the first call.
    steps: Calls per run.
    cache_length: Cache slots (at least what the calls write); callables
      with equal `cache_length` and `chunk_len` share one compiled loop
      whatever `steps`. Default: what the calls write, plus 8.

  Returns:
    The callable.
  """
  enc = jnp.asarray(encoder_input_tokens, jnp.int32)
  batch = enc.shape[0]
  config = model.config
  encoded = _prepare_function(config)(model.device_params, enc)
  needed = position + steps * chunk_len
  if cache_length is not None and cache_length < needed:
    raise ValueError(f'cache_length {cache_length} is shorter than the '
                     f'{needed} slots {steps} calls of {chunk_len} write.')
  cache = init_cache(config, batch, cache_length or needed + 8)
  run = _decode_steps_function(config)
  tokens = jnp.ones((batch, chunk_len), jnp.int32)
  start = jnp.full((batch,), position, jnp.int32)
  count = jnp.asarray(steps, jnp.int32)
  prepared = model.decode_kernels
  params = model.device_params
  return lambda: run(params, prepared, tokens, start, cache, encoded, count)


WITHOUT_AMX = 'without amx'


def kernel_setting(use_kernel: Union[bool, str]):
  """A context in which models prepare the decode path `use_kernel` names.

  Args:
    use_kernel: False: XLA's dots; True: the few-row kernel (where it is
      available) with the current product inputs; 'float32' or 'bfloat16':
      the kernel with those product inputs (`kernels.set_product_inputs`),
      '... without amx' after either: and AMX tiles switched off
      (`kernels.set_amx_enabled`).

  Returns:
    A context manager.
  """
  stack = contextlib.ExitStack()
  stack.enter_context(kernels.enabled_as(bool(use_kernel)))
  if isinstance(use_kernel, str):
    inputs, _, rest = use_kernel.partition(' ')
    if rest not in ('', WITHOUT_AMX):
      raise ValueError(f"use_kernel must be a product input or one followed "
                       f"by ' {WITHOUT_AMX}', got {use_kernel!r}.")
    stack.enter_context(kernels.product_inputs_as(inputs))
    if rest:
      stack.enter_context(kernels.amx_enabled_as(False))
  return stack


def decoder_call_seconds(variants: Mapping[Any, Tuple[Model, int,
                                                      Union[bool, str]]],
                         encoder_input_tokens: Any, repeats: int = 7,
                         steps: int = 12, position: int = 8
                         ) -> Dict[Any, float]:
  """Seconds one decoder call takes, for several kinds of call at once.

  Each kind runs inside a compiled while loop, as the decoders make its
  calls, once for the whole span of positions and once for two calls per
  timed run; the difference over the calls between is one call without the
  per-run dispatch (which a decoding loop pays once per `generate`, not per
  step). Every kind's calls cover the same positions, the widest kind's
  `steps` calls' span (a kind of K tokens makes `steps * widest / K`
  calls), in a cache of one length: as in decoding, where a K-token call
  attends the keys the K one-token calls it replaces attend on average.
  (The attention kernel skips a cache's masked tail, so a call costs what
  its position makes it attend; covering different spans per width would
  charge the wide calls for attending further.) All runs take turns
  (interleaved, after warm-up), and medians count.

  Args:
    variants: Name -> (model, tokens per row per call, the products' path
      as `kernel_setting` takes it).
    encoder_input_tokens: int [batch, enc_len] probe inputs.
    repeats: Timed runs per kind of call.
    steps: Calls of the widest kind in the longer run (> 2).
    position: Decoder position of the first call.

  Returns:
    Name -> seconds per call.
  """
  calls = {}
  widest = max(chunk_len for _, chunk_len, _ in variants.values())
  span = steps * widest
  cache_length = position + span + 8
  counts = {}
  for name, (model, chunk_len, use_kernel) in variants.items():
    counts[name] = span // chunk_len
    with kernel_setting(use_kernel):
      for count in (2, counts[name]):
        calls[(name, count)] = timed_decoder_calls(
            model, encoder_input_tokens, chunk_len, position, count,
            cache_length=cache_length)
  timings = interleaved_timings(calls, repeats, warmup=1)
  seconds = {}
  for name in variants:
    long = median(timings[(name, counts[name])])
    short = median(timings[(name, 2)])
    # Clamped: noise must not make a call free.
    seconds[name] = max(long - short, 0.05 * long) / (counts[name] - 2)
  return seconds


class LoopTiming(NamedTuple):
  """One decoding loop's time, split as a call spends it.

  Attributes:
    iteration_seconds: One iteration of the loop.
    call_seconds: What a call spends beyond its iterations, once (encoder
      passes, setting up caches, dispatch, the last copies), >= 0.
  """
  iteration_seconds: float
  call_seconds: float


# The key `loop_iteration_seconds` times gamma='auto''s program under when
# every row decodes plainly (proposes nothing) at every iteration.
PLAIN = 'plain'
# The shorter of the two outputs `loop_iteration_seconds` differences: long
# enough that an iteration proposing 7 tokens fits in it (shorter, such a
# row proposes less, and the two runs differ in kind, not in iterations).
SHORT_LENGTH = 8


def loop_iteration_seconds(target: Model, draft: Model,
                           encoder_input_tokens: Any,
                           counts: Sequence[int], max_gamma: int,
                           repeats: int = 7, length: int = 64,
                           temperature: float = 1.0,
                           plain: bool = False) -> Dict[Any, LoopTiming]:
  """Seconds one iteration of the decoders' own loops takes, per count,
  and what a call spends beyond its iterations.

  For each count g (0: baseline decoding; else gamma='auto''s own loop at
  `max_gamma` with every row proposing g, `adaptive.forced_costs`: the
  program the rule's choices run in, its per-width loops, catch-ups and
  rule included) the probe is decoded to `length` tokens and to
  `SHORT_LENGTH`, with no EOS, so every row runs to the end and the number of
  iterations is the loop's own. (An early EOS would share one program
  between the two, but at a temperature the rows of a batch sample
  different tokens, so one row's EOS does not stop the others.) All runs
  take turns after warm-up; the difference in time over the difference in
  iterations is one iteration, everything in it: decoder calls, sampling
  (or argmax, greedy), verification, bookkeeping. The shorter run's time
  less its iterations is what the call spends once.

  Args:
    target: The target.
    draft: The draft.
    encoder_input_tokens: int [batch, enc_len] probe inputs.
    counts: Draft tokens per iteration to measure (0 for baseline).
    max_gamma: gamma='auto''s largest count (>= every count).
    repeats: Timed runs per count and length.
    length: Output length of the longer run (>= 2 * SHORT_LENGTH): the
      longer, the more iterations in the difference (at 7 proposals an
      iteration may emit 8 tokens) and the smaller the share of the
      machine's noise in it.
    temperature: 0 times greedy decoding's iterations.
    plain: Also time gamma='auto''s program with every row proposing
      nothing (plain target steps in the speculative loop), under `PLAIN`.

  Returns:
    count (or `PLAIN`) -> its `LoopTiming`.
  """
  if length < 2 * SHORT_LENGTH:
    raise ValueError(f'length must be >= {2 * SHORT_LENGTH}, got {length}.')
  enc = jnp.asarray(encoder_input_tokens, jnp.int32)
  sampling = SamplingConfig(temperature)
  rng = jax.random.PRNGKey(0)
  lengths = {'full': length, 'short': SHORT_LENGTH}
  results = {}

  def decode(count, max_decode_len):
    if count == 0:
      return decoding.baseline_generate(
          target.config, target.device_params, enc, rng, max_decode_len,
          sampling, -1, None, target.decode_kernels)  # -1: never emitted.
    # One compiled program for every count: the costs are traced.
    return speculative.speculative_generate(
        target, draft, enc, rng=rng, max_decode_len=max_decode_len,
        sampling=sampling, eos_id=-1, gamma=max_gamma, lenience=1.0,
        proposal_costs=adaptive.forced_costs(
            0 if count == PLAIN else count, max_gamma))

  keys = tuple(counts) + ((PLAIN,) if plain else ())
  calls = {}
  for count in keys:
    for name, max_decode_len in lengths.items():
      def call(count=count, name=name, max_decode_len=max_decode_len):
        results[(count, name)] = decode(count, max_decode_len)
        return results[(count, name)].tokens
      calls[(count, name)] = call
  timings = interleaved_timings(calls, repeats, warmup=1)
  timed = {}
  for count in keys:
    iterations = [int(results[(count, name)].num_iterations)
                  for name in ('short', 'full')]
    short = median(timings[(count, 'short')])
    spent = median(timings[(count, 'full')]) - short
    per_iteration = max(spent, 1e-9) / max(iterations[1] - iterations[0], 1)
    timed[count] = LoopTiming(
        per_iteration, max(short - iterations[0] * per_iteration, 0.0))
  return timed


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
  return median(interleaved_timings(
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
  timings = interleaved_timings(
      {name: timed_decoder_calls(model, encoder_input_tokens, chunk_len,
                                  8, steps)
       for name, (model, chunk_len) in calls.items()}, repeats, warmup=2)
  seconds = {name: median(values) / steps
             for name, values in timings.items()}
  return {'c': seconds['draft_step_seconds'] / seconds['target_step_seconds'],
          'verify_cost': (seconds['target_verify_seconds']
                          / seconds['target_step_seconds']),
          **seconds}
