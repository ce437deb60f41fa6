"""Decoder costs measured where decoding runs, cached, and gamma chosen from them.

Whether speculation pays depends on the machine: how much more a target call
costs when it scores K tokens instead of one (1.2x on one CPU, 1.7x on
another, ~1x on an accelerator at batch 1) and what a draft step costs next
to a target step (c). So `gamma='auto'` measures both here, once per
(target shapes, draft shapes, batch size, backend, device, CPU model and
flags, jax version, decoder kernels), keeps them in a small JSON file under
the user's cache directory, and hands them to the rule inside the compiled
loop (`adaptive`). The pair's acceptance (the mean beta of its last runs,
per sampling setting) is kept in the same file, so a fresh process starts
from it (`acceptance_prior`, `record_acceptance`).

The cache is never trusted blindly: an unreadable, malformed or
wrong-version file, or an entry whose figures are not positive numbers, is
measured again; writes go to a temporary file renamed into place, so two
processes writing at once leave one whole file, never a torn one.
"""

import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import tempfile
import weakref
from typing import Any, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import benchmark
from spec_decode import kernels
from spec_decode.model import Model

CACHE_DIR_ENV = 'SPEC_DECODE_CACHE_DIR'
CACHE_FORMAT = 1
DEFAULT_MAX_GAMMA = 7
# Where gamma='auto' starts a pair it has never run (each row's own
# estimate takes over within a few iterations).
DEFAULT_ALPHA_PRIOR = 0.5
# The kept acceptance halves its weight past this many positions, so it
# follows the pair's recent use.
_ACCEPTANCE_HORIZON = 20000


@dataclasses.dataclass(frozen=True)
class CostProfile:
  """Seconds per decoder call on this machine, at one batch size.

  Attributes:
    target_step_seconds: A target call scoring one token per row.
    draft_step_seconds: A draft call scoring one token per row.
    verify_seconds: verify_seconds[k - 1] is a target call scoring k tokens
      per row, k = 1 .. max_gamma + 1.
  """
  target_step_seconds: float
  draft_step_seconds: float
  verify_seconds: Tuple[float, ...]

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

  def to_json(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, entry: Any) -> Optional['CostProfile']:
    """The profile an entry holds, or None if it is malformed."""
    try:
      profile = cls(float(entry['target_step_seconds']),
                    float(entry['draft_step_seconds']),
                    tuple(float(v) for v in entry['verify_seconds']))
    except (KeyError, TypeError, ValueError):
      return None
    values = (profile.target_step_seconds, profile.draft_step_seconds,
              *profile.verify_seconds)
    if len(profile.verify_seconds) < 2 or not all(
        math.isfinite(v) and v > 0 for v in values):
      return None
    return profile


def machine_description() -> Dict[str, str]:
  """What the costs depend on besides the models: backend, device, CPU."""
  return dict(_machine_description())


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


def _model_digest(model: Model) -> str:
  if model not in _MODEL_DIGESTS:
    text = json.dumps(model_description(model), sort_keys=True, default=str)
    _MODEL_DIGESTS[model] = hashlib.sha256(text.encode()).hexdigest()
  return _MODEL_DIGESTS[model]


def cache_key(target: Model, draft: Model, batch_size: int,
              max_gamma: int) -> str:
  description = {'target': _model_digest(target),
                 'draft': _model_digest(draft),
                 'batch_size': batch_size, 'max_gamma': max_gamma,
                 'machine': _machine_description(),
                 # The few-row kernel or XLA's dots: each has its K-curve.
                 'decoder_products': kernels.available()}
  text = json.dumps(description, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()


def cache_path() -> str:
  """$SPEC_DECODE_CACHE_DIR, else $XDG_CACHE_HOME/spec_decode, else ~/.cache."""
  folder = os.environ.get(CACHE_DIR_ENV) or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.join(
          os.path.expanduser('~'), '.cache'), 'spec_decode')
  return os.path.join(folder, 'costs.json')


def _read_file(path: str) -> Dict[str, Any]:
  """The whole cache file; {} for a missing, unreadable or malformed one."""
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(data, dict) or data.get('format') != CACHE_FORMAT:
    return {}
  return data


def _section(data: Dict[str, Any], name: str) -> Dict[str, Any]:
  section = data.get(name)
  return section if isinstance(section, dict) else {}


def _update_file(path: str, name: str, key: str, value: Any) -> None:
  """Sets data[name][key] = value, replacing the file atomically."""
  data = _read_file(path)
  sections = {section: _section(data, section)
              for section in ('entries', 'acceptance')}
  sections[name][key] = value
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  handle, tmp = tempfile.mkstemp(dir=folder, prefix='.costs.',
                                 suffix='.tmp')
  try:
    with os.fdopen(handle, 'w') as f:
      json.dump({'format': CACHE_FORMAT, **sections}, f, indent=1)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def read_cache(path: str) -> Dict[str, Any]:
  """The cache's cost entries; {} for a missing, unreadable or malformed
  file."""
  return _section(_read_file(path), 'entries')


def write_entry(path: str, key: str, profile: CostProfile,
                machine: Dict[str, str]) -> None:
  """Adds one cost entry, replacing the file atomically."""
  _update_file(path, 'entries', key, {**profile.to_json(),
                                      'machine': machine})


def _acceptance_key(target: Model, draft: Model, sampling: Any) -> str:
  text = json.dumps({'target': _model_digest(target),
                     'draft': _model_digest(draft),
                     'sampling': [sampling.temperature, sampling.top_k,
                                  sampling.top_p]}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


# (path, key) -> [beta_sum, beta_count, count when last written].
_ACCEPTANCE: Dict[Tuple[str, str], list] = {}


def _acceptance(path: str, key: str) -> list:
  if (path, key) not in _ACCEPTANCE:
    entry = _section(_read_file(path), 'acceptance').get(key)
    figures = [0.0, 0]
    if (isinstance(entry, dict)
        and isinstance(entry.get('beta_sum'), (int, float))
        and isinstance(entry.get('beta_count'), int)
        and entry['beta_count'] > 0
        and 0.0 <= entry['beta_sum'] <= entry['beta_count']):
      figures = [float(entry['beta_sum']), entry['beta_count']]
    _ACCEPTANCE[(path, key)] = figures + [figures[1]]
  return _ACCEPTANCE[(path, key)]


def acceptance_prior(target: Model, draft: Model, sampling: Any,
                     path: Optional[str] = None) -> Optional[float]:
  """The pair's mean beta at this sampling setting, or None before any run.

  A stale or corrupt entry (not a pair of numbers with 0 <= sum <= count)
  is ignored, as the cost entries are.
  """
  figures = _acceptance(path or cache_path(),
                        _acceptance_key(target, draft, sampling))
  return figures[0] / figures[1] if figures[1] else None


def record_acceptance(target: Model, draft: Model, sampling: Any,
                      beta_sum: float, beta_count: int,
                      path: Optional[str] = None) -> None:
  """Adds a run's betas to the pair's kept acceptance.

  The file is rewritten when the positions counted grew by a quarter since
  the last write (not after every call: a notebook's loop of calls stays
  cheap); a read-only home keeps the figures in memory only.
  """
  path = path or cache_path()
  key = _acceptance_key(target, draft, sampling)
  figures = _acceptance(path, key)
  figures[0] += beta_sum
  figures[1] += beta_count
  if figures[1] > _ACCEPTANCE_HORIZON:
    figures[0] /= 2
    figures[1] //= 2
    figures[2] = 0
  if figures[1] and figures[1] >= 1.25 * figures[2]:
    try:
      _update_file(path, 'acceptance', key,
                   {'beta_sum': figures[0], 'beta_count': figures[1]})
      figures[2] = figures[1]
    except OSError:
      pass


def forget_acceptance() -> None:
  """Drops the acceptance figures read into memory (the file stays)."""
  _ACCEPTANCE.clear()


def measure_profile(target: Model, draft: Model, batch_size: int,
                    max_gamma: int = DEFAULT_MAX_GAMMA,
                    encoder_length: int = 32, repeats: int = 7,
                    steps: int = 12) -> CostProfile:
  """Times target calls of 1 .. max_gamma + 1 tokens and a draft step.

  Each kind of call is timed inside a compiled loop, interleaved with the
  others, the per-run dispatch differenced out
  (`benchmark.decoder_call_seconds`), on the path decoding takes now (the
  few-row kernel or XLA's dots, `kernels.available()`).

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
  return CostProfile(
      target_step_seconds=seconds[('target', 1)],
      draft_step_seconds=seconds[('draft', 1)],
      verify_seconds=tuple(seconds[('target', k)]
                           for k in range(1, max_gamma + 2)))


def cost_profile(target: Model, draft: Model, batch_size: int,
                 max_gamma: int = DEFAULT_MAX_GAMMA, path: Optional[str] = None,
                 refresh: bool = False) -> CostProfile:
  """The cached profile for this machine and these models, measured if needed.

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
  if not refresh:
    entry = read_cache(path).get(key)
    profile = CostProfile.from_json(entry) if entry is not None else None
    if profile is not None and profile.max_gamma == max_gamma:
      _LOADED[(path, key)] = profile
      return profile
  profile = measure_profile(target, draft, batch_size, max_gamma)
  try:
    write_entry(path, key, profile, machine_description())
  except OSError:
    pass  # A read-only home still decodes; it measures again next time.
  _LOADED[(path, key)] = profile
  return profile


_LOADED: Dict[Tuple[str, str], CostProfile] = {}
