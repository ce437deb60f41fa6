"""The pair's kept acceptance and output length: where gamma='auto' starts.

Per (target, draft, sampling setting), the mean beta of the pair's last
runs that speculated (the in-loop rule's prior for every row) and its rows'
mean output length (what `adaptive.ever_proposes` prices a call at), kept
beside the measured costs (`cost_cache`), so a fresh process starts from
the last run's figures instead of a calibration call. A call's own figures
stay on the device until they are next read (`record_result`).
"""

import functools
import hashlib
import json
from typing import Any, List, NamedTuple, Optional, Tuple

import jax
import numpy as np

from spec_decode import cost_cache
from spec_decode import costs
from spec_decode.model import Model

# Where gamma='auto' starts a pair it has never run: optimistic, so rows
# propose and observe (each row's own estimate takes over within a few
# iterations, and the run's acceptance is kept as the next prior). A
# pessimistic start would never propose, so never learn.
DEFAULT_ALPHA_PRIOR = 0.8


def _acceptance_key(target: Model, draft: Model, sampling: Any) -> str:
  return _sampling_key(costs.model_digest(target), costs.model_digest(draft),
                       sampling.temperature, sampling.top_k, sampling.top_p)


@functools.lru_cache(maxsize=256)
def _sampling_key(target: str, draft: str, temperature: float, top_k: int,
                  top_p: float) -> str:
  text = json.dumps({'target': target, 'draft': draft,
                     'sampling': [temperature, top_k, top_p]},
                    sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def acceptance_prior(target: Model, draft: Model, sampling: Any,
                     path: Optional[str] = None) -> Optional[float]:
  """The pair's mean beta at this sampling setting (its last runs'), kept
  beside the costs, or None before any run (`cost_cache.acceptance`)."""
  _add_pending()
  return cost_cache.acceptance(_acceptance_key(target, draft, sampling),
                               path)


def output_length(target: Model, draft: Model, sampling: Any,
                  path: Optional[str] = None) -> Optional[float]:
  """The pair's mean output length (tokens per row) at this sampling
  setting, over its last runs that speculated, or None before any."""
  _add_pending()
  return cost_cache.output_length(_acceptance_key(target, draft, sampling),
                                  path)


def kept_figures(target: Model, draft: Model, sampling: Any
                 ) -> Tuple[Optional[float], Optional[float]]:
  """`acceptance_prior` and `output_length` as gamma='auto' reads them
  before every call: the last calls' figures are added every
  `PENDING_CALLS` calls, not every call (they move the kept means by far
  less than their own noise)."""
  if len(_PENDING) >= PENDING_CALLS:
    _add_pending()
  key, path = _acceptance_key(target, draft, sampling), cost_cache.cache_path()
  return (cost_cache.acceptance(key, path),
          cost_cache.output_length(key, path))


def record_acceptance(target: Model, draft: Model, sampling: Any,
                      beta_sum: float, beta_count: int, tokens: float = 0.0,
                      rows: int = 0, path: Optional[str] = None) -> None:
  """Adds a run's betas, and its rows' output lengths (`tokens` emitted by
  `rows` rows), to the pair's kept figures."""
  cost_cache.add_acceptance(_acceptance_key(target, draft, sampling),
                            beta_sum, beta_count, tokens, rows, path)


class _Pending(NamedTuple):
  target: Model
  draft: Model
  sampling: Any
  path: str
  verified_positions: Any  # [batch], on the device until read
  mean_beta: Any
  lengths: Any


# gamma='auto' calls whose figures are still on the device: added to the
# pair's kept figures together, when read (`acceptance_prior`) or every
# PENDING_CALLS calls (`kept_figures`), not at the end of each call: reading
# a call's figures inside `generate` (waiting for its end, three small
# transfers) cost 0.2-0.4 ms a call on a 2-core Xeon, 2-3% of a short
# output's decode.
_PENDING: List[_Pending] = []
PENDING_CALLS = 16


def record_result(target: Model, draft: Model, sampling: Any, result: Any,
                  path: Optional[str] = None) -> None:
  """Keeps a call's betas and its rows' lengths (a `DecodeResult`) to add to
  the pair's figures (`record_acceptance`) later; a call whose rows
  proposed nothing observed nothing and adds nothing."""
  _PENDING.append(_Pending(target, draft, sampling,
                           path or cost_cache.cache_path(),
                           result.verified_positions, result.mean_beta,
                           result.lengths))


def _add_pending() -> None:
  """Adds every kept call's figures, read in one transfer."""
  if not _PENDING:
    return
  calls = list(_PENDING)
  _PENDING.clear()
  figures = jax.device_get([(call.verified_positions, call.mean_beta,
                             call.lengths) for call in calls])
  for call, (verified, mean_beta, lengths) in zip(calls, figures):
    verified = np.asarray(verified)
    if not verified.any():
      continue
    # Rows that examined nothing have a NaN mean and count 0.
    betas = np.where(verified > 0, np.asarray(mean_beta), 0.0)
    record_acceptance(call.target, call.draft, call.sampling,
                      float(np.dot(betas, verified)), int(verified.sum()),
                      float(np.asarray(lengths).sum()), len(verified),
                      call.path)
