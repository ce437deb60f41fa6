"""The paper's verification rule (Leviathan et al. 2023, Algorithm 1, step 3).

Draft token d_i, drawn from q_i, is kept while u_i < p_i(d_i) / q_i(d_i);
after the first rejection the next token comes from norm(max(0, p - q)), and
after a fully accepted block a bonus token comes from p_{g+1}. Together these
emit exactly the target's distribution. `block_verification` holds the
block rule (Sun et al. 2025); `speculative` runs either inside its loop.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def acceptance_probability(target_probs: Array, draft_probs: Array,
                           lenience: float = 1.0) -> Array:
  """min(1, p(x) / (l q(x))): the chance a draft token x is kept.

  Args:
    target_probs: p, float32 [..., vocab].
    draft_probs: q, float32 [..., vocab].
    lenience: l in (0, 1]; 1 is exact.

  Returns:
    float32 [..., vocab]; 1 where q(x) = 0 (such x is never proposed).
  """
  scaled = lenience * draft_probs
  return jnp.where(scaled > target_probs, target_probs / scaled, 1.0)


def residual_distribution(target_probs: Array, draft_probs: Array,
                          lenience: float = 1.0) -> Array:
  """norm(max(0, p - l q)): where to sample after a rejection.

  When p and q agree (up to rounding) the residual has no mass; a rejection
  then has probability ~0 and p itself is returned, so the result is always a
  distribution. With q = 0 (no draft token to correct) this is p: the bonus
  token after a fully accepted draft uses the same code.

  Args:
    target_probs: p, float32 [..., vocab].
    draft_probs: q, float32 [..., vocab].
    lenience: l in (0, 1]; 1 is exact.

  Returns:
    float32 [..., vocab] probabilities summing to 1.
  """
  residual = jnp.maximum(target_probs - lenience * draft_probs, 0.0)
  mass = jnp.sum(residual, axis=-1, keepdims=True)
  return jnp.where(mass > 1e-7, residual / jnp.maximum(mass, 1e-30),
                   target_probs)


def verify_draft(draft_tokens: Array, draft_probs: Array, target_probs: Array,
                 uniforms: Array, lenience: float = 1.0) -> Array:
  """The number of leading draft tokens the rejection rule accepts.

  Args:
    draft_tokens: int32 [batch, gamma] proposals d_1..d_g.
    draft_probs: float32 [batch, gamma, vocab] q_1..q_g they were drawn from.
    target_probs: float32 [batch, gamma + 1, vocab] p_1..p_{g+1}.
    uniforms: float32 [batch, gamma] u_i ~ U[0, 1).
    lenience: l in (0, 1]; 1 is exact.

  Returns:
    int32 [batch] accepted prefix length in [0, gamma].
  """
  gamma = draft_tokens.shape[1]
  pick = lambda probs: jnp.take_along_axis(
      probs, draft_tokens[..., None], axis=-1)[..., 0]
  p = pick(target_probs[:, :gamma])  # [batch, gamma]
  q = pick(draft_probs)  # [batch, gamma]
  accepted = uniforms < acceptance_probability(p, q, lenience)
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1),
                 axis=1).astype(jnp.int32)


def correction_distribution(draft_probs: Array, target_probs: Array,
                            num_accepted: Array, lenience: float = 1.0
                            ) -> Array:
  """The distribution of the token emitted after the accepted prefix.

  Args:
    draft_probs: float32 [batch, gamma, vocab].
    target_probs: float32 [batch, gamma + 1, vocab].
    num_accepted: int32 [batch] from `verify_draft`.
    lenience: l in (0, 1]; 1 is exact.

  Returns:
    float32 [batch, vocab]: the residual at the first rejected position, or
    p_{g+1} when all gamma tokens were accepted.
  """
  index = num_accepted[:, None, None]
  p = jnp.take_along_axis(target_probs, index, axis=1)[:, 0]
  # Padding q with zeros at position g+1 makes the bonus token the residual
  # of p against nothing, i.e. p itself.
  padded = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))
  q = jnp.take_along_axis(padded, index, axis=1)[:, 0]
  return residual_distribution(p, q, lenience)


def overlap_mass(target_probs: Array, draft_probs: Array) -> Array:
  """beta = sum_x min(p(x), q(x)), the exact acceptance probability."""
  return jnp.sum(jnp.minimum(target_probs, draft_probs), axis=-1)
