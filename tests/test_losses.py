"""T5X's cross-entropy with z-loss, and its distillation term."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import losses


def test_cross_entropy_with_z_loss():
  logits = jnp.asarray(np.random.RandomState(0).randn(2, 3, 5), jnp.float32)
  targets = jnp.asarray([[1, 2, 0], [4, 0, 0]])
  weights = (targets > 0).astype(jnp.float32)
  loss, metrics = losses.cross_entropy_with_z_loss(logits, targets, weights,
                                                  z_loss=1e-4)
  logz = jax.nn.logsumexp(logits, -1)
  nll = logz - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
  expected = jnp.sum((nll + 1e-4 * logz**2) * weights) / 3
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
  assert float(metrics['token_count']) == 3
  # Soft targets equal to the one-hot hard targets change nothing.
  soft_ids = targets[..., None]
  soft_probs = jnp.ones_like(soft_ids, jnp.float32)
  soft, _ = losses.cross_entropy_with_z_loss(logits, targets, weights, 1e-4,
                                            soft_ids, soft_probs, 0.5)
  np.testing.assert_allclose(float(soft), float(loss), rtol=1e-6)
