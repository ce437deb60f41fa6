"""One speculative iteration with k candidate continuations per row.

`generate(..., num_candidates=k)`. After the draft has caught up to each
row's position n (`drafting.catch_up`):

  1. The draft draws k distinct first tokens from its processed q
     (`candidate_verification.draw_first_tokens`) and continues each as its
     own chain of gamma - 1 tokens: the k chains of a row run as k rows of
     one draft batch (the draft's cache and encoder outputs repeated k
     times: the draft is small, and a k-row draft step costs about one on
     hardware bound by streaming weights).
  2. The target scores the row's last token and all k * gamma candidate
     tokens in ONE decoder call laid out as a tree (`decode_chunk(...,
     tree=(k, gamma))`): candidate j's tokens sit at cache slots
     n + 1 + j * gamma + i, each attends to the row's cache, the last token
     and its own chain only, at the relative positions of its depth.
  3. `candidate_verification.verify_candidates` picks the candidate that
     continues and its accepted prefix, and the correction (or bonus)
     token is drawn. The chosen candidate's keys and values move to slots
     n + 1 .. n + gamma (`network.move_chunk`), where a single-draft
     iteration would have written them; the other candidates' slots lie
     past the row's length, masked and later overwritten, as every rollback
     is. The draft keeps the chosen chain's cache.

With k = 1 this would be the paper's iteration; `speculative` runs its own
code for that (no tree, no copies).
"""

from typing import Any, Callable, NamedTuple, Tuple

import jax
import jax.numpy as jnp

from spec_decode import candidate_verification
from spec_decode import drafting
from spec_decode import sampling as sampling_lib
from spec_decode import target_verification
from spec_decode.model.model import decode_chunk
from spec_decode.model.network import move_chunk
from spec_decode.sampling import SamplingConfig
from spec_decode.verification import overlap_mass

Array = jax.Array


class Decoder(NamedTuple):
  """One model's side of the loop: config, parameters, few-row kernel
  weights (or None), its `EncodedInputs`."""
  config: Any
  params: Any
  prepared: Any
  encoded: Any


def _repeat_rows(tree: Any, times: int) -> Any:
  """Every leaf's rows repeated: [batch, ...] -> [batch * times, ...]."""
  return jax.tree_util.tree_map(lambda x: jnp.repeat(x, times, axis=0), tree)


def _pick_rows(tree: Any, chosen: Array, times: int) -> Any:
  """Row b's chosen copy of [batch * times, ...] leaves -> [batch, ...]."""
  def pick(x):
    grouped = x.reshape((-1, times) + x.shape[1:])
    index = chosen.reshape((-1, 1) + (1,) * (x.ndim - 1))
    return jnp.take_along_axis(grouped, index, axis=1)[:, 0]
  return jax.tree_util.tree_map(pick, tree)


def draft_candidates(draft: Decoder, as_draft: Callable[[], Any],
                     cache: Any, logits: Array, lengths: Array, keys: Array,
                     num_candidates: int, gamma: int,
                     sampling: SamplingConfig
                     ) -> Tuple[Array, Array, Array, Array, Any]:
  """k candidates of gamma tokens per row.

  Args:
    draft: The draft's side.
    as_draft: Context manager for the draft's own calls (its mesh rules).
    cache: The draft's cache, caught up to position n.
    logits: float32 [batch, vocab] the draft's logits at n.
    lengths: int32 [batch] n.
    keys: [batch] this iteration's draft keys.
    num_candidates: k.
    gamma: Tokens per candidate.
    sampling: The shared sampling settings.

  Returns:
    int32 [batch, k, gamma] tokens (first tokens distinct), bool [batch, k]
    whether each candidate exists, float32 [batch, vocab] q at the first
    position, float32 [batch, k, gamma - 1, vocab] q further along each
    chain, and the draft's cache with k copies per row ([batch * k, ...]),
    copy j holding chain j at n + 1 .. n + gamma - 1 (for gamma 1, no
    chains: None and None).
  """
  k = num_candidates
  batch, vocab = logits.shape
  split = jax.vmap(lambda key: jax.random.split(key, 1 + k * (gamma - 1)))(
      keys)
  logprobs = sampling_lib.process_logits(logits, sampling)
  first, valid = candidate_verification.draw_first_tokens(
      split[:, 0], logprobs, logits, k, sampling.greedy)
  # No chains at gamma 1, and no zero-sized arrays standing for them: with
  # some in the program, its kernel calls lost their FFI API version on the
  # way to HLO (jax 0.10.2) and compiling failed.
  if gamma == 1:
    return first[..., None], valid, jnp.exp(logprobs), None, None
  # [batch * k, gamma - 1] keys: chain j of row b draws with its own.
  chain_keys = split[:, 1:].reshape((batch * k, gamma - 1) + split.shape[2:])
  positions = jnp.repeat(lengths, k)
  with as_draft():
    chain_cache = _repeat_rows(cache, k)
    encoded = _repeat_rows(draft.encoded, k)

    def step(i, carry):
      cache, token, tokens, probs = carry
      # Chain token i + 1 goes in at n + 1 + i; its logits give token i + 2.
      step_logits, cache = decode_chunk(draft.config, draft.params,
                                        token[:, None], positions + 1 + i,
                                        cache, encoded, draft.prepared)
      step_logprobs = sampling_lib.process_logits(step_logits[:, 0],
                                                  sampling)
      token = sampling_lib.sample_tokens(chain_keys[:, i], step_logprobs,
                                         sampling.greedy)
      return (cache, token, tokens.at[:, i].set(token),
              probs.at[:, i].set(jnp.exp(step_logprobs)))

    carry = (chain_cache, first.reshape(-1),
             jnp.zeros((batch * k, gamma - 1), jnp.int32),
             jnp.zeros((batch * k, gamma - 1, vocab), jnp.float32))
    chain_cache, _, chain_tokens, chain_probs = jax.lax.fori_loop(
        0, gamma - 1, step, carry)
  tokens = jnp.concatenate(
      [first[..., None], chain_tokens.reshape(batch, k, gamma - 1)], axis=-1)
  return (tokens, valid, jnp.exp(logprobs),
          chain_probs.reshape(batch, k, gamma - 1, vocab), chain_cache)


def score_and_verify(target: Decoder, target_cache: Any, last_token: Array,
                     lengths: Array, active: Array, tokens: Array,
                     valid: Array, first_probs: Array, chain_probs: Array,
                     accept_key: Array, correction_keys: Array,
                     sampling: SamplingConfig
                     ) -> Tuple[target_verification.Verified, Array, Array]:
  """The target's tree call on every candidate, then the rule.

  Args:
    target: The target's side.
    target_cache: Its cache.
    last_token: int32 [batch, 1] each row's last emitted token.
    lengths: int32 [batch] n.
    active: bool [batch] rows still decoding.
    tokens, valid, first_probs, chain_probs: From `draft_candidates`.
    accept_key: [batch] keys for the rule's uniforms.
    correction_keys: [batch] keys for the correction/bonus draw.
    sampling: The shared sampling settings.

  Returns:
    The `Verified` outputs (gamma + 1 positions; the chosen candidate's
    keys and values already at n + 1 ..), int32 [batch] the chosen
    candidate, float32 [batch] the chance some first token was accepted.
  """
  batch, k, gamma = tokens.shape
  chunk = jnp.concatenate([last_token, tokens.reshape(batch, k * gamma)],
                          axis=1)
  logits, cache = decode_chunk(target.config, target.params, chunk, lengths,
                               target_cache, target.encoded, target.prepared,
                               tree=(k, gamma))
  vocab = logits.shape[-1]
  # [batch, k, gamma + 1, vocab]: the first position's logits, then each
  # candidate's own.
  tree_logits = jnp.concatenate(
      [jnp.broadcast_to(logits[:, None, :1], (batch, k, 1, vocab)),
       logits[:, 1:].reshape(batch, k, gamma, vocab)], axis=2)
  target_probs = jnp.exp(sampling_lib.process_logits(tree_logits, sampling))
  if sampling.greedy:
    uniforms = jnp.zeros((batch, k + gamma - 1), jnp.float32)
  else:
    uniforms = jax.vmap(lambda key: jax.random.uniform(
        key, (k + gamma - 1,)))(accept_key)
  first_uniforms = uniforms[:, :k]
  chain_uniforms = uniforms[:, k:] if gamma > 1 else None
  verdict = candidate_verification.verify_candidates(
      tokens, valid, first_probs, chain_probs, target_probs, first_uniforms,
      chain_uniforms, sampling.greedy)
  accepted, chosen = verdict.accepted, verdict.chosen
  correction = sampling_lib.sample_tokens(
      correction_keys, jnp.log(verdict.correction_probs), sampling.greedy)
  pick = lambda x: jnp.take_along_axis(
      x, chosen.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]
  here = jnp.arange(gamma + 1, dtype=jnp.int32)
  new_tokens = jnp.where(here < accepted[:, None],
                         jnp.pad(pick(tokens), ((0, 0), (0, 1))),
                         correction[:, None])
  path_logits = pick(tree_logits)  # [batch, gamma + 1, vocab]
  new_logprobs = sampling_lib.token_logprobs(path_logits, new_tokens)
  # beta along the chosen path (the first position against q itself: the
  # single-draft rate), at the positions the rule examined.
  path_probs = pick(target_probs)
  q_path = first_probs[:, None]  # [batch, gamma, vocab]
  if gamma > 1:
    q_path = jnp.concatenate([q_path, pick(chain_probs)], axis=1)
  examined = (here[:gamma] <= accepted[:, None]) & active[:, None]
  beta = jnp.sum(jnp.where(examined, overlap_mass(path_probs[:, :gamma],
                                                  q_path), 0.0), axis=1)
  cache = move_chunk(cache, lengths + 1 + chosen * gamma, lengths + 1,
                     gamma)
  verified = target_verification.Verified(
      target_cache=cache, accepted=accepted, new_tokens=new_tokens,
      new_logprobs=new_logprobs, beta_sum=beta,
      examined=jnp.sum(examined, axis=1).astype(jnp.int32))
  return verified, chosen, verdict.first_accept_probability


def iterate(target: Decoder, draft: Decoder, as_draft: Callable[[], Any],
            target_cache: Any, draft_cache: Any, inputs: Array,
            lengths: Array, draft_len: Array, active: Array,
            keys: Tuple[Array, Array, Array],
            catch_up_widths: Tuple[int, ...], num_candidates: int,
            gamma: int, sampling: SamplingConfig
            ) -> Tuple[target_verification.Verified, Any, Array]:
  """A whole iteration: catch up, draft k candidates, verify them.

  Args:
    target: The target's side.
    draft: The draft's side.
    as_draft: Context manager for the draft's own calls.
    target_cache: The target's cache.
    draft_cache: The draft's cache.
    inputs: int32 [batch, buffer]: 0 then the emitted tokens.
    lengths: int32 [batch] emitted tokens n.
    draft_len: int32 [batch] right positions of the draft's cache.
    active: bool [batch] rows still decoding.
    keys: [batch] draft, acceptance and correction keys of the iteration.
    catch_up_widths: `drafting.catch_up`'s compiled widths.
    num_candidates: k.
    gamma: Tokens per candidate.
    sampling: The shared sampling settings.

  Returns:
    The `Verified` outputs, the draft's cache (the chosen chain's: right at
    n + 1 .. n + min(accepted, gamma - 1)), and float32 [batch] the chance
    that some first token was accepted.
  """
  draft_keys, accept_keys, correction_keys = keys
  with as_draft():
    logits, cache = drafting.catch_up(
        draft.config, draft.params, draft.prepared, draft.encoded,
        draft_cache, inputs, lengths, draft_len, catch_up_widths)
  tokens, valid, first_probs, chain_probs, chain_cache = draft_candidates(
      draft, as_draft, cache, logits, lengths, draft_keys, num_candidates,
      gamma, sampling)
  verified, chosen, first_accept = score_and_verify(
      target, target_cache,
      jnp.take_along_axis(inputs, lengths[:, None], axis=1), lengths,
      active, tokens, valid, first_probs, chain_probs, accept_keys,
      correction_keys, sampling)
  # With gamma 1 the draft fed only position n, in `catch_up`.
  kept = (cache if chain_cache is None
          else _pick_rows(chain_cache, chosen, num_candidates))
  return verified, kept, first_accept
