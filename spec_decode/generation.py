"""`generate`: the one entry point for baseline and speculative decoding.

It validates every argument on the host (so mistakes surface as clear errors
naming the argument, not as XLA stack traces), then calls the jitted core.
"""

from typing import Any, Optional, Tuple, Union

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from spec_decode import adaptive
from spec_decode import auto_generation
from spec_decode import block_verification
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
             max_gamma: Optional[int] = None,
             min_gain: Optional[float] = None,
             lenience: float = 1.0,
             verification: str = 'token',
             draft_stop: Optional[str] = None,
             draft_threshold: Optional[float] = None,
             num_candidates: int = 1) -> DecodeResult:
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
    gamma: Draft tokens proposed per iteration (>= 1), or 'auto': inside
      the compiled loop, at every iteration, each row proposes the number
      of tokens (0 .. max_gamma; 0 is a plain target step) that Theorem 3.8
      predicts fastest from the row's own acceptance so far and the decoder
      costs measured on this machine (`spec_decode.adaptive`; the costs are
      measured once and cached, the pair's alpha is kept beside them). One
      compiled program serves every choice. Speculative only.
    max_gamma: With gamma='auto', the most tokens a row proposes in an
      iteration; an integer >= 1. By default, the most the measured costs
      ever favour (`auto_generation.default_max_gamma`: up to
      `costs.DEFAULT_MAX_GAMMA`, 3 on a 2-core CPU), so the program carries
      no call width its rule would not use.
    min_gain: With gamma='auto', the margin a call's predicted speedup
      over baseline decoding (at the pair's usual output length, what the
      call spends once included) must clear before the call speculates;
      below it the call is a baseline decode (default `adaptive.MIN_GAIN`,
      set from CPU measurements); a number >= 1. Lower takes smaller
      predicted gains, and loses where the prediction runs ahead of the
      clock (the main job's `pred loop` and `speedup` columns say how
      close).
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
    num_candidates: k >= 1 candidate continuations per row and iteration,
      all scored in the same single target call (`spec_decode.candidates`):
      k distinct first tokens, each followed by its own draft chain of
      gamma - 1 tokens; recursive rejection sampling over the first tokens
      keeps the output exactly the target's (greedy: equal to baseline).
      1 (default) is one draft sequence. k > 1 takes a fixed gamma, token
      verification, lenience 1 and no draft_stop.

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
  if isinstance(gamma, str) and gamma != 'auto':
    raise ValueError(f"gamma must be a positive integer or 'auto', got "
                     f'{gamma!r}.')
  if max_gamma is not None:
    if gamma != 'auto':
      raise ValueError(f"max_gamma is only for gamma='auto', got max_gamma="
                       f'{max_gamma!r} with gamma={gamma!r}.')
    max_gamma = validation.check_int('max_gamma', max_gamma, 1)
  min_gain = check_min_gain(min_gain, gamma)
  if draft is not None:
    check_compatible(model, draft)
    if gamma != 'auto':
      gamma = validation.check_int('gamma', gamma, 1)
  num_candidates = _check_candidates(num_candidates, draft, gamma,
                                     verification, lenience, draft_stop,
                                     config.vocab_size)
  model, draft, placed_tokens = _place_on_mesh(model, draft, tokens)
  options = dict(lenience=lenience, verification=verification,
                 draft_stop=draft_stop, draft_threshold=draft_threshold)
  if num_candidates > 1:
    options['num_candidates'] = num_candidates
  if draft is not None and gamma == 'auto':
    result = auto_generation.auto_generate(
        model, draft, placed_tokens, rng, max_decode_len, sampling, eos_id,
        max_gamma,
        adaptive.MIN_GAIN if min_gain is None else min_gain, **options)
  else:
    result = _decode(model, draft, placed_tokens, rng, max_decode_len,
                     sampling, eos_id, gamma if draft is not None else 0,
                     **options)
  return _real_rows(result, tokens.shape[0])


def check_min_gain(min_gain: Any, gamma: Union[int, str]
                   ) -> Optional[float]:
  """`generate`'s min_gain checked (the main job checks its own early).

  Args:
    min_gain: None, or the margin over a plain step.
    gamma: The call's gamma; a margin is only for 'auto'.

  Returns:
    min_gain as a float, or None.

  Raises:
    TypeError, ValueError: min_gain is not a finite number >= 1, or is set
      with a fixed gamma.
  """
  if min_gain is None:
    return None
  if gamma != 'auto':
    raise ValueError(f"min_gain is only for gamma='auto', got min_gain="
                     f'{min_gain!r} with gamma={gamma!r}.')
  min_gain = validation.check_float('min_gain', min_gain)
  if min_gain < 1.0:
    raise ValueError(f'min_gain must be >= 1 (a call predicted slower than '
                     f'baseline decoding never pays), got {min_gain}.')
  return min_gain


def _check_candidates(num_candidates: Any, draft: Optional[Model],
                      gamma: Union[int, str], verification: str,
                      lenience: float, draft_stop: Optional[str],
                      vocab_size: int) -> int:
  """num_candidates as an int, or an error naming what it conflicts with."""
  k = validation.check_int('num_candidates', num_candidates, 1)
  if k == 1:
    return k
  conflicts = [(draft is None, 'a draft model'),
               (gamma == 'auto', 'a fixed integer gamma, not gamma=\'auto\''),
               (verification != 'token', "verification='token'"),
               (lenience != 1.0, 'lenience=1.0'),
               (draft_stop is not None, 'draft_stop=None')]
  for conflict, needed in conflicts:
    if conflict:
      raise ValueError(f'num_candidates={k} needs {needed}.')
  if k > vocab_size:
    raise ValueError(f'num_candidates must be <= vocab_size={vocab_size} '
                     f'(distinct first tokens), got {k}.')
  return k


def check_compatible(target: Model, draft: Model) -> None:
  """Raises ValueError unless the draft can propose tokens for the target."""
  if not isinstance(draft, Model):
    raise TypeError(f'draft must be a spec_decode.Model or None, got '
                    f'{type(draft).__name__}.')
  if draft.config.vocab_size != target.config.vocab_size:
    raise ValueError(
        f'draft has vocab_size {draft.config.vocab_size} but the target has '
        f'{target.config.vocab_size}; they must share a vocabulary.')
  if draft.eos_id != target.eos_id:
    raise ValueError(f'draft has eos_id {draft.eos_id} but the target has '
                     f'{target.eos_id}; they must share a vocabulary.')


def _decode(model: Model, draft: Optional[Model], tokens: Any, rng: Array,
            max_decode_len: int, sampling: sampling_lib.SamplingConfig,
            eos_id: int, gamma: int, **options) -> DecodeResult:
  """Baseline decoding when gamma is 0, else speculative with `options`."""
  if not gamma:
    return decoding.baseline_generate(*auto_generation.baseline_args(
        model, tokens, rng, max_decode_len, sampling, eos_id))
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
  if isinstance(rng, jax.Array) and (
      jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)
      or (rng.shape == (2,) and rng.dtype == np.uint32)):
    # Already a key on the device: a copy to the host and back would cost
    # more than the checks (and wait for the device).
    return rng
  array = np.asarray(rng)
  if array.shape != (2,) or array.dtype != np.uint32:
    raise TypeError(f'rng must be a jax.random key (e.g. '
                    f'jax.random.PRNGKey(0)), got {type(rng).__name__} with '
                    f'shape {array.shape} and dtype {array.dtype}.')
  return jnp.asarray(array)
