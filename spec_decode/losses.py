"""T5X's training loss: token cross-entropy with z-loss, optionally distilled.

The loss of a batch is the same function in training (with dropout and
gradients, `train`) and evaluation (deterministic, `train_eval`), so a draft's
validation loss and agreement read the same numbers training optimised.
"""

from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from spec_decode.model import shift_right
from spec_decode.model import T5Config
from spec_decode.model.network import Transformer

Array = jax.Array
# (params, batch, dropout_rng=None) -> (loss, metrics).
LossFn = Callable[..., Tuple[Array, Dict[str, Any]]]


def cross_entropy_with_z_loss(logits: Array, targets: Array, weights: Array,
                              z_loss: float,
                              soft_ids: Optional[Array] = None,
                              soft_probs: Optional[Array] = None,
                              soft_weight: float = 0.0
                              ) -> Tuple[Array, Dict[str, Array]]:
  """Mean token loss (T5X's cross entropy with z-loss), optionally distilled.

  Args:
    logits: float32 [batch, length, vocab].
    targets: int [batch, length].
    weights: float [batch, length], 0 at padding.
    z_loss: Weight of log(Z)^2.
    soft_ids: Optional int [batch, length, k] teacher top-k ids.
    soft_probs: Optional float [batch, length, k] their probabilities.
    soft_weight: Weight of the soft loss.

  Returns:
    The scalar loss and metrics (sums and counts).
  """
  log_z = jax.nn.logsumexp(logits, axis=-1)
  logprobs = logits - log_z[..., None]
  hard = -jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
  token_loss = hard
  if soft_ids is not None:
    picked = jnp.take_along_axis(logprobs, soft_ids.astype(jnp.int32),
                                 axis=-1)
    probs = soft_probs.astype(jnp.float32)
    probs = probs / jnp.maximum(jnp.sum(probs, -1, keepdims=True), 1e-9)
    soft = -jnp.sum(probs * picked, axis=-1)
    token_loss = (1.0 - soft_weight) * hard + soft_weight * soft
  total = token_loss + z_loss * jnp.square(log_z)
  count = jnp.maximum(jnp.sum(weights), 1.0)
  loss = jnp.sum(total * weights) / count
  correct = (jnp.argmax(logits, -1) == targets) * weights
  return loss, {'loss_sum': jnp.sum(hard * weights),
                'token_count': jnp.sum(weights),
                'correct': jnp.sum(correct)}


def make_loss_fn(model_config: T5Config, z_loss: float,
                 soft_target_weight: float = 0.0) -> LossFn:
  """The training loss of a batch: forward pass, `cross_entropy_with_z_loss`.

  Args:
    model_config: The model's config.
    z_loss: Weight of log(Z)^2.
    soft_target_weight: Weight of the loss against the teacher's top-k
      distribution, for batches that carry one (distillation).

  Returns:
    loss_fn(params, batch, dropout_rng=None) -> (loss, metrics); without a
    dropout key the model runs deterministically (evaluation).
  """
  model = Transformer(model_config)

  def loss_fn(params, batch, dropout_rng=None):
    rngs = None if dropout_rng is None else {'dropout': dropout_rng}
    logits = model.apply({'params': params}, batch['inputs'],
                         shift_right(batch['targets']),
                         enable_dropout=rngs is not None, rngs=rngs)
    return cross_entropy_with_z_loss(
        logits, batch['targets'], (batch['targets'] > 0).astype(jnp.float32),
        z_loss, batch.get('soft_ids'), batch.get('soft_probs'),
        soft_target_weight)

  return loss_fn
