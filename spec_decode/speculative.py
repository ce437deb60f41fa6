"""Speculative decoding (Leviathan, Kalman & Matias, ICML 2023, Algorithm 1).

Each iteration, for every row of the batch:
  1. The row proposes g tokens d_1..d_g: a fixed gamma, or with
     gamma='auto' a count chosen from the row's own acceptance so far and
     the measured costs (`adaptive`), 0 meaning a plain target step; a
     `draft_stop` rule may stop a row sooner. The draft samples each from
     its processed distribution q_i, from its own cache (`drafting`).
  2. The target scores [last token, d_1..d_g] in ONE decoder call, as wide
     as the longest proposal needs, giving p_1..p_{g+1} (processed with the
     same temperature/top-k/top-p).
  3. d_i is accepted while u_i < p_i(d_i) / q_i(d_i); at the first rejection
     the next token is drawn from norm(max(0, p - q)); if all g are accepted
     a bonus token is drawn from p_{g+1}. (verification='block' replaces this
     step with block verification, `block_verification.verify_block`.)
Rows advance by their own counts (1..g+1 tokens); rolling back a cache is
free because positions past a row's length are masked and later overwritten.

The whole call is one jitted function: a `lax.while_loop` over iterations with
the draft's steps inside it, so no host round trip per token. With
gamma='auto' the costs and the prior are traced arguments, so one program
serves every choice; each call width is an inner loop of its own, run
while the rows' choices keep to it (no conditional at every iteration).
(A gamma='auto' call not predicted to gain the margin by speculating,
`adaptive.ever_proposes`, is a baseline decode: `generate` runs the
baseline's program for it instead of this one.)
"""

import functools
from typing import Any, Optional

import flax
import jax
import jax.numpy as jnp

from spec_decode import adaptive
from spec_decode import block_verification
from spec_decode import candidates
from spec_decode import compile as compile_lib
from spec_decode import draft_stop as draft_stop_lib
from spec_decode import drafting
from spec_decode import partitioning as partitioning_lib
from spec_decode import sampling as sampling_lib
from spec_decode import target_verification
from spec_decode.decoding import DecodeResult
from spec_decode.model import init_cache
from spec_decode.model import Model
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding
from spec_decode.sampling import SamplingConfig

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
  draft_len: Array      # [batch] int32 right positions of the draft cache
  target_calls: Array   # [batch] int32
  proposed: Array       # [batch] int32
  accepted: Array       # [batch] int32
  beta_sum: Array       # [batch] float32
  beta_count: Array     # [batch] int32
  alpha: Array          # [batch] float32 the adaptive rule's estimate
  counts: Array         # [batch] int32 proposals at the next iteration
  proposal_counts: Array  # [batch, gamma + 1] int32 iterations per count
  expected_tokens: Array  # [batch] float32 what the rule expected ...
  expected_cost: Array    # [batch] float32 ... and at what cost (steps)
  first_accept_sum: Array  # [batch] float32 k candidates: P(some accepted)


@functools.partial(compile_lib.decoder_jit,
                   static_argnums=(0, 1, 6, 7, 9, 10, 11, 12, 13, 14, 18))
def _speculative_generate(target_config, draft_config, target_params,
                          draft_params, encoder_input_tokens, rng,
                          max_decode_len: int, sampling: SamplingConfig,
                          eos_id: int, gamma: int, lenience: float,
                          verification: str = 'token', draft_stop=None,
                          target_partitioning=None, draft_partitioning=None,
                          target_prepared=None, draft_prepared=None,
                          proposal_costs=None,
                          num_candidates: int = 1) -> DecodeResult:
  # The target's rules apply to everything but the draft's own calls.
  with partitioning_lib.active(target_partitioning):
    target_encoded = prepare_decoding(target_config, target_params,
                                      encoder_input_tokens, target_prepared)
    return _speculative_loop(
        target_config, draft_config, target_params, draft_params,
        target_prepared, draft_prepared, target_encoded,
        encoder_input_tokens, rng, max_decode_len, sampling, eos_id, gamma,
        lenience, verification, draft_stop, proposal_costs,
        functools.partial(partitioning_lib.active, draft_partitioning),
        num_candidates)


def _constrain_state(state: _SpeculativeState) -> _SpeculativeState:
  """Keeps each row's state beside its cache rows on a mesh."""
  caches = dict(target_cache=state.target_cache,
                draft_cache=state.draft_cache)
  bare = state.replace(target_cache=None, draft_cache=None)
  return partitioning_lib.constrain_rows(bare).replace(**caches)


def _write_rows(array: Array, values: Array, start: Array) -> Array:
  """array[b, start[b]:start[b] + K] = values[b] for every row."""
  return jax.vmap(
      lambda row, v, s: jax.lax.dynamic_update_slice_in_dim(row, v, s, 0))(
          array, values, start)


def _speculative_loop(target_config, draft_config, target_params,
                      draft_params, target_prepared, draft_prepared,
                      target_encoded, encoder_input_tokens, rng,
                      max_decode_len: int, sampling: SamplingConfig,
                      eos_id: int, gamma: int, lenience: float,
                      verification: str, draft_stop,
                      proposal_costs: Optional[adaptive.ProposalCosts],
                      as_draft, num_candidates: int) -> DecodeResult:
  batch = encoder_input_tokens.shape[0]
  auto = proposal_costs is not None
  if auto:
    # The rule chooses among the counts this loop was compiled for.
    proposal_costs = proposal_costs.replace(
        iteration_cost=proposal_costs.iteration_cost[:gamma + 1])
  widths = adaptive.chunk_widths(gamma) if auto else (gamma + 1,)
  catch_up_widths = (drafting.ADAPTIVE_CATCH_UP_WIDTHS if auto
                     else drafting.FIXED_CATCH_UP_WIDTHS)
  # Writes reach position max_decode_len + gamma (the target) or
  # max_decode_len + the widest catch-up (the draft) for a row that stopped
  # at max_decode_len, so these sizes keep every dynamic slice in bounds
  # (XLA would otherwise clamp it silently).
  reach = max(gamma * num_candidates, catch_up_widths[-1])
  cache_len = max_decode_len + reach + 2
  buffer_len = max_decode_len + reach + 1

  # With gamma='auto' too: a call runs this program only when its rows are
  # predicted to propose (`adaptive.ever_proposes`). (Run at the first
  # proposing iteration instead, under a conditional, it cost a conditional
  # and a copy of the draft's encoded inputs at every iteration.)
  with as_draft():
    draft_encoded = prepare_decoding(draft_config, draft_params,
                                     encoder_input_tokens, draft_prepared)
  keys = sampling_lib.row_keys(rng, batch)
  positions = jnp.arange(gamma + 1, dtype=jnp.int32)

  def cond(state):
    return (state.iteration < max_decode_len) & ~jnp.all(state.done)

  def choose(state):
    """The rows' proposals at the next iteration (gamma='auto')."""
    counts, expected, cost = adaptive.choose_counts(
        state.alpha, max_decode_len - state.lengths, ~state.done,
        proposal_costs)
    # Rows still active after an iteration always run the next one.
    return state.replace(
        counts=counts,
        expected_tokens=state.expected_tokens + jnp.where(state.done, 0.0,
                                                          expected),
        expected_cost=state.expected_cost + jnp.where(state.done, 0.0, cost))

  def width_index(state):
    """The next iteration's call width: the smallest covering every row's
    proposals (finished rows propose 0)."""
    return adaptive.width_index(jnp.max(state.counts) + 1, widths)

  def draft_block(state, counts, draft_keys):
    """The draft's proposals (tokens, probs, cache, proposed, fed)."""
    n = state.lengths
    with as_draft():
      logits, cache = drafting.catch_up(
          draft_config, draft_params, draft_prepared, draft_encoded,
          state.draft_cache, state.inputs, n, state.draft_len,
          catch_up_widths)

      def decode(cache, token, i):
        logits, cache = decode_chunk(draft_config, draft_params,
                                     token[:, None], n + i, cache,
                                     draft_encoded, draft_prepared)
        return logits[:, 0], cache

      step_keys = jax.vmap(lambda k: jax.random.split(k, gamma))(draft_keys)
      return drafting.propose(decode, cache, logits, step_keys, gamma,
                              counts, sampling, draft_stop)

  def iteration_keys(state):
    """Per-row keys of this iteration: draft, acceptance, correction."""
    split = jax.vmap(lambda k: jax.random.split(k, 3))(
        sampling_lib.fold_in_rows(keys, state.iteration))
    return split[:, 0], split[:, 1], split[:, 2]

  def iterate(width, state):
    """One iteration whose target call scores `width` tokens per row:
    proposals (none at width 1: a plain target step, the draft idle), the
    call, verification."""
    draft_keys, accept_keys, correction_keys = iteration_keys(state)
    if width == 1:
      proposed = fed = jnp.zeros((batch,), jnp.int32)
      draft_tokens = jnp.zeros((batch, gamma), jnp.int32)
      draft_probs = jnp.zeros((batch, gamma, target_config.vocab_size),
                              jnp.float32)
      uniforms = jnp.ones((batch, gamma), jnp.float32)
      draft_cache = state.draft_cache
    else:
      counts = (state.counts if auto
                else jnp.full((batch,), gamma, jnp.int32))
      draft_tokens, draft_probs, draft_cache, proposed, fed = draft_block(
          state, counts, draft_keys)
      if sampling.greedy:
        uniforms = jnp.zeros((batch, gamma), jnp.float32)
      else:
        uniforms = jax.vmap(lambda k: jax.random.uniform(k, (gamma,)))(
            accept_keys)
      # Positions past a row's proposals are never accepted: the token
      # after them is the bonus from p (their q is 0).
      uniforms = draft_stop_lib.never_accept_past(uniforms, proposed)
    verified = target_verification.score_and_verify(
        width, gamma, target_config, target_params, target_prepared,
        target_encoded, state.target_cache,
        jnp.take_along_axis(state.inputs, state.lengths[:, None], axis=1),
        state.lengths, draft_tokens, draft_probs, uniforms, proposed,
        ~state.done, correction_keys, sampling, verification, lenience)
    state = advance(state, verified, proposed, fed, width > 1, draft_cache)
    return choose(state) if auto else state

  def at_width(index, state):
    """Iterations at widths[index] for as long as the rows' choices keep
    to it (none if they do not start there)."""
    def keeps_width(state):
      return cond(state) & (width_index(state) == index)
    return jax.lax.while_loop(
        keeps_width, functools.partial(iterate, widths[index]), state)

  def through_widths(state):
    """Each width's loop in turn, so a change of width costs a loop's exit
    and another's start, where a conditional at every iteration cost ~0.1
    ms of XLA:CPU's own time (5% of a main-job iteration on a 2-core Xeon)
    and loops inside a conditional copied the caches at every iteration."""
    for index in range(len(widths)):
      state = at_width(index, state)
    return state

  def candidates_body(state):
    """One iteration with k candidates per row (`candidates`)."""
    draft_keys, accept_keys, correction_keys = iteration_keys(state)
    verified, draft_cache, first_accept = candidates.iterate(
        candidates.Decoder(target_config, target_params, target_prepared,
                           target_encoded),
        candidates.Decoder(draft_config, draft_params, draft_prepared,
                           draft_encoded), as_draft,
        state.target_cache, state.draft_cache, state.inputs, state.lengths,
        state.draft_len, ~state.done, (draft_keys, accept_keys,
                                       correction_keys),
        catch_up_widths, num_candidates, gamma, sampling)
    state = state.replace(first_accept_sum=state.first_accept_sum + jnp.where(
        state.done, 0.0, first_accept))
    return advance(state, verified, jnp.full((batch,), gamma, jnp.int32),
                   jnp.full((batch,), gamma - 1, jnp.int32), True,
                   draft_cache)

  def advance(state, verified, proposed, fed, draft_ran: bool, draft_cache):
    """The state after an iteration: tokens emitted up to EOS or the limit,
    statistics, caches."""
    n = state.lengths
    active = ~state.done
    count = jnp.where(active,
                      jnp.minimum(verified.accepted + 1, max_decode_len - n),
                      0)
    is_eos = (verified.new_tokens == eos_id) & (positions < count[:, None])
    hit_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, count)
    emitted = positions < count[:, None]
    new_tokens = jnp.where(emitted, verified.new_tokens, 0)
    new_logprobs = jnp.where(emitted, verified.new_logprobs, 0.0)
    active_int = active.astype(jnp.int32)
    num_accepted = verified.accepted
    return _constrain_state(state.replace(
        iteration=state.iteration + 1,
        inputs=_write_rows(state.inputs, new_tokens, n + 1),
        logprobs=_write_rows(state.logprobs, new_logprobs, n),
        lengths=n + count,
        done=state.done | hit_eos | (n + count >= max_decode_len),
        target_cache=verified.target_cache,
        draft_cache=draft_cache,
        # Right: position n (fed while catching up) and the accepted
        # proposals the draft fed itself.
        draft_len=(n + 1 + jnp.minimum(num_accepted, fed) if draft_ran
                   else state.draft_len),
        target_calls=state.target_calls + active_int,
        proposed=state.proposed + proposed * active_int,
        accepted=state.accepted + num_accepted * active_int,
        beta_sum=state.beta_sum + verified.beta_sum,
        beta_count=state.beta_count + verified.examined,
        alpha=(adaptive.update_alpha(state.alpha, verified.beta_sum,
                                     verified.examined,
                                     proposal_costs.alpha_prior)
               if auto else state.alpha),
        proposal_counts=state.proposal_counts + active_int[:, None] * (
            positions[None, :] == proposed[:, None]).astype(jnp.int32)))

  zeros = jnp.zeros((batch,), jnp.int32)
  float_zeros = jnp.zeros((batch,), jnp.float32)
  with as_draft():
    draft_cache = init_cache(draft_config, batch, cache_len)
  prior = proposal_costs.alpha_prior if auto else 0.0
  state = _constrain_state(_SpeculativeState(
      iteration=jnp.zeros((), jnp.int32),
      inputs=jnp.zeros((batch, buffer_len + 1), jnp.int32),
      logprobs=jnp.zeros((batch, buffer_len), jnp.float32),
      lengths=zeros,
      done=jnp.zeros((batch,), jnp.bool_),
      target_cache=init_cache(target_config, batch, cache_len),
      draft_cache=draft_cache,
      draft_len=zeros,
      target_calls=zeros, proposed=zeros, accepted=zeros,
      beta_sum=float_zeros, beta_count=zeros,
      alpha=jnp.full((batch,), prior, jnp.float32),
      counts=jnp.full((batch,), gamma, jnp.int32),
      proposal_counts=jnp.zeros((batch, gamma + 1), jnp.int32),
      expected_tokens=float_zeros, expected_cost=float_zeros,
      first_accept_sum=float_zeros))
  if num_candidates > 1:
    state = jax.lax.while_loop(cond, candidates_body, state)
  elif auto:
    state = jax.lax.while_loop(cond, through_widths, choose(state))
  else:
    state = jax.lax.while_loop(cond, functools.partial(iterate, gamma + 1),
                               state)
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
      proposal_counts=state.proposal_counts,
      predicted_speedup=(adaptive.predicted_speedup(state.expected_tokens,
                                                    state.expected_cost)
                         if auto else jnp.full((batch,), jnp.nan)),
      first_token_acceptance=(state.first_accept_sum / state.target_calls
                              if num_candidates > 1 else None),
      gamma=gamma, num_candidates=num_candidates)


def speculative_generate(target: Model, draft: Model,
                         encoder_input_tokens: Array, *, rng: Array,
                         max_decode_len: int, sampling: SamplingConfig,
                         eos_id: int, gamma: int, lenience: float,
                         verification: str = 'token', draft_stop=None,
                         draft_threshold=None,
                         proposal_costs: Optional[adaptive.ProposalCosts]
                         = None, num_candidates: int = 1) -> DecodeResult:
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
    gamma: Draft tokens per iteration (>= 1); with `proposal_costs`, the
      most a row proposes in an iteration (max_gamma).
    lenience: 1.0 is exact; (0, 1) is the lossy mode of appendix A.5.
    verification: 'token' (the paper's rule) or 'block' (block
      verification: same target call, exact, accepts at least as much).
    draft_stop: None, 'confidence' or 'entropy' (see `draft_stop`).
    draft_threshold: The stop rule's threshold.
    proposal_costs: gamma='auto': the measured costs and the prior the
      in-loop rule reads (`adaptive`); None: every row proposes gamma.
    num_candidates: k candidates of gamma tokens per row (`candidates`;
      k > 1 takes a fixed gamma and token verification).

  Returns:
    A `DecodeResult` with acceptance statistics.
  """
  verification, lenience = block_verification.check_verification(
      verification, lenience)
  stop_rule = draft_stop_lib.check_draft_stop(draft_stop, draft_threshold)
  return _speculative_generate(target.config, draft.config,
                               target.device_params, draft.device_params,
                               encoder_input_tokens, rng,
                               max_decode_len, sampling, eos_id, gamma,
                               lenience, verification, stop_rule,
                               target.partitioning, draft.partitioning,
                               target.decode_kernels, draft.decode_kernels,
                               proposal_costs, num_candidates)
