"""Verifying several candidate continuations per row in one target call.

Each row drafts k candidates that start with k DIFFERENT first tokens
x_1..x_k, drawn from the draft's processed q without replacement (in draw
order: x_1 ~ q, x_2 ~ q with x_1 removed, ...), and continue as independent
draft chains of gamma - 1 further tokens each. The target scores every
candidate in one decoder call (a tree: the row's last token, then k
branches), and the rule keeps the target's distribution exactly:

  * First token: recursive rejection sampling (Jeon et al. 2024, "Recursive
    Speculative Decoding"; SpecInfer's multi-round rule, Miao et al. 2024,
    for drafts without replacement). Round j offers x_j, drawn from
    q_j = q without x_1..x_{j-1}, renormalised, against the target's
    current distribution r_j (r_1 = p): it is accepted with probability
    min(1, r_j(x_j) / q_j(x_j)); otherwise r_{j+1} = norm(max(0, r_j - q_j))
    and the next round begins. If every round rejects, the token is drawn
    from r_{k+1}. Each round is the paper's rejection step, whose output is
    r_j whatever q_j is, so the whole is r_1 = p.
  * After an accepted x_j, its chain is verified by the paper's rule
    (`verification.verify_draft`): accepted prefix, then the residual at the
    first rejection or the bonus token from p after a fully accepted chain.

Why distinct first tokens and single chains below them: half of the shipped
pair's iterations end at the first token at temperature 1, and with
replacement a second draw often repeats the first (wasted); deeper
branching multiplies the call's width for the rarer case that the first
token survived. k = 1 is the paper's rule exactly.

Greedy decoding (one-hot p and q) takes the draft's k most likely first
tokens, each offered as a certain proposal (q_j one-hot at x_j): the rule
then accepts the candidate whose first token is the target's argmax and the
longest prefix of its chain on the target's argmax path.
"""

from typing import Tuple

import flax
import jax
import jax.numpy as jnp

from spec_decode import sampling as sampling_lib
from spec_decode.verification import acceptance_probability
from spec_decode.verification import correction_distribution
from spec_decode.verification import residual_distribution
from spec_decode.verification import verify_draft

Array = jax.Array


def draw_first_tokens(key: Array, logprobs: Array, logits: Array,
                      num_candidates: int, greedy: bool
                      ) -> Tuple[Array, Array]:
  """k distinct first tokens per row, in draw order, without replacement.

  Sampling: the Gumbel-top-k trick (the k largest of logprobs + Gumbel
  noise come out in the order of sequential draws without replacement).
  Greedy: the k largest raw logits (the first is the argmax).

  Args:
    key: [batch] per-row keys (unused when greedy).
    logprobs: float32 [batch, vocab] the draft's processed distribution q.
    logits: float32 [batch, vocab] its raw logits (greedy's order).
    num_candidates: k.
    greedy: Temperature 0.

  Returns:
    int32 [batch, k] tokens and bool [batch, k] whether each exists (top-k
    or top-p processing may leave fewer than k tokens that q can draw).
  """
  if greedy:
    scores = logits.astype(jnp.float32)
  else:
    gumbel = jax.vmap(lambda k: jax.random.gumbel(k, logprobs.shape[-1:]))(
        key)
    scores = jnp.where(jnp.isneginf(logprobs), -jnp.inf, logprobs + gumbel)
  # k passes of `sampling.argmax` (first index on ties, as greedy decoding
  # breaks them), each taking the best token out: XLA:CPU runs
  # `lax.top_k` as a sort of the whole vocabulary, ~0.9 ms at 32k tokens.
  tokens, valid = [], []
  for _ in range(num_candidates):
    best = sampling_lib.argmax(scores)
    best_score = jnp.take_along_axis(scores, best[:, None], axis=-1)[:, 0]
    tokens.append(best)
    valid.append(jnp.isfinite(best_score) | greedy)
    scores = jnp.where(jax.nn.one_hot(best, scores.shape[-1], dtype=jnp.bool_),
                       -jnp.inf, scores)
  return (jnp.stack(tokens, axis=1).astype(jnp.int32),
          jnp.stack(valid, axis=1))


def round_distributions(first_tokens: Array, valid: Array, draft_probs: Array,
                        greedy: bool) -> Array:
  """q_j, the distribution round j's token was drawn from.

  Args:
    first_tokens: int32 [batch, k] in draw order.
    valid: bool [batch, k].
    draft_probs: float32 [batch, vocab] q.
    greedy: One-hot q_j at x_j (a certain proposal).

  Returns:
    float32 [batch, k, vocab]: q without x_1..x_{j-1}, renormalised (zeros
    for a token that does not exist).
  """
  vocab = draft_probs.shape[-1]
  one_hot = jax.nn.one_hot(first_tokens, vocab, dtype=jnp.float32)
  if greedy:
    return jnp.where(valid[..., None], one_hot, 0.0)
  # [batch, k, vocab]: tokens drawn before round j.
  before = jnp.cumsum(one_hot, axis=1) - one_hot
  remaining = jnp.where(before > 0, 0.0, draft_probs[:, None, :])
  mass = jnp.sum(remaining, axis=-1, keepdims=True)
  return jnp.where(valid[..., None] & (mass > 0),
                   remaining / jnp.maximum(mass, 1e-30), 0.0)


def first_token_rounds(first_tokens: Array, valid: Array, round_probs: Array,
                       target_probs: Array) -> Tuple[Array, Array]:
  """Each round's acceptance probability, and the distribution after all.

  Round j's probability is min(1, r_j(x_j) / q_j(x_j)) for the r_j the
  rounds before it left (it matters only if they all rejected).

  Args:
    first_tokens: int32 [batch, k].
    valid: bool [batch, k].
    round_probs: float32 [batch, k, vocab] q_j (`round_distributions`).
    target_probs: float32 [batch, vocab] p at the first position.

  Returns:
    float32 [batch, k] acceptance probabilities (0 for a token that does
    not exist) and float32 [batch, vocab] r_{k+1}, where the token comes
    from if every round rejects.
  """
  residual = target_probs
  accept = []
  for j in range(first_tokens.shape[1]):
    token = first_tokens[:, j:j + 1]
    r = jnp.take_along_axis(residual, token, axis=-1)[:, 0]
    q = jnp.take_along_axis(round_probs[:, j], token, axis=-1)[:, 0]
    accept.append(jnp.where(valid[:, j] & (q > 0),
                            acceptance_probability(r, q), 0.0))
    residual = jnp.where(valid[:, j:j + 1],
                         residual_distribution(residual, round_probs[:, j]),
                         residual)
  return jnp.stack(accept, axis=1), residual


@flax.struct.dataclass
class CandidateVerdict:
  """What the rule decided for each row.

  Attributes:
    chosen: int32 [batch] the candidate whose chain continues (0 when no
      first token was accepted).
    accepted: int32 [batch] tokens accepted along it, 0 .. gamma.
    correction_probs: float32 [batch, vocab] the distribution of the token
      emitted after them (residual, r_{k+1}, or the bonus p).
    first_accept_probability: float32 [batch] the chance that some first
      token is accepted, given the drawn ones (its mean over iterations is
      the pair's first-token acceptance rate at this k; `analysis`).
  """
  chosen: Array
  accepted: Array
  correction_probs: Array
  first_accept_probability: Array


def verify_candidates(candidate_tokens: Array, first_valid: Array,
                      first_draft_probs: Array, chain_draft_probs: Array,
                      target_probs: Array, first_uniforms: Array,
                      chain_uniforms: Array, greedy: bool) -> CandidateVerdict:
  """The rule above for a batch of rows, k candidates of gamma tokens each.

  Args:
    candidate_tokens: int32 [batch, k, gamma]; [:, j, 0] are the distinct
      first tokens in draw order, [:, j, 1:] candidate j's chain.
    first_valid: bool [batch, k] whether candidate j exists.
    first_draft_probs: float32 [batch, vocab] q at the first position.
    chain_draft_probs: float32 [batch, k, gamma - 1, vocab] the draft's q
      at each further position of each chain (None for gamma 1).
    target_probs: float32 [batch, k, gamma + 1, vocab]: p at the first
      position ([:, j, 0], the same for every j), then p after each of
      candidate j's tokens.
    first_uniforms: float32 [batch, k] one draw per round.
    chain_uniforms: float32 [batch, gamma - 1] the chain's draws (only the
      chosen chain is verified, so the candidates share them; None for
      gamma 1).
    greedy: Temperature 0 (one-hot p and q).

  Returns:
    The `CandidateVerdict`.
  """
  rounds = round_distributions(candidate_tokens[:, :, 0], first_valid,
                               first_draft_probs, greedy)
  accept, after_all = first_token_rounds(
      candidate_tokens[:, :, 0], first_valid, rounds, target_probs[:, 0, 0])
  hit = first_uniforms < accept  # [batch, k]
  any_hit = jnp.any(hit, axis=1)
  chosen = jnp.where(any_hit, sampling_lib.argmax(hit), 0).astype(jnp.int32)
  pick = lambda x: jnp.take_along_axis(
      x, chosen.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0]
  tokens = pick(candidate_tokens)  # [batch, gamma]
  p = pick(target_probs)  # [batch, gamma + 1, vocab]
  # q along the chosen chain, the first position's being the round's q_j.
  q = pick(rounds)[:, None]  # [batch, gamma, vocab]
  further = 0
  if tokens.shape[1] > 1:  # (No zero-sized arrays: gamma 1 has no chain.)
    q = jnp.concatenate([q, pick(chain_draft_probs)], axis=1)
    further = verify_draft(tokens[:, 1:], q[:, 1:], p[:, 1:], chain_uniforms)
  accepted = jnp.where(any_hit, 1 + further, 0).astype(jnp.int32)
  correction = jnp.where(any_hit[:, None],
                         correction_distribution(q, p, accepted), after_all)
  none = jnp.prod(1.0 - accept, axis=1)
  return CandidateVerdict(chosen=chosen, accepted=accepted,
                          correction_probs=correction,
                          first_accept_probability=1.0 - none)
