"""Baseline decoding and the `DecodeResult` both decoders return.

Baseline decoding follows T5X's `temperature_sample`: start from token 0,
sample one token per step, stop a row at EOS (its later outputs are 0), stop
the loop when every row is done or `max_decode_len` tokens were emitted. The
whole call is one jitted `lax.while_loop`: no host round trip per token.
"""

import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp

from spec_decode import compile as compile_lib
from spec_decode import partitioning as partitioning_lib
from spec_decode import sampling as sampling_lib
from spec_decode.model import EncodedInputs
from spec_decode.model import init_cache
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding

Array = jax.Array


@flax.struct.dataclass
class DecodeResult:
  """What `generate` returns. Per-row arrays have a leading [batch] axis.

  Attributes:
    tokens: int32 [batch, max_decode_len] output ids, EOS kept, 0 after it.
    lengths: int32 [batch] tokens emitted per row (EOS included).
    token_logprobs: float32 [batch, max_decode_len] log-prob of each emitted
      token under the target's unprocessed distribution (T5X's
      `rescale_log_probs=False`), 0 after the end. Sum for sequence scores.
    target_calls: int32 [batch] target decoder calls while the row was
      active (baseline: one per token).
    draft_tokens_proposed: int32 [batch] draft tokens proposed to the target.
    draft_tokens_accepted: int32 [batch] of those, accepted by the rule.
    acceptance_rate: float32 [batch] accepted / verified draft tokens: the
      empirical alpha, the chance that a draft token the target examines is
      accepted (a token after a rejection is never examined; accepted /
      proposed would understate alpha). NaN for baseline.
    mean_beta: float32 [batch] mean of beta = sum_x min(p(x), q(x)) over the
      verified positions: the paper's Corollary 3.6 estimate of alpha (NaN
      for baseline).
    verified_positions: int32 [batch] positions beta was averaged over (the
      accepted draft tokens plus each first rejected one).
    num_iterations: int32 [] loop iterations the whole batch ran.
    proposal_counts: int32 [batch, gamma + 1]: proposal_counts[b, g] is how
      many of row b's iterations proposed g draft tokens (baseline: all at
      0). With gamma='auto' the rule chose them.
    predicted_speedup: float32 [batch]: with gamma='auto', the speedup
      over plain steps the in-loop rule expected of its choices (Theorem
      3.8 with the row's running alpha and the measured costs); NaN
      otherwise.
    first_token_acceptance: float32 [batch] with num_candidates > 1: the
      chance, averaged over the row's iterations, that one of the k first
      tokens was accepted (P_k of `candidate_analysis`); None otherwise.
    gamma: Most draft tokens an iteration proposed: the fixed gamma, or
      max_gamma with gamma='auto' (0: baseline decoding); with several
      candidates, the tokens of each.
    num_candidates: Candidates per row and iteration (1: one draft).
  """
  tokens: Array
  lengths: Array
  token_logprobs: Array
  target_calls: Array
  draft_tokens_proposed: Array
  draft_tokens_accepted: Array
  acceptance_rate: Array
  mean_beta: Array
  verified_positions: Array
  num_iterations: Array
  proposal_counts: Array
  predicted_speedup: Array
  first_token_acceptance: Optional[Array] = None
  gamma: int = flax.struct.field(pytree_node=False, default=0)
  num_candidates: int = flax.struct.field(pytree_node=False, default=1)

  @property
  def sequence_logprobs(self) -> Array:
    """float32 [batch] sum of `token_logprobs` (T5X's sequence score)."""
    return jnp.sum(self.token_logprobs, axis=-1)

  @property
  def tokens_per_target_call(self) -> Array:
    """float32 [batch] emitted tokens per target call."""
    return self.lengths / jnp.maximum(self.target_calls, 1)

  @property
  def mean_proposals(self) -> Array:
    """float32 [batch] draft tokens proposed per iteration, on average."""
    counts = self.proposal_counts.astype(jnp.float32)
    sizes = jnp.arange(counts.shape[-1], dtype=jnp.float32)
    return (jnp.sum(counts * sizes, axis=-1)
            / jnp.maximum(jnp.sum(counts, axis=-1), 1.0))


@flax.struct.dataclass
class _BaselineState:
  step: Array           # [] int32: tokens emitted so far by active rows
  tokens: Array         # [batch, max_decode_len] int32
  logprobs: Array       # [batch, max_decode_len] float32
  last_token: Array     # [batch] int32: the next decoder input
  lengths: Array        # [batch] int32
  done: Array           # [batch] bool
  cache: Any


def _constrain_state(state: _BaselineState) -> _BaselineState:
  """Keeps each row's state beside its cache rows on a mesh."""
  cache = state.cache
  return partitioning_lib.constrain_rows(state.replace(cache=None)).replace(
      cache=cache)


@functools.partial(compile_lib.decoder_jit, static_argnums=(0, 4, 5, 7))
def baseline_generate(config, params, encoder_input_tokens, rng,
                      max_decode_len, sampling, eos_id,
                      partitioning: Optional[partitioning_lib.Partitioning]
                      = None, prepared: Any = None) -> DecodeResult:
  """Jitted baseline decoding; call `spec_decode.generate` instead.

  Args:
    config: Model config (static).
    params: Model parameters.
    encoder_input_tokens: int32 [batch, enc_len].
    rng: `jax.random` key.
    max_decode_len: Output length (static).
    sampling: A `SamplingConfig` (static).
    eos_id: End-of-sequence id (traced: changing it does not recompile).
    partitioning: The mesh and rules of sharded params (static), or None.
    prepared: `Model.decode_kernels` (the few-row CPU kernel's weights),
      or None for XLA's dots.

  Returns:
    A `DecodeResult`.
  """
  with partitioning_lib.active(partitioning):
    encoded = prepare_decoding(config, params, encoder_input_tokens, prepared)
    return baseline_loop(config, params, prepared, encoded, rng,
                         max_decode_len, sampling, eos_id)


def baseline_loop(config, params, prepared, encoded: EncodedInputs,
                  rng: Array, max_decode_len: int, sampling, eos_id
                  ) -> DecodeResult:
  """Baseline decoding from the encoder's outputs, inside a jitted caller.

  Args:
    config: Model config.
    params: Model parameters.
    prepared: `Model.decode_kernels`, or None for XLA's dots.
    encoded: `prepare_decoding`'s outputs for the batch.
    rng: `jax.random` key (row b samples step i with fold_in(row key b, i)).
    max_decode_len: Output length.
    sampling: A `SamplingConfig`.
    eos_id: End-of-sequence id.

  Returns:
    A `DecodeResult` (proposal_counts [batch, 1]: every step at 0).
  """
  batch = encoded.encoder_mask.shape[0]
  keys = sampling_lib.row_keys(rng, batch)

  def cond(state):
    return (state.step < max_decode_len) & ~jnp.all(state.done)

  def body(state):
    start = jnp.full((batch,), state.step, jnp.int32)
    logits, cache = decode_chunk(config, params, state.last_token[:, None],
                                 start, state.cache, encoded, prepared)
    logits = logits[:, 0]  # [batch, vocab]
    logprobs = sampling_lib.process_logits(logits, sampling)
    token = sampling_lib.sample_tokens(
        sampling_lib.fold_in_rows(keys, state.step), logprobs,
        sampling.greedy)
    token = jnp.where(state.done, 0, token)
    score = jnp.where(state.done, 0.0,
                      sampling_lib.token_logprobs(logits, token))
    return _constrain_state(_BaselineState(
        step=state.step + 1,
        tokens=state.tokens.at[:, state.step].set(token),
        logprobs=state.logprobs.at[:, state.step].set(score),
        last_token=token,
        lengths=state.lengths + (~state.done).astype(jnp.int32),
        done=state.done | (token == eos_id),
        cache=cache))

  state = _constrain_state(_BaselineState(
      step=jnp.zeros((), jnp.int32),
      tokens=jnp.zeros((batch, max_decode_len), jnp.int32),
      logprobs=jnp.zeros((batch, max_decode_len), jnp.float32),
      last_token=jnp.zeros((batch,), jnp.int32),
      lengths=jnp.zeros((batch,), jnp.int32),
      done=jnp.zeros((batch,), jnp.bool_),
      cache=init_cache(config, batch, max_decode_len)))
  state = jax.lax.while_loop(cond, body, state)
  zeros = jnp.zeros((batch,), jnp.int32)
  nan = jnp.full((batch,), jnp.nan, jnp.float32)
  return DecodeResult(
      tokens=state.tokens, lengths=state.lengths,
      token_logprobs=state.logprobs, target_calls=state.lengths,
      draft_tokens_proposed=zeros, draft_tokens_accepted=zeros,
      acceptance_rate=nan, mean_beta=nan, verified_positions=zeros,
      num_iterations=state.step, proposal_counts=state.lengths[:, None],
      predicted_speedup=nan)
