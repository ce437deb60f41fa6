"""T5 v1.1 building blocks, numerically as T5X's `examples/t5/layers.py`.

Parameters are declared with T5X's names, 2-D kernel shapes and logical axis
names (kept as `nn.LogicallyPartitioned` metadata at init), so a checkpoint
written by T5X loads into this tree unchanged and a mesh can shard it later.
"""

import functools
from typing import Any, Callable, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import partitioning

Array = jax.Array
Initializer = Callable[..., Array]

# The additive attention bias of a masked key. T5X uses -1e10 (not -inf), so a
# query whose keys are all masked attends uniformly instead of producing NaN.
MASKED_BIAS = -1e10


def _param(module: nn.Module, name: str, init: Initializer,
           shape: Tuple[int, ...], axes: Tuple[str, ...]) -> Array:
  """Declares a float32 parameter carrying T5X logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                      jnp.float32)


def relative_position_bucket(relative_position: np.ndarray,
                             bidirectional: bool,
                             num_buckets: int,
                             max_distance: int) -> np.ndarray:
  """T5's bucketing of `key_position - query_position`, in numpy float32.

  Small distances get a bucket each, larger ones share logarithmically wider
  buckets, and distances of `max_distance` or more share the last one. The log
  is taken in numpy float32 and truncated toward zero exactly as T5X does, so
  bucket boundaries agree with T5X to the last unit.

  Args:
    relative_position: int array of key position minus query position.
    bidirectional: Whether keys after the query get buckets of their own
      (encoder) or count as distance 0 (causal decoder).
    num_buckets: Number of buckets.
    max_distance: Distance from which all positions share the last bucket.

  Returns:
    int32 array of buckets, the shape of `relative_position`.
  """
  n = -np.asarray(relative_position, np.int32)
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int32) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  with np.errstate(divide='ignore'):
    val_if_large = max_exact + (
        np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
        / np.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(np.int32)
  val_if_large = np.minimum(val_if_large, num_buckets - 1)
  return (ret + np.where(is_small, n, val_if_large)).astype(np.int32)


@functools.lru_cache(maxsize=None)
def _bucket_table(bidirectional: bool, num_buckets: int,
                  max_distance: int) -> np.ndarray:
  """Buckets of relative positions -max_distance..max_distance."""
  return relative_position_bucket(
      np.arange(-max_distance, max_distance + 1), bidirectional, num_buckets,
      max_distance)


def relative_position_bucket_jnp(relative_position: Array, bidirectional: bool,
                                 num_buckets: int, max_distance: int) -> Array:
  """`relative_position_bucket` for traced positions.

  Distances at or beyond `max_distance` all fall into an end bucket, so
  clipping and looking up a numpy-built table gives T5X's buckets bit for bit
  without re-deriving float32 logs inside XLA.
  """
  table = jnp.asarray(_bucket_table(bidirectional, num_buckets, max_distance))
  index = jnp.clip(relative_position, -max_distance, max_distance)
  return table[index + max_distance]


class RMSNorm(nn.Module):
  """T5's layer norm: scale only, no mean subtraction, computed in float32.

  Attributes:
    dtype: Output dtype.
    epsilon: Added to the mean square.
  """
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    scale = _param(self, 'scale', nn.initializers.ones, (x.shape[-1],),
                   ('embed',))
    mean2 = jnp.mean(jax.lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * jax.lax.rsqrt(mean2 + self.epsilon), self.dtype)
    return y * jnp.asarray(scale, self.dtype)


class Dense(nn.Module):
  """A bias-free linear map over the last axis with a 2-D kernel.

  Attributes:
    features: Output width.
    kernel_axes: Logical axis names of the [in, out] kernel.
    dtype: Computation dtype (inputs and kernel are cast to it).
    kernel_init: Kernel initializer.
  """
  features: int
  kernel_axes: Tuple[str, str]
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, 'fan_in', 'truncated_normal')

  @nn.compact
  def __call__(self, x: Array) -> Array:
    kernel = _param(self, 'kernel', self.kernel_init,
                    (x.shape[-1], self.features), self.kernel_axes)
    x = jnp.asarray(x, self.dtype)
    kernel = jnp.asarray(kernel, self.dtype)
    # Accumulate in float32 and round once: on a mesh that splits the
    # contracted axis (out, wo), the partial sums are then added in float32,
    # so a sharded bfloat16 model computes what the unsharded one does.
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                            preferred_element_type=jnp.float32)
    return y.astype(self.dtype)


class Embed(nn.Module):
  """The token embedding table, shared by encoder and decoder inputs.

  T5X gathers with a one-hot matmul; a gather gives the same values.

  Attributes:
    num_embeddings: Vocabulary size.
    features: Embedding width.
    dtype: Output dtype.
  """
  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = _param(self, 'embedding', nn.initializers.normal(1.0),
                            (self.num_embeddings, self.features),
                            ('vocab', 'embed'))

  def __call__(self, tokens: Array) -> Array:
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, x: Array) -> Array:
    """Logits from the transposed table (only for tied embeddings)."""
    return jnp.dot(jnp.asarray(x, jnp.float32),
                   jnp.asarray(self.embedding, jnp.float32).T)


class RelativePositionBiases(nn.Module):
  """Per-head attention biases indexed by bucketed relative position.

  The table is [heads, buckets] as in T5X (the transpose of HF's layout).

  Attributes:
    num_buckets: Number of buckets.
    max_distance: Distance lumped into the last bucket.
    num_heads: Number of heads.
    dtype: Output dtype.
  """
  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array,
               bidirectional: bool) -> Array:
    """Returns biases for absolute query and key positions.

    Args:
      query_positions: int [batch, q_len] absolute positions.
      key_positions: int [k_len] absolute positions.
      bidirectional: Encoder (True) or causal decoder (False) bucketing.

    Returns:
      [batch, heads, q_len, k_len] biases in `dtype`.
    """
    table = _param(
        self, 'rel_embedding',
        nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
        (self.num_heads, self.num_buckets), ('heads', 'relpos_buckets'))
    # [batch, q_len, k_len]
    relative = key_positions[None, None, :] - query_positions[:, :, None]
    buckets = relative_position_bucket_jnp(relative, bidirectional,
                                           self.num_buckets, self.max_distance)
    # [heads, batch, q_len, k_len] -> [batch, heads, q_len, k_len]
    bias = jnp.take(jnp.asarray(table, self.dtype), buckets, axis=1)
    return jnp.transpose(bias, (1, 0, 2, 3))


def mask_to_bias(mask: Array, dtype: Any) -> Array:
  """Turns a boolean mask into T5X's additive 0 / -1e10 attention bias."""
  return jnp.where(mask, jnp.asarray(0.0, dtype), jnp.asarray(MASKED_BIAS,
                                                               dtype))


def dot_product_attention(query: Array, key: Array, value: Array, bias: Array,
                          dtype: Any, float32_logits: bool) -> Array:
  """Softmax attention without 1/sqrt(d) scaling (T5 folds it into init).

  Keys and values come in the layouts the two matmuls read directly (as in
  T5X's decoder cache), so a decoder step never transposes its cache.

  Args:
    query: [batch, q_len, heads, head_dim].
    key: [batch, heads, head_dim, k_len].
    value: [batch, heads, k_len, head_dim].
    bias: broadcastable to [batch, heads, q_len, k_len]; masks and positions.
    dtype: Activation dtype.
    float32_logits: Compute the logits in float32.

  Returns:
    [batch, q_len, heads, head_dim].
  """
  if float32_logits:
    query = query.astype(jnp.float32)
    key = key.astype(jnp.float32)
  # [batch, heads, q_len, k_len]
  logits = jnp.einsum('bqhd,bhdk->bhqk', query, key)
  logits = logits + bias.astype(logits.dtype)
  weights = jax.nn.softmax(logits).astype(dtype)
  return jnp.einsum('bhqk,bhkd->bqhd', weights, value)


class MultiHeadAttention(nn.Module):
  """Multi-head attention whose key/value projection can run separately.

  Splitting `project_kv` from `attend` lets the decoder cache self-attention
  keys/values and compute cross-attention keys/values once per generate call.

  Attributes:
    num_heads: Number of heads.
    head_dim: Width of each head.
    out_features: Output width (the model's `emb_dim`).
    dtype: Activation dtype.
    float32_logits: Compute attention logits in float32.
  """
  num_heads: int
  head_dim: int
  out_features: int
  dtype: Any = jnp.float32
  float32_logits: bool = False

  def setup(self):
    kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
    depth_scaling = np.sqrt(self.head_dim).astype(np.float32)
    query_init = lambda *args: kernel_init(*args) / depth_scaling
    joined = self.num_heads * self.head_dim
    projection = functools.partial(Dense, features=joined, dtype=self.dtype,
                                   kernel_axes=('embed', 'joined_kv'))
    self.query = projection(kernel_init=query_init)
    self.key = projection(kernel_init=kernel_init)
    self.value = projection(kernel_init=kernel_init)
    self.out = Dense(self.out_features, ('joined_kv', 'embed'),
                     dtype=self.dtype, kernel_init=kernel_init)

  def _split_heads(self, x: Array) -> Array:
    # [batch, length, heads * head_dim] -> [batch, length, heads, head_dim]
    return partitioning.constrain(
        x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim)),
        ('batch', 'length', 'heads', 'kv'))

  def project_kv(self, inputs_kv: Array) -> Tuple[Array, Array]:
    """Returns keys [batch, heads, head_dim, length] and values [batch,
    heads, length, head_dim]: the layouts `dot_product_attention` reads."""
    key = self._split_heads(self.key(inputs_kv))
    value = self._split_heads(self.value(inputs_kv))
    return jnp.transpose(key, (0, 2, 3, 1)), jnp.transpose(value, (0, 2, 1, 3))

  def attend(self, inputs_q: Array, key: Array, value: Array,
             bias: Array) -> Array:
    """Attends from `inputs_q` [batch, q_len, emb] to keys [batch, heads,
    head_dim, k_len] and values [batch, heads, k_len, head_dim]."""
    query = self._split_heads(self.query(inputs_q))
    x = dot_product_attention(query, key, value, bias, self.dtype,
                              self.float32_logits)
    # [batch, q_len, heads, head_dim] -> [batch, q_len, heads * head_dim]
    return self.out(x.reshape(x.shape[:-2] + (-1,)))

  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array) -> Array:
    key, value = self.project_kv(inputs_kv)
    return self.attend(inputs_q, key, value, bias)


class GatedMlp(nn.Module):
  """T5 v1.1's gated MLP: act_0(x W_0) * act_1(x W_1), then W_o.

  Attributes:
    intermediate_dim: Hidden width.
    activations: One flax activation name (or 'linear') per branch.
    dtype: Activation dtype.
    dropout_rate: Dropout of the hidden units when not `deterministic`.
  """
  intermediate_dim: int
  activations: Sequence[str] = ('gelu', 'linear')
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    branches = []
    for index, name in enumerate(self.activations):
      dense_name = 'wi' if len(self.activations) == 1 else f'wi_{index}'
      h = Dense(self.intermediate_dim, ('embed', 'mlp'), dtype=self.dtype,
                name=dense_name)(x)
      branches.append(h if name == 'linear' else getattr(nn, name)(h))
    # [batch, length, mlp]
    h = partitioning.constrain(functools.reduce(lambda a, b: a * b, branches),
                               ('batch', 'length', 'mlp'))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return Dense(x.shape[-1], ('mlp', 'embed'), dtype=self.dtype,
                 name='wo')(h)
