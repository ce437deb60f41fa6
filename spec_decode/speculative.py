"""Speculative decoding (Leviathan, Kalman & Matias, ICML 2023, Algorithm 1).

Each iteration, for every row of the batch:
  1. The draft proposes gamma tokens d_1..d_g (a row may stop sooner with
     `draft_stop`), sampling each from its processed distribution q_i, from
     its own cache.
  2. The target scores [last token, d_1..d_g] in ONE decoder call, giving
     p_1..p_{g+1} (processed with the same temperature/top-k/top-p).
  3. d_i is accepted while u_i < p_i(d_i) / q_i(d_i); at the first rejection
     the next token is drawn from norm(max(0, p - q)); if all g are accepted
     a bonus token is drawn from p_{g+1}. (verification='block' replaces this
     step with block verification, `block_verification.verify_block`.)
Rows advance by their own counts (1..g+1 tokens); rolling back a cache is
free because positions past a row's length are masked and later overwritten.

The whole call is one jitted function: a `lax.while_loop` over iterations with
the draft's gamma steps inside it, so no host round trip per token.
"""

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp

from spec_decode import block_verification
from spec_decode import compile as compile_lib
from spec_decode import draft_stop as draft_stop_lib
from spec_decode import partitioning as partitioning_lib
from spec_decode import sampling as sampling_lib
from spec_decode.decoding import DecodeResult
from spec_decode.model import init_cache
from spec_decode.model import Model
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding
from spec_decode.sampling import SamplingConfig
from spec_decode.verification import correction_distribution
from spec_decode.verification import overlap_mass
from spec_decode.verification import verify_draft

Array = jax.Array


@flax.struct.dataclass
class _SpeculativeState:
  iteration: Array      # [] int32
  inputs: Array         # [batch, buffer + 1] int32: 0 then emitted tokens
  logprobs: Array       # [batch, buffer] float32
  lengths: Array        # [batch] int32 emitted tokens
  done: Array           # [batch] bool
  target_cache: Any
  draft_cache: Any
  target_calls: Array   # [batch] int32
  proposed: Array       # [batch] int32
  accepted: Array       # [batch] int32
  beta_sum: Array       # [batch] float32
  beta_count: Array     # [batch] int32
  draft_behind: Array   # [batch] bool: draft cache lacks position n - 1


def _slice_rows(array: Array, start: Array, size: int) -> Array:
  """array[b, start[b]:start[b] + size] for every row."""
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size))(
      array, start)


def _write_rows(array: Array, values: Array, start: Array) -> Array:
  """array[b, start[b]:start[b] + K] = values[b] for every row."""
  return jax.vmap(
      lambda row, v, s: jax.lax.dynamic_update_slice_in_dim(row, v, s, 0))(
          array, values, start)


def _draft_first_step(config, params, prepared, encoded, cache, inputs,
                      lengths, catch_up: Array):
  """The draft's logits at each row's position n, and its updated cache.

  Normally the draft's cache already holds every position before n (it fed
  them while proposing), so one token (position n) is fed. After an
  iteration that accepted all gamma proposals the draft never fed its own
  last proposal (position n - 1), so then the last two tokens are fed; the
  wider call is only paid when some row needs it (`lax.cond`), and re-writing
  an already valid slot for the other rows is harmless.

  Args:
    config: The draft's config.
    params: The draft's parameters.
    prepared: The draft's `Model.decode_kernels` (or None).
    encoded: The draft's `EncodedInputs`.
    cache: The draft's cache.
    inputs: int32 [batch, buffer + 1]: 0 then the emitted tokens.
    lengths: int32 [batch] emitted tokens n.
    catch_up: bool [] whether some row's cache lacks position n - 1.

  Returns:
    float32 logits [batch, vocab] at position n, and the cache.
  """

  def feed_last_two(cache):
    start = jnp.maximum(lengths - 1, 0)
    logits, cache = decode_chunk(config, params,
                                 _slice_rows(inputs, start, 2), start, cache,
                                 encoded, prepared)
    # Position n is chunk index 1, except at n = 0 where it is index 0.
    return jnp.take_along_axis(logits, (lengths - start)[:, None, None],
                               axis=1)[:, 0], cache

  def feed_last(cache):
    logits, cache = decode_chunk(config, params,
                                 _slice_rows(inputs, lengths, 1), lengths,
                                 cache, encoded, prepared)
    return logits[:, 0], cache

  return jax.lax.cond(catch_up, feed_last_two, feed_last, cache)


def _draft_proposals(config, params, prepared, encoded, cache, inputs,
                     lengths, keys, catch_up: Array, gamma: int,
                     sampling: SamplingConfig, stop_rule=None, stopped=None):
  """Runs the draft gamma steps (fewer with a `stop_rule`) from each row.

  Returns:
    tokens int32 [batch, gamma], probs float32 [batch, gamma, vocab] they
    were drawn from (0 where nothing was proposed), the draft cache, and
    int32 [batch] proposals per row.
  """
  step_keys = jax.vmap(lambda k: jax.random.split(k, gamma))(keys)
  logits, cache = _draft_first_step(config, params, prepared, encoded, cache,
                                    inputs, lengths, catch_up)
  logprobs = sampling_lib.process_logits(logits, sampling)
  token = sampling_lib.sample_tokens(step_keys[:, 0], logprobs,
                                     sampling.greedy)
  if stop_rule is not None:

    def decode(cache, token, i):
      logits, cache = decode_chunk(config, params, token[:, None],
                                   lengths + i, cache, encoded, prepared)
      return logits[:, 0], cache

    return draft_stop_lib.propose(decode, cache, token, logprobs, step_keys,
                                  gamma, sampling, stop_rule, stopped)

  def step(carry, i):
    cache, token = carry
    # Proposal i comes from feeding proposal i - 1 at position n + i.
    logits, cache = decode_chunk(config, params, token[:, None],
                                 lengths + i, cache, encoded, prepared)
    logprobs = sampling_lib.process_logits(logits[:, 0], sampling)
    next_token = sampling_lib.sample_tokens(step_keys[:, i], logprobs,
                                            sampling.greedy)
    return (cache, next_token), (next_token, logprobs)

  (cache, _), (tokens, logprobs_rest) = jax.lax.scan(
      step, (cache, token), jnp.arange(1, gamma, dtype=jnp.int32))
  # scan stacks along axis 0: [gamma - 1, batch, ...] -> [batch, gamma - 1, ...]
  tokens = jnp.concatenate([token[:, None], tokens.T], axis=1)
  logprobs = jnp.concatenate(
      [logprobs[:, None], jnp.swapaxes(logprobs_rest, 0, 1)], axis=1)
  return tokens, jnp.exp(logprobs), cache, jnp.full_like(lengths, gamma)


@functools.partial(compile_lib.decoder_jit,
                   static_argnums=(0, 1, 6, 7, 9, 10, 11, 12, 13, 14))
def _speculative_generate(target_config, draft_config, target_params,
                          draft_params, encoder_input_tokens, rng,
                          max_decode_len: int, sampling: SamplingConfig,
                          eos_id: int, gamma: int, lenience: float,
                          verification: str = 'token', draft_stop=None,
                          target_partitioning=None, draft_partitioning=None,
                          target_prepared=None, draft_prepared=None
                          ) -> DecodeResult:
  # The target's rules apply to everything but the draft's own calls.
  with partitioning_lib.active(target_partitioning):
    return _speculative_loop(
        target_config, draft_config, target_params, draft_params,
        target_prepared, draft_prepared, encoder_input_tokens, rng,
        max_decode_len, sampling, eos_id, gamma, lenience, verification,
        draft_stop,
        functools.partial(partitioning_lib.active, draft_partitioning))


def _constrain_state(state: _SpeculativeState) -> _SpeculativeState:
  """Keeps each row's state beside its cache rows on a mesh."""
  caches = dict(target_cache=state.target_cache,
                draft_cache=state.draft_cache)
  bare = state.replace(target_cache=None, draft_cache=None)
  return partitioning_lib.constrain_rows(bare).replace(**caches)


def _speculative_loop(target_config, draft_config, target_params,
                      draft_params, target_prepared, draft_prepared,
                      encoder_input_tokens, rng,
                      max_decode_len: int, sampling: SamplingConfig,
                      eos_id: int, gamma: int, lenience: float,
                      verification: str, draft_stop, as_draft
                      ) -> DecodeResult:
  batch = encoder_input_tokens.shape[0]
  # Writes reach position max_decode_len + gamma for a row that stopped at
  # max_decode_len, so this size keeps every dynamic slice in bounds (XLA
  # would otherwise clamp it silently).
  cache_len = max_decode_len + gamma + 2
  buffer_len = max_decode_len + gamma + 1
  target_encoded = prepare_decoding(target_config, target_params,
                                    encoder_input_tokens, target_prepared)
  with as_draft():
    draft_encoded = prepare_decoding(draft_config, draft_params,
                                     encoder_input_tokens, draft_prepared)
  keys = sampling_lib.row_keys(rng, batch)
  positions = jnp.arange(gamma + 1, dtype=jnp.int32)

  def cond(state):
    return (state.iteration < max_decode_len) & ~jnp.all(state.done)

  def body(state):
    n = state.lengths
    active = ~state.done
    iteration_keys = sampling_lib.fold_in_rows(keys, state.iteration)
    split = jax.vmap(lambda k: jax.random.split(k, 3))(iteration_keys)
    draft_keys, accept_keys, correction_keys = (split[:, 0], split[:, 1],
                                                split[:, 2])

    with as_draft():
      draft_tokens, draft_probs, draft_cache, proposed = _draft_proposals(
          draft_config, draft_params, draft_prepared, draft_encoded,
          state.draft_cache,
          state.inputs, n, draft_keys, jnp.any(state.draft_behind & active),
          gamma, sampling, draft_stop, ~active)

    # One target call scores the last token and all gamma proposals.
    last_token = jnp.take_along_axis(state.inputs, n[:, None], axis=1)
    target_logits, target_cache = decode_chunk(
        target_config, target_params,
        jnp.concatenate([last_token, draft_tokens], axis=1), n,
        state.target_cache, target_encoded, target_prepared)
    target_probs = jnp.exp(sampling_lib.process_logits(target_logits,
                                                       sampling))

    if sampling.greedy:
      uniforms = jnp.zeros((batch, gamma), jnp.float32)
    else:
      uniforms = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(
          accept_keys)
    if draft_stop is not None:
      uniforms = draft_stop_lib.never_accept_past(uniforms, proposed)
    if verification == 'block':
      num_accepted, correction_probs = block_verification.verify_block(
          draft_tokens, draft_probs, target_probs, uniforms)
    else:
      num_accepted = verify_draft(draft_tokens, draft_probs, target_probs,
                                  uniforms, lenience)
      correction_probs = correction_distribution(draft_probs, target_probs,
                                                 num_accepted, lenience)
    correction = sampling_lib.sample_tokens(
        correction_keys, jnp.log(correction_probs), sampling.greedy)

    # [batch, gamma + 1]: accepted drafts, then the correction/bonus token.
    proposal = jnp.pad(draft_tokens, ((0, 0), (0, 1)))
    new_tokens = jnp.where(positions < num_accepted[:, None], proposal,
                           correction[:, None])
    count = jnp.where(active,
                      jnp.minimum(num_accepted + 1, max_decode_len - n), 0)
    is_eos = (new_tokens == eos_id) & (positions < count[:, None])
    hit_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, count)
    emitted = positions < count[:, None]
    new_tokens = jnp.where(emitted, new_tokens, 0)
    new_logprobs = jnp.where(
        emitted, sampling_lib.token_logprobs(target_logits, new_tokens), 0.0)

    # beta at the positions the rule examined: accepted ones plus the first
    # rejected one; later positions were conditioned on a rejected prefix.
    examined = ((positions[:gamma] <= num_accepted[:, None])
                & (positions[:gamma] < proposed[:, None]) & active[:, None])
    beta = overlap_mass(target_probs[:, :gamma], draft_probs)
    active_int = active.astype(jnp.int32)
    return _constrain_state(_SpeculativeState(
        iteration=state.iteration + 1,
        inputs=_write_rows(state.inputs, new_tokens, n + 1),
        logprobs=_write_rows(state.logprobs, new_logprobs, n),
        lengths=n + count,
        done=state.done | hit_eos | (n + count >= max_decode_len),
        target_cache=target_cache,
        draft_cache=draft_cache,
        target_calls=state.target_calls + active_int,
        proposed=state.proposed + proposed * active_int,
        accepted=state.accepted + num_accepted * active_int,
        beta_sum=state.beta_sum + jnp.sum(jnp.where(examined, beta, 0.0),
                                          axis=1),
        beta_count=state.beta_count + jnp.sum(examined, axis=1),
        draft_behind=num_accepted == gamma))

  zeros = jnp.zeros((batch,), jnp.int32)
  with as_draft():
    draft_cache = init_cache(draft_config, batch, cache_len)
  state = _constrain_state(_SpeculativeState(
      iteration=jnp.zeros((), jnp.int32),
      inputs=jnp.zeros((batch, buffer_len + 1), jnp.int32),
      logprobs=jnp.zeros((batch, buffer_len), jnp.float32),
      lengths=zeros,
      done=jnp.zeros((batch,), jnp.bool_),
      target_cache=init_cache(target_config, batch, cache_len),
      draft_cache=draft_cache,
      target_calls=zeros, proposed=zeros, accepted=zeros,
      beta_sum=jnp.zeros((batch,), jnp.float32), beta_count=zeros,
      draft_behind=jnp.zeros((batch,), jnp.bool_)))
  state = jax.lax.while_loop(cond, body, state)
  return DecodeResult(
      tokens=state.inputs[:, 1:max_decode_len + 1],
      lengths=state.lengths,
      token_logprobs=state.logprobs[:, :max_decode_len],
      target_calls=state.target_calls,
      draft_tokens_proposed=state.proposed,
      draft_tokens_accepted=state.accepted,
      acceptance_rate=state.accepted / state.beta_count,
      mean_beta=state.beta_sum / state.beta_count,
      verified_positions=state.beta_count,
      num_iterations=state.iteration,
      gamma=gamma)


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


def speculative_generate(target: Model, draft: Model,
                         encoder_input_tokens: Array, *, rng: Array,
                         max_decode_len: int, sampling: SamplingConfig,
                         eos_id: int, gamma: int, lenience: float,
                         verification: str = 'token', draft_stop=None,
                         draft_threshold=None) -> DecodeResult:
  """Speculative decoding; call `spec_decode.generate(..., draft=...)`.

  `generate` checks every argument first (so its errors name them); here
  they are only put into the form the compiled loop takes.

  Args:
    target: The model whose distribution the output follows.
    draft: The proposing model.
    encoder_input_tokens: int32 [batch, enc_len], already validated.
    rng: `jax.random` key.
    max_decode_len: Output length.
    sampling: Applied identically to target and draft logits.
    eos_id: End-of-sequence id.
    gamma: Draft tokens per iteration (>= 1).
    lenience: 1.0 is exact; (0, 1) is the lossy mode of appendix A.5.
    verification: 'token' (the paper's rule) or 'block' (block
      verification: same target call, exact, accepts at least as much).
    draft_stop: None, 'confidence' or 'entropy' (see `draft_stop`).
    draft_threshold: The stop rule's threshold.

  Returns:
    A `DecodeResult` with acceptance statistics.
  """
  verification, lenience = block_verification.check_verification(
      verification, lenience)
  stop_rule = draft_stop_lib.check_draft_stop(draft_stop, draft_threshold)
  return _speculative_generate(target.config, draft.config, target.params,
                               draft.params, encoder_input_tokens, rng,
                               max_decode_len, sampling, eos_id, gamma,
                               lenience, verification, stop_rule,
                               target.partitioning, draft.partitioning,
                               target.decode_kernels, draft.decode_kernels)
