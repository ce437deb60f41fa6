"""`generate`: the one entry point for baseline and speculative decoding.

It validates every argument on the host (so mistakes surface as clear errors
naming the argument, not as XLA stack traces), then calls the jitted core.
"""

import collections
import dataclasses
from typing import Any, Deque, Dict, Optional, Tuple, Union

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from spec_decode import block_verification
from spec_decode import costs
from spec_decode import decoding
from spec_decode import draft_stop as draft_stop_lib
from spec_decode import partitioning as partitioning_lib
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode import validation
from spec_decode.decoding import DecodeResult
from spec_decode.model import Model

Array = jax.Array


def generate(model: Model, encoder_input_tokens: Any, *, max_decode_len: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: Optional[int] = None, rng: Optional[Array] = None,
             draft: Optional[Model] = None,
             gamma: Union[int, str] = 4,
             lenience: float = 1.0,
             verification: str = 'token',
             draft_stop: Optional[str] = None,
             draft_threshold: Optional[float] = None) -> DecodeResult:
  """Decodes with `model`, speculatively when a `draft` model is given.

  Speculative decoding (Leviathan et al. 2023) samples from exactly the
  distribution baseline decoding samples from; under greedy decoding its
  output equals the baseline's token for token.

  Args:
    model: The (target) model.
    encoder_input_tokens: int [batch, enc_len], 0-padded.
    max_decode_len: Maximum number of output tokens (>= 1).
    temperature: 0 for greedy, else the sampling temperature (>= 0).
    top_k: Sample among the k most likely tokens; 0 disables.
    top_p: Nucleus sampling mass in (0, 1]; 1 disables.
    eos_id: End-of-sequence id; defaults to the models' `eos_id` (1).
    rng: `jax.random` key; defaults to `jax.random.PRNGKey(0)`. Each row
      draws from its own stream, so a row's output does not depend on the
      rest of the batch.
    draft: A smaller model with the same vocabulary and EOS id. None runs
      baseline decoding.
    gamma: Draft tokens proposed per iteration (>= 1); speculative only.
    lenience: Paper appendix A.5. 1.0 (default) is exact. Values in (0, 1)
      accept more draft tokens and are LOSSY: outputs no longer follow the
      target's distribution.
    verification: How a draft block is verified; speculative only.
      'token' (default) is the paper's rule: accept while each token passes
      its own test. 'block' (Sun et al., ICLR 2025) verifies the block
      jointly: same single target call, outputs still exactly the target's
      distribution (greedy output still equals baseline), and never fewer
      accepted tokens in expectation. 'block' needs lenience 1.
    draft_stop: None (default: always gamma proposals), 'confidence' or
      'entropy': a row's draft stops proposing in an iteration once its own
      largest probability is below `draft_threshold`, or its entropy (nats)
      above it; at least one token per iteration. Exact with either
      verification: the rule reads only the draft's own distribution, a
      function of the drafted prefix (details in `spec_decode.draft_stop`).
    draft_threshold: The stop rule's threshold: a probability in (0, 1] for
      'confidence', nats >= 0 for 'entropy'; None without a rule.

  Returns:
    A `DecodeResult`.

  Raises:
    TypeError, ValueError: An argument is malformed; the message names it.
  """
  if not isinstance(model, Model):
    raise TypeError(f'model must be a spec_decode.Model, got '
                    f'{type(model).__name__}.')
  config = model.config
  tokens = validation.check_tokens('encoder_input_tokens',
                                   encoder_input_tokens, config.vocab_size)
  max_decode_len = validation.check_int('max_decode_len', max_decode_len, 1)
  sampling = sampling_lib.SamplingConfig(temperature, top_k, top_p)
  if eos_id is None:
    eos_id = model.eos_id
  eos_id = validation.check_int('eos_id', eos_id, 0)
  if eos_id >= config.vocab_size:
    raise ValueError(f'eos_id must be < vocab_size={config.vocab_size}, got '
                     f'{eos_id}.')
  if rng is None:
    rng = jax.random.PRNGKey(0)
  rng = _check_rng(rng)
  # The rule's name is checked even without a draft, so a typo never hides;
  # its lenience only matters (and is checked) with one.
  verification, _ = block_verification.check_verification(
      verification, 1.0 if draft is None else lenience)
  draft_stop_lib.check_draft_stop(draft_stop, draft_threshold)
  if draft is not None:
    speculative.check_compatible(model, draft)
    if isinstance(gamma, str) and gamma != 'auto':
      raise ValueError(f"gamma must be a positive integer or 'auto', got "
                       f'{gamma!r}.')
    if gamma != 'auto':
      gamma = validation.check_int('gamma', gamma, 1)
  model, draft, placed_tokens = _place_on_mesh(model, draft, tokens)
  options = dict(lenience=lenience, verification=verification,
                 draft_stop=draft_stop, draft_threshold=draft_threshold)
  if draft is not None and gamma == 'auto':
    result = _auto_generate(model, draft, placed_tokens, rng, max_decode_len,
                            sampling, eos_id, **options)
  else:
    result = _decode(model, draft, placed_tokens, rng, max_decode_len,
                     sampling, eos_id, gamma if draft is not None else 0,
                     **options)
  return _real_rows(result, tokens.shape[0])


def _decode(model: Model, draft: Optional[Model], tokens: Any, rng: Array,
            max_decode_len: int, sampling: sampling_lib.SamplingConfig,
            eos_id: int, gamma: int, **options) -> DecodeResult:
  """Baseline decoding when gamma is 0, else speculative with `options`."""
  if not gamma:
    return decoding.baseline_generate(model.config, model.params, tokens, rng,
                                      max_decode_len, sampling, eos_id,
                                      model.partitioning, model.decode_kernels)
  return speculative.speculative_generate(
      model, draft, tokens, rng=rng, max_decode_len=max_decode_len,
      sampling=sampling, eos_id=eos_id, gamma=gamma, **options)


def _place_on_mesh(model: Model, draft: Optional[Model], tokens: np.ndarray
                   ) -> Tuple[Model, Optional[Model], Any]:
  """Puts the inputs (and an unsharded draft) on the target's mesh.

  Rows are padded to a multiple of the mesh's 'data' size by repeating the
  last row; `_real_rows` drops the copies (rows never affect each other).
  Without a mesh everything is returned as it is.
  """
  plan = model.partitioning
  if plan is None:
    if draft is not None and draft.partitioning is not None:
      raise ValueError('draft is sharded over a mesh but model is not; call '
                       'model.shard(mesh) too (the target sets the mesh).')
    return model, draft, tokens
  if draft is not None:
    if draft.partitioning is None:
      # Replicated over 'model': a small draft split many ways spends more
      # in collectives than its matmuls take.
      draft = draft.placed_like(plan)
    elif draft.partitioning.mesh != plan.mesh:
      raise ValueError('draft is sharded over a different mesh than model; '
                       'shard both over the same mesh.')
  padded = partitioning_lib.repeat_rows_to_multiple(tokens, plan.data_size)
  return model, draft, partitioning_lib.shard_batch(padded, plan)


def _real_rows(result: DecodeResult, batch: int) -> DecodeResult:
  """The first `batch` rows of every per-row array of `result`.

  On a multi-host slice the rows are first gathered from every process, so
  each host gets the whole result as host arrays.
  """
  if jax.process_count() > 1:
    result = multihost_utils.process_allgather(result, tiled=True)
  if result.tokens.shape[0] == batch:
    return result
  return jax.tree_util.tree_map(lambda x: x[:batch] if x.ndim else x, result)


def _check_rng(rng: Any) -> Array:
  """Accepts old-style uint32 [2] keys and new-style typed keys."""
  if isinstance(rng, jax.Array) and jax.dtypes.issubdtype(
      rng.dtype, jax.dtypes.prng_key):
    return rng
  array = np.asarray(rng)
  if array.shape != (2,) or array.dtype != np.uint32:
    raise TypeError(f'rng must be a jax.random key (e.g. '
                    f'jax.random.PRNGKey(0)), got {type(rng).__name__} with '
                    f'shape {array.shape} and dtype {array.dtype}.')
  return jnp.asarray(array)


CALIBRATION_GAMMA = 3
# After this many baseline choices in a row, one call speculates at
# CALIBRATION_GAMMA again: an alpha estimate from a few unlucky (or other
# task's) inputs would otherwise keep speculation off for good. Costs at
# most one slower call in this many.
REEXPLORE_AFTER = 16
_RECENT_LENGTHS = 256


@dataclasses.dataclass
class _AlphaEstimate:
  """Running acceptance and output-length figures of one (pair, sampling)."""
  beta_sum: float = 0.0
  beta_count: int = 0
  baseline_streak: int = 0
  lengths: Deque[int] = dataclasses.field(
      default_factory=lambda: collections.deque(maxlen=_RECENT_LENGTHS))

  @property
  def alpha(self) -> float:
    return self.beta_sum / max(self.beta_count, 1)


_ESTIMATES: Dict[Tuple[str, Any], _AlphaEstimate] = {}


def reset_auto_estimates() -> None:
  """Forgets the alpha estimates `gamma='auto'` has gathered."""
  _ESTIMATES.clear()


def auto_estimate(model: Model, draft: Model, temperature: float = 0.0,
                  top_k: int = 0, top_p: float = 1.0
                  ) -> Optional[Tuple[float, Tuple[int, ...]]]:
  """(alpha, recent output lengths) `gamma='auto'` has measured, or None."""
  sampling = sampling_lib.SamplingConfig(temperature, top_k, top_p)
  estimate = _ESTIMATES.get((_pair_key(model, draft), sampling))
  if estimate is None or not estimate.beta_count:
    return None
  return estimate.alpha, tuple(estimate.lengths)


def _pair_key(model: Model, draft: Model) -> str:
  return costs.cache_key(model, draft, 0, 0)


def resolve_auto_gamma(model: Model, draft: Model, batch_size: int,
                       sampling: sampling_lib.SamplingConfig
                       ) -> Tuple[int, Optional[float]]:
  """What `gamma='auto'` would run now: (gamma, predicted speedup).

  Args:
    model: The target.
    draft: The draft.
    batch_size: Rows per call (costs are measured per batch size).
    sampling: The sampling settings (alpha is estimated per setting).

  Returns:
    (gamma, predicted speedup over baseline); gamma 0 means baseline
    decoding (predicted 1.0); (CALIBRATION_GAMMA, None) before any alpha
    has been measured for this pair and sampling, and after
    `REEXPLORE_AFTER` baseline choices in a row (fresh evidence).
  """
  profile = costs.cost_profile(model, draft, batch_size)
  estimate = _ESTIMATES.get((_pair_key(model, draft), sampling))
  if (estimate is None or not estimate.beta_count
      or estimate.baseline_streak >= REEXPLORE_AFTER):
    return min(CALIBRATION_GAMMA, profile.max_gamma), None
  return costs.choose_gamma(estimate.alpha, profile, estimate.lengths)


def record_auto_result(model: Model, draft: Model,
                       sampling: sampling_lib.SamplingConfig,
                       result: DecodeResult) -> None:
  """Adds a result's beta and output lengths to the running estimates."""
  estimate = _ESTIMATES.setdefault((_pair_key(model, draft), sampling),
                                   _AlphaEstimate())
  estimate.baseline_streak = 0 if result.gamma else (
      estimate.baseline_streak + 1)
  if result.gamma:
    verified = np.asarray(result.verified_positions)
    beta = np.nan_to_num(np.asarray(result.mean_beta))
    estimate.beta_sum += float(np.sum(beta * verified))
    estimate.beta_count += int(np.sum(verified))
  estimate.lengths.extend(int(n) for n in np.asarray(result.lengths))


def _auto_generate(model: Model, draft: Model, tokens: Array, rng: Array,
                   max_decode_len: int, sampling, eos_id: int,
                   **options) -> DecodeResult:
  """Decodes with the gamma (or baseline) the measured costs favour."""
  gamma, predicted = resolve_auto_gamma(model, draft, tokens.shape[0],
                                        sampling)
  result = _decode(model, draft, tokens, rng, max_decode_len, sampling,
                   eos_id, gamma, **options)
  record_auto_result(model, draft, sampling, result)
  return result.replace(gamma=gamma, predicted_speedup=predicted)
