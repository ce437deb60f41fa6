"""One speculative iteration's target call and the verification after it.

The target scores [last token, d_1 .. d_count] for every row in one decoder
call of `count + 1` tokens, the rule (`verification.verify_draft` or
`block_verification.verify_block`) accepts a prefix of each row's proposals,
and the correction (or bonus) token is drawn. With count 0 this is a plain
target step: the token is drawn from p alone. `speculative` runs it at the
width the longest proposal of the iteration needs.
"""

from typing import Any

import flax
import jax
import jax.numpy as jnp

from spec_decode import block_verification
from spec_decode import sampling as sampling_lib
from spec_decode.model.model import decode_chunk
from spec_decode.sampling import SamplingConfig
from spec_decode.verification import correction_distribution
from spec_decode.verification import overlap_mass
from spec_decode.verification import verify_draft

Array = jax.Array


@flax.struct.dataclass
class Verified:
  """What one target call and its verification give each row.

  Attributes:
    target_cache: The target's cache with the call's keys/values written.
    accepted: int32 [batch] proposals accepted.
    new_tokens: int32 [batch, gamma + 1] the accepted proposals, then the
      correction/bonus token (zero-padded past the call's width).
    new_logprobs: float32 [batch, gamma + 1] the target's log-probs of them.
    beta_sum: float32 [batch] sum of beta over the positions the rule
      examined (accepted ones plus the first rejected one).
    examined: int32 [batch] how many positions that is.
  """
  target_cache: Any
  accepted: Array
  new_tokens: Array
  new_logprobs: Array
  beta_sum: Array
  examined: Array


def score_and_verify(width: int, gamma: int, target_config, target_params,
                     target_prepared, target_encoded, target_cache: Any,
                     last_token: Array, lengths: Array, draft_tokens: Array,
                     draft_probs: Array, uniforms: Array, proposed: Array,
                     active: Array, correction_keys: Array,
                     sampling: SamplingConfig, verification: str,
                     lenience: float) -> Verified:
  """One target call on `width` tokens per row, then the verification.

  Args:
    width: Tokens per row the call scores (1 + the proposals it can score).
    gamma: The most proposals an iteration makes (the padded width - 1).
    target_config: The target's config.
    target_params: Its parameters.
    target_prepared: Its few-row kernel weights, or None.
    target_encoded: Its `EncodedInputs`.
    target_cache: Its decoder cache.
    last_token: int32 [batch, 1] each row's last emitted token.
    lengths: int32 [batch] each row's tokens so far (the call's position).
    draft_tokens: int32 [batch, gamma] proposals (past a row's count:
      anything; their q is 0).
    draft_probs: float32 [batch, gamma, vocab] the draft's processed q.
    uniforms: float32 [batch, gamma] the acceptance draws (1 past a row's
      proposals, `draft_stop.never_accept_past`).
    proposed: int32 [batch] each row's proposal count.
    active: bool [batch] rows still decoding.
    correction_keys: [batch] keys for the correction/bonus draw.
    sampling: Temperature, top-k and top-p (both models').
    verification: 'token' or 'block'.
    lenience: 1.0 is exact.

  Returns:
    The `Verified` outputs, padded to gamma + 1 positions.
  """
  count = width - 1  # Proposals the call can score.
  batch = lengths.shape[0]
  logits, cache = decode_chunk(
      target_config, target_params,
      jnp.concatenate([last_token, draft_tokens[:, :count]], axis=1),
      lengths, target_cache, target_encoded, target_prepared)
  target_probs = jnp.exp(sampling_lib.process_logits(logits, sampling))
  tokens, probs = draft_tokens[:, :count], draft_probs[:, :count]
  if count == 0:
    accepted = jnp.zeros((batch,), jnp.int32)
    correction_probs = target_probs[:, 0]
  elif verification == 'block':
    accepted, correction_probs = block_verification.verify_block(
        tokens, probs, target_probs, uniforms[:, :count])
  else:
    accepted = verify_draft(tokens, probs, target_probs, uniforms[:, :count],
                            lenience)
    correction_probs = correction_distribution(probs, target_probs, accepted,
                                               lenience)
  correction = sampling_lib.sample_tokens(
      correction_keys, jnp.log(correction_probs), sampling.greedy)
  # [batch, width]: accepted drafts, then the correction/bonus token.
  here = jnp.arange(width, dtype=jnp.int32)
  new_tokens = jnp.where(here < accepted[:, None],
                         jnp.pad(tokens, ((0, 0), (0, 1))),
                         correction[:, None])
  new_logprobs = sampling_lib.token_logprobs(logits, new_tokens)
  # beta at the positions the rule examined: accepted ones plus the first
  # rejected one; later ones were conditioned on a rejection.
  examined = ((here[:count] <= accepted[:, None])
              & (here[:count] < proposed[:, None]) & active[:, None])
  beta = jnp.sum(jnp.where(
      examined, overlap_mass(target_probs[:, :count], probs), 0.0), axis=1)
  pad = ((0, 0), (0, gamma + 1 - width))
  return Verified(target_cache=cache, accepted=accepted,
                  new_tokens=jnp.pad(new_tokens, pad),
                  new_logprobs=jnp.pad(new_logprobs, pad), beta_sum=beta,
                  examined=jnp.sum(examined, axis=1).astype(jnp.int32))
