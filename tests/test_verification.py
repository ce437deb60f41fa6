"""The paper's verification rule: acceptance, residual and bonus token."""

import hypothesis
from hypothesis import strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import verification


def _distribution(weights, zeros):
  weights = np.asarray(weights, np.float64)
  weights[np.asarray(zeros[:len(weights)], bool)] = 0.0
  if weights.sum() == 0:
    weights[0] = 1.0
  return (weights / weights.sum()).astype(np.float32)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(
    size=st.integers(2, 8),
    data=st.data())
def test_rejection_step_output_distribution_is_exactly_p(size, data):
  floats = st.lists(st.floats(0.0, 1.0), min_size=size, max_size=size)
  masks = st.lists(st.booleans(), min_size=size, max_size=size)
  p = _distribution(data.draw(floats), data.draw(masks))
  q = _distribution(data.draw(floats), data.draw(masks))
  p_j, q_j = jnp.asarray(p), jnp.asarray(q)
  accept = np.asarray(verification.acceptance_probability(p_j, q_j))
  # The implemented accept test (u < threshold) matches acceptance_probability.
  for token in np.flatnonzero(q > 0):
    tokens = jnp.asarray([[token]], jnp.int32)
    for u, expected in [(accept[token] * (1 - 1e-4) - 1e-7, 1),
                        (min(accept[token] * (1 + 1e-4) + 1e-7, 1.0), 0)]:
      if accept[token] == 1.0 and expected == 0:
        continue  # Always accepted: no u in [0, 1) rejects.
      if accept[token] == 0.0 and expected == 1:
        continue  # Never accepted.
      got = verification.verify_draft(tokens, q_j[None, None],
                                     jnp.stack([p_j, p_j])[None],
                                     jnp.asarray([[u]], jnp.float32))
      assert int(got[0]) == expected
  residual = np.asarray(verification.correction_distribution(
      q_j[None, None], jnp.stack([p_j, p_j])[None],
      jnp.zeros((1,), jnp.int32)))[0]
  kept = q * accept
  output = kept + (1.0 - kept.sum()) * residual
  np.testing.assert_allclose(output, p, atol=2e-6)
  # beta is the acceptance probability the rule achieves.
  np.testing.assert_allclose(float(verification.overlap_mass(p_j, q_j)),
                             kept.sum(), atol=1e-6)
  # After a fully accepted draft the bonus token is drawn from p_{g+1}.
  bonus = np.asarray(verification.correction_distribution(
      q_j[None, None], jnp.stack([q_j, p_j])[None],
      jnp.ones((1,), jnp.int32)))[0]
  np.testing.assert_allclose(bonus, p, atol=1e-7)


def test_residual_falls_back_to_p_when_p_equals_q():
  p = jnp.asarray([0.25, 0.25, 0.5])
  np.testing.assert_allclose(
      np.asarray(verification.residual_distribution(p, p)), np.asarray(p))


def test_lenience_accepts_more():
  p = jnp.asarray([0.2, 0.8])
  q = jnp.asarray([0.6, 0.4])
  exact = verification.acceptance_probability(p, q)
  lenient = verification.acceptance_probability(p, q, lenience=0.5)
  assert float(lenient[0]) > float(exact[0])
  assert float(exact[0]) == pytest.approx(1 / 3)
