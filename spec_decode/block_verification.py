"""Block verification (Sun, Mendlovic, Leviathan et al., ICLR 2025).

Token verification (Leviathan et al. 2023) stops at the first draft token it
rejects. Block verification decides on the draft block as a whole: a later
prefix can be kept even when an earlier token, judged alone, would have been
rejected. It uses the same single target call (p_1..p_{g+1}) and the same
draft distributions (q_1..q_g), keeps the output distribution exactly the
target's, and never accepts fewer tokens in expectation (the paper's
Theorems 1 and 2; `tests/test_block_verification.py` checks both by exact
enumeration).

With d_1..d_g the draft tokens, p_{i+1} = M_b(. | d_1..d_i) the target's and
q_{i+1} = M_s(. | d_1..d_i) the draft's distribution after the prefix of
length i (q_{g+1} = 0: the draft proposed nothing there):

  weights   w_0 = 1,  w_i = min(w_{i-1} p_i(d_i) / q_i(d_i), 1)
  residual  r_i = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0)
  keep      h_i = r_i / (r_i + 1 - w_i)  for i < g,   h_g = w_g
  accepted  tau = the largest i with u_i < h_i (u_i ~ U[0, 1)), else 0
  emitted   d_1..d_tau, then one token from
            norm(max(w_tau p_{tau+1} - q_{tau+1}, 0))
            (p_{g+1} itself when tau = g).

w_i is how much of the target's probability of the prefix d_1..d_i the draft
has not yet "spent"; it only shrinks when the draft over-proposes a token.
Greedy decoding (one-hot p and q) gives w_i = 1 while the argmaxes agree and
0 after, hence tau = the first disagreement and the correction is the
target's argmax: exactly token verification, token for token.
"""

from typing import Any, Tuple

import jax
import jax.numpy as jnp

from spec_decode import validation

Array = jax.Array

# 'token': Leviathan et al.'s rule (the default); 'block': this module.
VERIFICATIONS = ('token', 'block')

# A residual with less mass than this is treated as empty, as in the token
# rule's `verification.residual_distribution`.
_EMPTY_MASS = 1e-7


def prefix_weights(draft_tokens: Array, draft_probs: Array,
                   target_probs: Array) -> Array:
  """w_0..w_g: w_0 = 1, w_i = min(w_{i-1} p_i(d_i) / q_i(d_i), 1).

  Args:
    draft_tokens: int32 [batch, gamma] proposals d_1..d_g.
    draft_probs: float32 [batch, gamma, vocab] q_1..q_g they were drawn from.
    target_probs: float32 [batch, gamma + 1, vocab] p_1..p_{g+1}.

  Returns:
    float32 [batch, gamma + 1] weights in [0, 1].
  """
  gamma = draft_tokens.shape[1]
  pick = lambda probs: jnp.take_along_axis(
      probs, draft_tokens[..., None], axis=-1)[..., 0]
  p = pick(target_probs[:, :gamma])  # [batch, gamma]
  q = pick(draft_probs)  # [batch, gamma]
  weights = [jnp.ones_like(p[:, 0])]
  for i in range(gamma):  # gamma is static and small: unrolled.
    scaled = weights[-1] * p[:, i]
    # Multiplying before dividing keeps tiny q from overflowing; q = 0 (a
    # token the draft cannot propose) counts as weight 1, never as inf.
    weights.append(jnp.where(scaled < q[:, i], scaled / q[:, i], 1.0))
  return jnp.stack(weights, axis=1)


def _next_draft_probs(draft_probs: Array) -> Array:
  """q_2..q_{g+1} [batch, gamma, vocab], with q_{g+1} = 0 (nothing drafted)."""
  return jnp.pad(draft_probs[:, 1:], ((0, 0), (0, 1), (0, 0)))


def keep_probabilities(draft_tokens: Array, draft_probs: Array,
                       target_probs: Array) -> Tuple[Array, Array]:
  """The weights w_0..w_g and the keep probabilities h_1..h_g.

  h_i is the chance that the prefix of length i is accepted given that no
  longer prefix was; `verify_block` accepts the longest prefix whose
  uniform falls under its h.

  Args:
    draft_tokens: int32 [batch, gamma].
    draft_probs: float32 [batch, gamma, vocab] q_1..q_g.
    target_probs: float32 [batch, gamma + 1, vocab] p_1..p_{g+1}.

  Returns:
    weights float32 [batch, gamma + 1] and h float32 [batch, gamma].
  """
  weights = prefix_weights(draft_tokens, draft_probs, target_probs)
  w = weights[:, 1:]  # w_1..w_g, [batch, gamma]
  residual_mass = jnp.sum(
      jnp.maximum(w[..., None] * target_probs[:, 1:]
                  - _next_draft_probs(draft_probs), 0.0), axis=-1)
  denominator = residual_mass + (1.0 - w)
  # 0 / 0 happens only where w_i = 1 and p_{i+1} = q_{i+1}; then w_{i+1} = 1
  # for every next draft token and some longer prefix is kept with
  # certainty (ultimately h_g = w_g = 1), so the value is never used. 1 is
  # what the greedy case needs to keep agreeing prefixes.
  h = jnp.where(denominator > 0.0,
                residual_mass / jnp.maximum(denominator, 1e-30), 1.0)
  # At i = g the draft proposed nothing (q_{g+1} = 0), so r_g = w_g and the
  # formula gives h_g = w_g; set it exactly rather than up to rounding.
  h = h.at[:, -1].set(w[:, -1])
  return weights, h


def block_residual(draft_probs: Array, target_probs: Array, weights: Array,
                   num_accepted: Array) -> Array:
  """norm(max(w_tau p_{tau+1} - q_{tau+1}, 0)): the token after the prefix.

  With tau = g this is p_{g+1} (q_{g+1} = 0): the bonus token. When the
  residual has no mass (p = q with w = 1, up to rounding) the event of
  stopping there has probability ~0 and p_{tau+1} itself is returned, so
  the result is always a distribution.

  Args:
    draft_probs: float32 [batch, gamma, vocab] q_1..q_g.
    target_probs: float32 [batch, gamma + 1, vocab] p_1..p_{g+1}.
    weights: float32 [batch, gamma + 1] from `prefix_weights`.
    num_accepted: int32 [batch] tau in [0, gamma].

  Returns:
    float32 [batch, vocab] probabilities summing to 1.
  """
  index = num_accepted[:, None, None]
  p = jnp.take_along_axis(target_probs, index, axis=1)[:, 0]  # [batch, vocab]
  padded = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))
  q = jnp.take_along_axis(padded, index, axis=1)[:, 0]  # [batch, vocab]
  w = jnp.take_along_axis(weights, num_accepted[:, None], axis=1)  # [batch, 1]
  residual = jnp.maximum(w * p - q, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > _EMPTY_MASS,
                   residual / jnp.maximum(mass, 1e-30), p)


def verify_block(draft_tokens: Array, draft_probs: Array, target_probs: Array,
                 uniforms: Array) -> Tuple[Array, Array]:
  """Block verification of a batch of drafts (exact; no lenience).

  Args:
    draft_tokens: int32 [batch, gamma] proposals d_1..d_g.
    draft_probs: float32 [batch, gamma, vocab] the draft's processed
      distributions q_1..q_g the proposals were drawn from.
    target_probs: float32 [batch, gamma + 1, vocab] the target's processed
      distributions p_1..p_{g+1} (after the same temperature/top-k/top-p).
    uniforms: float32 [batch, gamma] u_1..u_g ~ U[0, 1); zeros for greedy.

  Returns:
    num_accepted: int32 [batch] tau in [0, gamma], the accepted prefix.
    correction_probs: float32 [batch, vocab] the distribution to draw the
      correction (tau < gamma) or bonus (tau = gamma) token from.
  """
  gamma = draft_tokens.shape[1]
  weights, h = keep_probabilities(draft_tokens, draft_probs, target_probs)
  # Strict `<` so that P(keep) = h for u ~ U[0, 1), and greedy's u = 0
  # never keeps a prefix whose h is 0.
  kept = uniforms < h  # [batch, gamma]
  lengths = jnp.arange(1, gamma + 1, dtype=jnp.int32)
  # The LONGEST kept prefix wins: unlike token verification, a kept prefix
  # i does not need the shorter prefixes to have been kept.
  num_accepted = jnp.max(jnp.where(kept, lengths, 0), axis=1).astype(
      jnp.int32)
  return num_accepted, block_residual(draft_probs, target_probs, weights,
                                      num_accepted)


def check_verification(verification: Any, lenience: Any = 1.0
                       ) -> Tuple[str, float]:
  """Checks the verification rule and the lenience it runs with.

  Block verification refuses lenience < 1: appendix A.5's lossy mode is
  defined and analysed for the token rule only, and scaling q inside the
  block rule's cumulative weights would lose an amount nobody has bounded.

  Args:
    verification: 'token' or 'block'.
    lenience: In (0, 1]; must be 1 with 'block'.

  Returns:
    (verification, lenience as a float).

  Raises:
    TypeError, ValueError: The message names the offending argument.
  """
  if not isinstance(verification, str) or verification not in VERIFICATIONS:
    raise ValueError(f"verification must be one of 'token', 'block', got "
                     f'{verification!r}.')
  lenience = validation.check_float('lenience', lenience)
  if not 0.0 < lenience <= 1.0:
    raise ValueError(f'lenience must be in (0, 1] (1 is exact), got '
                     f'{lenience}.')
  if verification == 'block' and lenience != 1.0:
    raise ValueError(f"lenience must be 1 with verification='block' (the "
                     f"lossy mode exists for verification='token' only), got "
                     f'{lenience}.')
  return verification, lenience
