"""Decoder costs measured where decoding runs, and cached.

Whether speculation pays depends on the machine: how much more a target call
costs when it scores K tokens instead of one (1.2x on one CPU, 1.7x on
another, ~1x on an accelerator at batch 1) and what a draft step costs next
to a target step (c). So `gamma='auto'` measures both here, once per
(target shapes, draft shapes, batch size, backend, device, CPU model and
flags, jax version, decoder kernels), keeps them in a small JSON file under
the user's cache directory, and hands them to the rule inside the compiled
loop (`adaptive`). The pair's acceptance and its usual output length are
kept in the same file (`acceptance`).

The cache (`cost_cache`) is never trusted blindly: an unreadable,
malformed or wrong-version file, or an entry whose figures are not positive
numbers, is measured again.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import platform
import weakref
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import adaptive
from spec_decode import benchmark
from spec_decode import cost_cache
from spec_decode import kernels
from spec_decode import multihost_agreement
from spec_decode.cost_cache import cache_path
from spec_decode.cost_cache import read_cache
from spec_decode.model import Model

DEFAULT_MAX_GAMMA = 7


@dataclasses.dataclass(frozen=True)
class CostProfile:
  """Seconds per decoder call and per decoding iteration, at one batch size.

  Attributes:
    target_step_seconds: A target call scoring one token per row.
    draft_step_seconds: A draft call scoring one token per row.
    verify_seconds: verify_seconds[k - 1] is a target call scoring k tokens
      per row, k = 1 .. max_gamma + 1.
    iteration_counts: Draft tokens per iteration whose whole loop
      iteration was timed: 0 (baseline decoding) and each count that fills
      one of gamma='auto''s call widths (`adaptive.chunk_widths`).
    iteration_seconds: One iteration of the decoders' loops at those counts
      (decoder calls, sampling at temperature 1, verification, bookkeeping;
      `benchmark.loop_iteration_seconds`).
    greedy_iteration_seconds: The same, greedy (an argmax instead of each
      draw: cheaper, most of all for long proposals).
    plain_iteration_seconds: A plain target step (every row proposing
      nothing) inside gamma='auto''s loop, at temperature 1 (0: not
      measured, priced as a baseline step).
    greedy_plain_iteration_seconds: The same, greedy.
    call_seconds: What a baseline call spends once, beyond its iterations
      (the encoder pass, setting up caches, dispatch).
    call_extra_seconds: What a call of gamma='auto''s program whose rows
      propose spends once beyond that (the draft's encoder pass, its cache,
      a larger program to dispatch).
  """
  target_step_seconds: float
  draft_step_seconds: float
  verify_seconds: Tuple[float, ...]
  iteration_counts: Tuple[int, ...]
  iteration_seconds: Tuple[float, ...]
  greedy_iteration_seconds: Tuple[float, ...]
  plain_iteration_seconds: float = 0.0
  greedy_plain_iteration_seconds: float = 0.0
  call_seconds: float = 0.0
  call_extra_seconds: float = 0.0

  @property
  def c(self) -> float:
    """Draft step over target step (the paper's cost coefficient)."""
    return self.draft_step_seconds / self.target_step_seconds

  @property
  def max_gamma(self) -> int:
    return len(self.verify_seconds) - 1

  def verify_cost(self, gamma: int) -> float:
    """A target call on gamma + 1 tokens, in single-token target steps."""
    return self.verify_seconds[gamma] / self.target_step_seconds

  def _baseline_iteration(self, greedy: bool) -> float:
    return (self.greedy_iteration_seconds if greedy
            else self.iteration_seconds)[0]

  def iteration_cost(self, gamma: int, greedy: bool = False) -> float:
    """An iteration proposing gamma tokens (0: a baseline step), in baseline
    iterations of the same kind (greedy or sampled), timed at the smallest
    measured count >= gamma: what gamma='auto''s rule weighs."""
    index = next((i for i, count in enumerate(self.iteration_counts)
                  if count >= gamma), len(self.iteration_counts) - 1)
    seconds = (self.greedy_iteration_seconds if greedy
               else self.iteration_seconds)
    return seconds[index] / seconds[0]

  def plain_cost(self, greedy: bool = False) -> float:
    """A plain step inside gamma='auto''s loop, in baseline iterations
    (>= 1: that loop does all a baseline step does, and more)."""
    seconds = (self.greedy_plain_iteration_seconds if greedy
               else self.plain_iteration_seconds)
    return max(1.0, seconds / self._baseline_iteration(greedy))

  def call_cost(self, greedy: bool = False) -> float:
    """`call_seconds` in baseline iterations."""
    return self.call_seconds / self._baseline_iteration(greedy)

  def call_extra_cost(self, greedy: bool = False) -> float:
    """`call_extra_seconds` in baseline iterations."""
    return self.call_extra_seconds / self._baseline_iteration(greedy)

  def to_json(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, entry: Any) -> Optional['CostProfile']:
    """The profile an entry holds, or None if it is malformed."""
    try:
      profile = cls(float(entry['target_step_seconds']),
                    float(entry['draft_step_seconds']),
                    tuple(float(v) for v in entry['verify_seconds']),
                    tuple(int(v) for v in entry['iteration_counts']),
                    tuple(float(v) for v in entry['iteration_seconds']),
                    tuple(float(v) for v in entry['greedy_iteration_seconds']),
                    float(entry['plain_iteration_seconds']),
                    float(entry['greedy_plain_iteration_seconds']),
                    float(entry['call_seconds']),
                    float(entry['call_extra_seconds']))
    except (KeyError, TypeError, ValueError):
      return None
    values = (profile.target_step_seconds, profile.draft_step_seconds,
              *profile.verify_seconds, *profile.iteration_seconds,
              *profile.greedy_iteration_seconds,
              profile.plain_iteration_seconds,
              profile.greedy_plain_iteration_seconds, profile.call_seconds)
    if (len(profile.verify_seconds) < 2
        or not all(math.isfinite(v) and v > 0 for v in values)
        or not (math.isfinite(profile.call_extra_seconds)
                and profile.call_extra_seconds >= 0)
        or len(profile.iteration_counts) != len(profile.iteration_seconds)
        or len(profile.iteration_counts) != len(
            profile.greedy_iteration_seconds)
        or not profile.iteration_counts or profile.iteration_counts[0] != 0
        or list(profile.iteration_counts) != sorted(
            set(profile.iteration_counts))
        or profile.iteration_counts[-1] > profile.max_gamma):
      return None
    # An iteration timed below half its own target call is a failed
    # measurement (older versions kept such noise); measure again.
    for timed in (profile.iteration_seconds,
                  profile.greedy_iteration_seconds):
      if any(seconds < 0.5 * profile.verify_seconds[count]
             for count, seconds in zip(profile.iteration_counts, timed)):
        return None
    return profile


def machine_description() -> Dict[str, str]:
  """What the costs depend on besides the models: backend, device, CPU."""
  return dict(_machine_description())


def timing_report(settings: Dict[str, Any]) -> Dict[str, Any]:
  """Prints the machine and the decoder products' path; returns them with
  `settings` (a script's flags) as the head of the script's JSON report."""
  print(machine_line())
  print(f'decoder products: {kernels.available()}')
  return {'machine': machine_description(),
          'decoder_products': kernels.available(), 'flags': settings}


def machine_line() -> str:
  """'machine: backend cpu, device cpu, ..., cpu <model>, cpu_vector_flags
  ...': what every timing script prints before its figures."""
  return 'machine: ' + ', '.join(
      f'{k} {v}' for k, v in machine_description().items())


# Looked up on every `generate(gamma='auto')` call, so computed once per
# process (the machine does not change under it) and once per model object.
@functools.lru_cache(maxsize=None)
def _machine_description() -> Dict[str, str]:
  cpu = {}
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        key, _, value = line.partition(':')
        if key.strip() in ('model name', 'flags'):
          cpu.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return {
      'backend': jax.default_backend(),
      'device': jax.devices()[0].device_kind,
      'device_count': str(jax.device_count()),
      'cpu': cpu.get('model name') or platform.processor() or
             platform.machine(),
      'cpu_vector_flags': ' '.join(sorted(
          f for f in cpu.get('flags', '').split()
          if f.startswith(('avx', 'fma', 'amx')))),
      'cpu_flags_sha': hashlib.sha256(
          cpu.get('flags', '').encode()).hexdigest()[:16],
      'cpu_count': str(os.cpu_count()),
      'jax': jax.__version__,
  }


def model_description(model: Model) -> Dict[str, Any]:
  """The model's shapes and dtypes (costs do not depend on the values)."""
  config = dataclasses.asdict(model.config)
  leaves = jax.tree_util.tree_flatten_with_path(model.params)[0]
  shapes = [(jax.tree_util.keystr(path), list(np.shape(leaf)),
             str(np.asarray(leaf).dtype) if not hasattr(leaf, 'dtype')
             else str(leaf.dtype)) for path, leaf in leaves]
  return {'config': config, 'params': shapes}


_MODEL_DIGESTS: 'weakref.WeakKeyDictionary[Model, str]' = (
    weakref.WeakKeyDictionary())


def model_digest(model: Model) -> str:
  if model not in _MODEL_DIGESTS:
    text = json.dumps(model_description(model), sort_keys=True, default=str)
    _MODEL_DIGESTS[model] = hashlib.sha256(text.encode()).hexdigest()
  return _MODEL_DIGESTS[model]


def cache_key(target: Model, draft: Model, batch_size: int,
              max_gamma: int) -> str:
  # The few-row kernel or XLA's dots: each has its K-curve.
  return _digest_key(model_digest(target), model_digest(draft), batch_size,
                     max_gamma, kernels.available())


# Both keys are looked up on every gamma='auto' call: hashed once per value
# (a JSON dump and a SHA-256 each time cost ~0.1 ms on a cold host, 1% of a
# short output's call).
@functools.lru_cache(maxsize=256)
def _digest_key(target: str, draft: str, batch_size: int, max_gamma: int,
                decoder_products: str) -> str:
  description = {'target': target, 'draft': draft,
                 'batch_size': batch_size, 'max_gamma': max_gamma,
                 'machine': _machine_description(),
                 'decoder_products': decoder_products}
  text = json.dumps(description, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()


def iteration_counts(max_gamma: int) -> Tuple[int, ...]:
  """The proposal counts whose whole iterations a profile times: 0 and
  each count that fills one of gamma='auto''s call widths."""
  return (0,) + tuple(width - 1 for width in adaptive.chunk_widths(max_gamma)
                      if width > 1)


def measure_profile(target: Model, draft: Model, batch_size: int,
                    max_gamma: int = DEFAULT_MAX_GAMMA,
                    encoder_length: int = 32, repeats: int = 7,
                    steps: int = 12) -> CostProfile:
  """Times decoder calls and whole decoding iterations on this machine.

  Target calls of 1 .. max_gamma + 1 tokens and a draft step are each timed
  inside a compiled loop, interleaved with the others, the per-run dispatch
  differenced out (`benchmark.decoder_call_seconds`), on the path decoding
  takes now (the few-row kernel or XLA's dots, `kernels.available()`).
  Then whole iterations of the decoders' own loops
  (`benchmark.loop_iteration_seconds`): a baseline step, and iterations of
  gamma='auto''s program with every row proposing each count that fills
  one of its call widths (1, 3, 7) or nothing: what the in-loop rule
  weighs; and what a call spends once, baseline and speculating: what the
  rule's decision to speculate at all weighs.

  Args:
    target: The target.
    draft: The draft.
    batch_size: Rows per call.
    max_gamma: Largest gamma the profile covers.
    encoder_length: Encoder input length of the probe.
    repeats: Timed runs per kind of call.
    steps: Calls in the longer run (> 2).

  Returns:
    The profile.
  """
  probe = jnp.ones((batch_size, encoder_length), jnp.int32)
  use_kernel = kernels.enabled()
  variants = {('target', k): (target, k, use_kernel)
              for k in range(1, max_gamma + 2)}
  variants[('draft', 1)] = (draft, 1, use_kernel)
  seconds = benchmark.decoder_call_seconds(variants, probe, repeats, steps)
  counts = iteration_counts(max_gamma)
  sampled, greedy = (
      benchmark.loop_iteration_seconds(
          target, draft, probe, counts, max_gamma, repeats=repeats,
          temperature=temperature, plain=True)
      for temperature in (1.0, 0.0))
  verify_seconds = tuple(seconds[('target', k)]
                         for k in range(1, max_gamma + 2))
  # An iteration makes its target call and more: a difference of medians
  # below the call alone is the machine's noise, not a cheap iteration.
  floor = lambda timed: tuple(
      max(timed[count].iteration_seconds, verify_seconds[count])
      for count in counts)
  # One-off costs hardly depend on sampling: the middle of every timing of
  # each, against the noise of differencing medians. Only runs that speculate
  # from their first iteration, as a call does, say what speculating costs
  # once: one proposal fits the shorter output, and every count fits a plain
  # step; longer proposals do not.
  call_seconds = float(np.mean([timed[0].call_seconds
                                for timed in (sampled, greedy)]))
  call_extra = float(np.median([
      timed[count].call_seconds - timed[0].call_seconds
      for timed in (sampled, greedy) for count in (1, benchmark.PLAIN)]))
  return CostProfile(
      target_step_seconds=seconds[('target', 1)],
      draft_step_seconds=seconds[('draft', 1)],
      verify_seconds=verify_seconds,
      iteration_counts=counts,
      iteration_seconds=floor(sampled),
      greedy_iteration_seconds=floor(greedy),
      plain_iteration_seconds=sampled[benchmark.PLAIN].iteration_seconds,
      greedy_plain_iteration_seconds=(
          greedy[benchmark.PLAIN].iteration_seconds),
      # A failed difference can come out at 0; a call always costs something.
      call_seconds=max(call_seconds, verify_seconds[0]),
      call_extra_seconds=max(call_extra, 0.0))


def cost_profile(target: Model, draft: Model, batch_size: int,
                 max_gamma: int = DEFAULT_MAX_GAMMA, path: Optional[str] = None,
                 refresh: bool = False) -> CostProfile:
  """The cached profile for this machine and these models, measured if needed.

  On a multi-host slice process 0's kept entry or measurement counts on
  every process (`multihost_agreement`).

  Args:
    target: The target.
    draft: The draft.
    batch_size: Rows per call.
    max_gamma: Largest gamma considered.
    path: Cache file (default `cache_path()`).
    refresh: Measure again even if a valid entry exists.

  Returns:
    The profile.
  """
  path = path or cache_path()
  key = cache_key(target, draft, batch_size, max_gamma)
  # The file is read once per process and key, not on every decode.
  if not refresh and (path, key) in _LOADED:
    return _LOADED[(path, key)]
  profile = None
  if not refresh:
    entry = read_cache(path).get(key)
    profile = CostProfile.from_json(entry) if entry is not None else None
    if profile is not None and profile.max_gamma != max_gamma:
      profile = None
  kept = profile is not None
  # On a slice all processes measure (the timed programs are collective)
  # or none does, as process 0 says; its figures then count everywhere.
  if multihost_agreement.process_zero_flag(not kept):
    # A notebook cell would otherwise look stuck for a minute or two.
    logging.warning('spec_decode: measuring decoder costs on this machine '
                    "for gamma='auto' (batch %d, max_gamma %d; once, about "
                    'a minute or two, then kept in %s).', batch_size,
                    max_gamma, path)
    profile = measure_profile(target, draft, batch_size, max_gamma)
    kept = False
  elif not kept:  # Only process 0 kept one: its figures arrive below.
    counts = iteration_counts(max_gamma)
    ones = lambda n: (1.0,) * n
    profile = CostProfile(1.0, 1.0, ones(max_gamma + 1), counts,
                          ones(len(counts)), ones(len(counts)))
  profile = multihost_agreement.process_zero_profile(profile)
  if not kept:
    try:
      cost_cache.write_entry(path, key, {**profile.to_json(),
                                         'machine': machine_description()})
    except OSError:
      pass  # A read-only home still decodes; it measures again next time.
  _LOADED[(path, key)] = profile
  return profile


_LOADED: Dict[Tuple[str, str], CostProfile] = {}
