"""T5 v1.1 attention, numerically as T5X's `examples/t5/layers.py`.

Relative position buckets and biases, the attention bias of masks, softmax
attention, and the multi-head block whose projections the decoder runs
separately (keys/values into the cache, cross-attention keys/values once
per call) and, at decode time on a CPU, on the few-row kernel.
"""

import functools
from typing import Any, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels
from spec_decode import partitioning
from spec_decode.model import decode_kernels
from spec_decode.model.layers import Dense
from spec_decode.model.layers import param_with_axes
from spec_decode.model.layers import prepared_kernel
from spec_decode.model.layers import prepared_product

Array = jax.Array

# The additive attention bias of a masked key. T5X uses -1e10 (not -inf), so a
# query whose keys are all masked attends uniformly instead of producing NaN.
MASKED_BIAS = -1e10


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
      key_positions: int [k_len] absolute positions, or [batch, k_len] (a
        tree chunk's keys sit at cache slots that are not their positions).
      bidirectional: Encoder (True) or causal decoder (False) bucketing.

    Returns:
      [batch, heads, q_len, k_len] biases in `dtype`.
    """
    table = param_with_axes(
        self, 'rel_embedding',
        nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform'),
        (self.num_heads, self.num_buckets), ('heads', 'relpos_buckets'))
    if key_positions.ndim == 1:
      key_positions = key_positions[None, :]
    # [batch, q_len, k_len]
    relative = key_positions[:, None, :] - query_positions[:, :, None]
    buckets = relative_position_bucket_jnp(relative, bidirectional,
                                           self.num_buckets, self.max_distance)
    # [heads, batch, q_len, k_len] -> [batch, heads, q_len, k_len]
    bias = jnp.take(jnp.asarray(table, self.dtype), buckets, axis=1)
    return jnp.transpose(bias, (1, 0, 2, 3))


def tree_layout(tree: Tuple[int, int]) -> Tuple[np.ndarray, np.ndarray]:
  """Depths and ancestry of a chunk [last, k candidates of gamma tokens].

  Args:
    tree: (k, gamma). Chunk index 0 is the row's last token (depth 0);
      1 + j * gamma + i is candidate j's token at depth i + 1.

  Returns:
    int32 [1 + k gamma] depths and bool [1 + k gamma, 1 + k gamma]: whether
    the query at index a may attend to the key at index b (b is a itself,
    the last token, or an earlier token of a's own candidate).
  """
  k, gamma = tree
  depth = np.concatenate([[0], np.tile(np.arange(1, gamma + 1), k)])
  branch = np.concatenate([[-1], np.repeat(np.arange(k), gamma)])
  sees = ((branch[None, :] == -1)
          | ((branch[:, None] == branch[None, :])
             & (depth[None, :] <= depth[:, None])))
  return depth.astype(np.int32), sees


def tree_attention(tree: Tuple[int, int], start: Array, chunk_len: int,
                   cache_len: int) -> Tuple[Array, Array, Array]:
  """Positions and visibility for a tree chunk written at slots start[b]...

  Every slot before start[b] holds the row's own earlier tokens at their
  positions; chunk slot start + c holds a token at position start +
  depth[c], seen only by its descendants; later slots are never seen.

  Returns:
    int32 [batch, K] query positions, int32 [batch, cache_len] key positions
    and bool [batch, K, cache_len] visibility.
  """
  depth, sees = tree_layout(tree)
  if len(depth) != chunk_len:
    raise ValueError(f'a chunk of tree {tree} holds {len(depth)} tokens, got '
                     f'{chunk_len}.')
  slots = jnp.arange(cache_len, dtype=jnp.int32)
  offset = slots[None, :] - start[:, None]  # [batch, cache_len]
  in_chunk = (offset >= 0) & (offset < chunk_len)
  index = jnp.clip(offset, 0, chunk_len - 1)
  depth = jnp.asarray(depth)
  key_positions = jnp.where(in_chunk, start[:, None] + depth[index], slots)
  query_positions = start[:, None] + depth[None, :]
  # [batch, K, cache_len]
  visible = ((offset < 0)[:, None, :]
             | (in_chunk[:, None, :] & jnp.asarray(sees)[:, index].transpose(
                 1, 0, 2)))
  return query_positions, key_positions, visible


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

  def _cache_layouts(self, key: Array, value: Array) -> Tuple[Array, Array]:
    # [batch, length, heads * head_dim] -> the layouts the matmuls read.
    key = self._split_heads(key)
    value = self._split_heads(value)
    return jnp.transpose(key, (0, 2, 3, 1)), jnp.transpose(value, (0, 2, 1, 3))

  def project_kv(self, inputs_kv: Array) -> Tuple[Array, Array]:
    """Returns keys [batch, heads, head_dim, length] and values [batch,
    heads, length, head_dim]: the layouts `dot_product_attention` reads.

    One product on the few-row kernel when the joined key/value kernel was
    prepared (the cross-attention's, at decode time), else two.
    """
    joined = prepared_kernel(self, decode_kernels.JOINED_KV, inputs_kv)
    if joined is not None:
      key, value = jnp.split(prepared_product(inputs_kv, joined, self.dtype),
                             2, axis=-1)
    else:
      key, value = self.key(inputs_kv), self.value(inputs_kv)
    return self._cache_layouts(key, value)

  def project_qkv(self, inputs: Array) -> Tuple[Array, Array, Array]:
    """Self-attention's three projections of `inputs` [batch, length, emb].

    One product on the few-row kernel when the joined query/key/value
    kernel was prepared (decoding), else three.

    Returns:
      Queries [batch, length, heads, head_dim], keys [batch, heads,
      head_dim, length] and values [batch, heads, length, head_dim].
    """
    joined = prepared_kernel(self, decode_kernels.JOINED_QKV, inputs)
    if joined is not None:
      query, key, value = jnp.split(
          prepared_product(inputs, joined, self.dtype), 3, axis=-1)
    else:
      query, key, value = (self.query(inputs), self.key(inputs),
                           self.value(inputs))
    return (self._split_heads(query),) + self._cache_layouts(key, value)

  def attend_heads(self, query: Array, key: Array, value: Array,
                   bias: Array) -> Array:
    """Attends from queries [batch, q_len, heads, head_dim] to keys [batch,
    heads, head_dim, k_len] and values [batch, heads, k_len, head_dim].

    At decode time on the CPU kernels (the block's output projection was
    prepared for them) a float32 model's attention runs on
    `kernels.attention`; otherwise XLA's ops.
    """
    if (self.dtype == jnp.float32
        and prepared_kernel(self.out, 'kernel', query) is not None):
      bias = jnp.broadcast_to(bias.astype(jnp.float32),
                              (query.shape[0],) + bias.shape[1:3]
                              + (key.shape[-1],))
      x = kernels.attention(query.astype(jnp.float32), key, value, bias)
    else:
      x = dot_product_attention(query, key, value, bias, self.dtype,
                                self.float32_logits)
    # [batch, q_len, heads, head_dim] -> [batch, q_len, heads * head_dim]
    return self.out(x.reshape(x.shape[:-2] + (-1,)))

  def attend(self, inputs_q: Array, key: Array, value: Array,
             bias: Array) -> Array:
    """Attends from `inputs_q` [batch, q_len, emb] to keys [batch, heads,
    head_dim, k_len] and values [batch, heads, k_len, head_dim]."""
    return self.attend_heads(self._split_heads(self.query(inputs_q)), key,
                             value, bias)

  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array) -> Array:
    if inputs_q is inputs_kv:  # Self-attention: one joined projection.
      query, key, value = self.project_qkv(inputs_q)
      return self.attend_heads(query, key, value, bias)
    key, value = self.project_kv(inputs_kv)
    return self.attend(inputs_q, key, value, bias)


