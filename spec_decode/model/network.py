"""The T5 v1.1 encoder-decoder, with a decoder built for speculation.

The parameter tree is T5X's (`token_embedder`, `encoder/layers_i/...`,
`decoder/layers_i/...`, `decoder/logits_dense`). Unlike T5X, whose decoder
cache holds one scalar index and takes one token per call, `Transformer.decode`
takes a chunk of K >= 1 tokens per row and a per-row start position, writes
their keys/values into a preallocated cache at those positions, and masks and
biases attention by absolute position. Teacher forcing is the same call from
position 0, so there is one decoder code path for scoring, baseline decoding,
drafting and verification.
"""

from typing import Optional, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_decode import partitioning
from spec_decode.model import attention
from spec_decode.model import layers
from spec_decode.model.config import T5Config

Array = jax.Array

# Logical axes of the caches and activations; on a mesh the caches split
# their rows over 'data' and their heads over 'model' (no-ops without one).
KEY_AXES = ('batch', 'heads', 'kv', 'length')
VALUE_AXES = ('batch', 'heads', 'length', 'kv')
ACTIVATION_AXES = ('batch', 'length', 'embed')
LOGITS_AXES = ('batch', 'length', 'vocab')


def _constrain_kv(key: Array, value: Array) -> Tuple[Array, Array]:
  return (partitioning.constrain(key, KEY_AXES),
          partitioning.constrain(value, VALUE_AXES))


@flax.struct.dataclass
class DecoderCache:
  """Self-attention keys/values of every decoder layer.

  The layouts are those the attention matmuls read (T5X stores its cache
  keys the same way), so a step writes a few columns and transposes nothing.

  Attributes:
    keys: One [batch, heads, head_dim, cache_len] array per decoder layer.
    values: One [batch, heads, cache_len, head_dim] array per decoder layer.
  """
  keys: Tuple[Array, ...]
  values: Tuple[Array, ...]

  @property
  def length(self) -> int:
    return self.keys[0].shape[-1] if self.keys else 0


@flax.struct.dataclass
class EncodedInputs:
  """What the decoder needs from the encoder, computed once per call.

  Attributes:
    cross_keys: One [batch, heads, head_dim, enc_len] array per decoder layer.
    cross_values: One [batch, heads, enc_len, head_dim] array per layer.
    encoder_mask: bool [batch, enc_len], True at real (non-pad) tokens.
  """
  cross_keys: Tuple[Array, ...]
  cross_values: Tuple[Array, ...]
  encoder_mask: Array


def init_cache(config: T5Config, batch_size: int,
               cache_len: int) -> DecoderCache:
  """Returns an all-zero decoder cache of `cache_len` positions per row."""
  heads, head_dim = config.num_heads, config.head_dim
  dtype = config.activation_dtype
  layers_range = range(config.num_decoder_layers)
  pairs = [_constrain_kv(
      jnp.zeros((batch_size, heads, head_dim, cache_len), dtype),
      jnp.zeros((batch_size, heads, cache_len, head_dim), dtype))
           for _ in layers_range]
  return DecoderCache(keys=tuple(k for k, _ in pairs),
                      values=tuple(v for _, v in pairs))


def write_chunk(cache: Array, chunk: Array, start: Array, axis: int) -> Array:
  """Writes each row's chunk into its cache at positions start[b]...

  Args:
    cache: [batch, ...] with positions along `axis`.
    chunk: Like `cache` with K positions along `axis`.
    start: int [batch] first position of each row's chunk. The caller sizes
      the cache so that start + K <= cache_len (XLA would clamp silently).
    axis: The position axis (counting the batch axis).

  Returns:
    The updated cache.
  """
  return jax.vmap(
      lambda c, x, s: jax.lax.dynamic_update_slice_in_dim(c, x, s,
                                                          axis=axis - 1))(
          cache, chunk, start)


def move_chunk(cache: DecoderCache, source: Array, destination: Array,
               size: int) -> DecoderCache:
  """Copies each row's cache slots source[b] .. + size to destination[b].

  Args:
    cache: The decoder cache (every layer's keys and values).
    source: int32 [batch] first slot to copy.
    destination: int32 [batch] where it goes (slots past the row's length
      only: the copy is a window, not a shift of the whole row).
    size: Slots to copy.

  Returns:
    The cache with the windows copied.
  """
  def move(array, axis):
    window = jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(
        row, s, size, axis=axis - 1))(array, source)
    return jax.vmap(lambda row, w, d: jax.lax.dynamic_update_slice_in_dim(
        row, w, d, axis=axis - 1))(array, window, destination)
  return DecoderCache(keys=tuple(move(k, 3) for k in cache.keys),
                      values=tuple(move(v, 2) for v in cache.values))


class EncoderLayer(nn.Module):
  """Pre-norm self-attention and gated MLP blocks."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, bias: Array,
               deterministic: bool = True) -> Array:
    cfg = self.config
    dtype = cfg.activation_dtype
    dropout = lambda y: nn.Dropout(cfg.dropout_rate)(
        y, deterministic=deterministic)
    y = layers.RMSNorm(dtype, name='pre_attention_layer_norm')(x)
    y = attention.MultiHeadAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype,
        cfg.float32_attention_logits, name='attention')(y, y, bias)
    x = x + dropout(y)
    y = layers.RMSNorm(dtype, name='pre_mlp_layer_norm')(x)
    y = layers.GatedMlp(cfg.mlp_dim, cfg.mlp_activations, dtype,
                        cfg.dropout_rate, name='mlp')(y, deterministic)
    return x + dropout(y)


class Encoder(nn.Module):
  """Embedding, encoder layers with one shared relative bias, final norm."""
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoder_input_tokens: Array,
               deterministic: bool = True) -> Array:
    cfg = self.config
    dtype = cfg.activation_dtype
    dropout = lambda y: nn.Dropout(cfg.dropout_rate)(
        y, deterministic=deterministic)
    relpos = attention.RelativePositionBiases(
        cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance, cfg.num_heads, dtype,
        name='relpos_bias')
    x = dropout(self.shared_embedding(encoder_input_tokens).astype(dtype))
    if cfg.num_encoder_layers:
      positions = jnp.arange(encoder_input_tokens.shape[1], dtype=jnp.int32)
      valid = encoder_input_tokens > 0
      # [batch, 1, len, len] + [1, heads, len, len]
      bias = (attention.mask_to_bias(
          valid[:, None, :, None] & valid[:, None, None, :], dtype)
              + relpos(positions[None, :], positions, bidirectional=True))
    for index in range(cfg.num_encoder_layers):
      x = partitioning.constrain(x, ACTIVATION_AXES)
      x = EncoderLayer(cfg, name=f'layers_{index}')(x, bias, deterministic)
    return dropout(layers.RMSNorm(dtype, name='encoder_norm')(x))


class DecoderLayer(nn.Module):
  """Causal self-attention over the cache, cross-attention, gated MLP."""
  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    make_attention = lambda: attention.MultiHeadAttention(
        cfg.num_heads, cfg.head_dim, cfg.emb_dim, dtype,
        cfg.float32_attention_logits)
    self.pre_self_attention_layer_norm = layers.RMSNorm(dtype)
    self.self_attention = make_attention()
    self.pre_cross_attention_layer_norm = layers.RMSNorm(dtype)
    self.encoder_decoder_attention = make_attention()
    self.pre_mlp_layer_norm = layers.RMSNorm(dtype)
    self.mlp = layers.GatedMlp(cfg.mlp_dim, cfg.mlp_activations, dtype,
                               cfg.dropout_rate)
    self.dropout = nn.Dropout(cfg.dropout_rate)

  def cross_kv(self, encoded: Array) -> Tuple[Array, Array]:
    """Cross-attention keys/values of the encoder output."""
    return self.encoder_decoder_attention.project_kv(encoded)

  def __call__(self, x: Array, start: Array, self_bias: Array,
               cached_key: Array, cached_value: Array, cross_key: Array,
               cross_value: Array, cross_bias: Array,
               deterministic: bool = True) -> Tuple[Array, Array, Array]:
    """Runs the layer on a chunk.

    Args:
      x: [batch, K, emb] chunk activations.
      start: int [batch] absolute position of each row's first chunk token.
      self_bias: [batch, heads, K, cache_len] causal mask + relative bias.
      cached_key: [batch, heads, head_dim, cache_len].
      cached_value: [batch, heads, cache_len, head_dim].
      cross_key: [batch, heads, head_dim, enc_len].
      cross_value: [batch, heads, enc_len, head_dim].
      cross_bias: [batch, 1, 1, enc_len] encoder padding bias.
      deterministic: False drops out (training only).

    Returns:
      The layer output [batch, K, emb] and the updated key and value caches.
    """
    dropout = lambda y: self.dropout(y, deterministic=deterministic)
    y = self.pre_self_attention_layer_norm(x)
    query, key, value = self.self_attention.project_qkv(y)
    cached_key, cached_value = _constrain_kv(
        write_chunk(cached_key, key, start, axis=3),
        write_chunk(cached_value, value, start, axis=2))
    x = x + dropout(self.self_attention.attend_heads(
        query, cached_key, cached_value, self_bias))
    y = self.pre_cross_attention_layer_norm(x)
    x = x + dropout(self.encoder_decoder_attention.attend(
        y, cross_key, cross_value, cross_bias))
    y = self.pre_mlp_layer_norm(x)
    x = x + dropout(self.mlp(y, deterministic))
    return x, cached_key, cached_value


class Decoder(nn.Module):
  """Decoder layers over a position-addressed cache, final norm, logits."""
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    dtype = cfg.activation_dtype
    self.relpos_bias = attention.RelativePositionBiases(
        cfg.relative_attention_num_buckets,
        cfg.relative_attention_max_distance, cfg.num_heads, dtype)
    # A list attribute gets T5X's names layers_0, layers_1, ...
    self.layers = [DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
    self.decoder_norm = layers.RMSNorm(dtype)
    self.dropout = nn.Dropout(cfg.dropout_rate)
    if not cfg.logits_via_embedding:
      self.logits_dense = layers.Dense(cfg.vocab_size, ('embed', 'vocab'),
                                       dtype=jnp.float32)

  def cross_kv(self, encoded: Array) -> Tuple[Tuple[Array, ...],
                                              Tuple[Array, ...]]:
    pairs = [_constrain_kv(*layer.cross_kv(encoded))
             for layer in self.layers]
    return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)

  def __call__(self, decoder_input_tokens: Array, start: Array,
               cache: DecoderCache, encoded: EncodedInputs,
               deterministic: bool = True,
               tree: Optional[Tuple[int, int]] = None
               ) -> Tuple[Array, DecoderCache]:
    cfg = self.config
    dtype = cfg.activation_dtype
    dropout = lambda y: self.dropout(y, deterministic=deterministic)
    y = dropout(self.shared_embedding(decoder_input_tokens).astype(dtype))
    if self.layers:
      chunk_len = decoder_input_tokens.shape[1]
      if tree is None:
        # [batch, K] absolute positions of the chunk; [cache_len] of the
        # cache.
        query_positions = start[:, None] + jnp.arange(chunk_len,
                                                      dtype=jnp.int32)
        key_positions = jnp.arange(cache.length, dtype=jnp.int32)
        visible = (key_positions[None, None, :]
                   <= query_positions[:, :, None])
      else:
        query_positions, key_positions, visible = attention.tree_attention(
            tree, start, chunk_len, cache.length)
      # [batch, heads, K, cache_len]
      self_bias = (attention.mask_to_bias(visible[:, None], dtype)
                   + self.relpos_bias(query_positions, key_positions,
                                      bidirectional=False))
      # [batch, 1, 1, enc_len]
      cross_bias = attention.mask_to_bias(
          encoded.encoder_mask[:, None, None, :], dtype)
    keys, values = [], []
    for index, layer in enumerate(self.layers):
      y = partitioning.constrain(y, ACTIVATION_AXES)
      y, key, value = layer(y, start, self_bias, cache.keys[index],
                            cache.values[index], encoded.cross_keys[index],
                            encoded.cross_values[index], cross_bias,
                            deterministic)
      keys.append(key)
      values.append(value)
    y = dropout(self.decoder_norm(y))
    if cfg.logits_via_embedding:
      logits = self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    else:
      logits = self.logits_dense(y)
    logits = partitioning.constrain(logits, LOGITS_AXES)
    return logits, DecoderCache(keys=tuple(keys), values=tuple(values))


class Transformer(nn.Module):
  """T5 v1.1 encoder-decoder with T5X's parameter tree."""
  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = layers.Embed(cfg.vocab_size, cfg.emb_dim,
                                       cfg.activation_dtype)
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self, encoder_input_tokens: Array) -> Array:
    """Returns the encoder output [batch, enc_len, emb] after `encoder_norm`."""
    return self.encoder(encoder_input_tokens)

  def prepare_decoding(self, encoder_input_tokens: Array,
                       deterministic: bool = True) -> EncodedInputs:
    """Encodes and projects cross-attention keys/values once."""
    encoded = partitioning.constrain(
        self.encoder(encoder_input_tokens, deterministic), ACTIVATION_AXES)
    keys, values = self.decoder.cross_kv(encoded)
    return EncodedInputs(cross_keys=keys, cross_values=values,
                         encoder_mask=encoder_input_tokens > 0)

  def decode(self, decoder_input_tokens: Array, start: Array,
             cache: DecoderCache, encoded: EncodedInputs,
             deterministic: bool = True,
             tree: Optional[Tuple[int, int]] = None
             ) -> Tuple[Array, DecoderCache]:
    """Scores a chunk of K tokens per row at per-row positions.

    Args:
      decoder_input_tokens: int [batch, K]; row b's tokens sit at positions
        start[b] .. start[b] + K - 1.
      start: int [batch].
      cache: Cache holding every earlier position of each row. Entries at or
        after a row's chunk are never attended to (masked by position), so a
        row rolls back by lowering its start.
      encoded: From `prepare_decoding`.
      deterministic: False drops out (training only).
      tree: None (a sequence), or (k, gamma): the chunk is a row's last
        token then k candidates of gamma tokens, each attending only to its
        own ancestors at the positions of its depth
        (`attention.tree_layout`).

    Returns:
      float32 logits [batch, K, vocab] and the cache with the chunk written.
    """
    return self.decoder(decoder_input_tokens, start, cache, encoded,
                        deterministic, tree)

  def __call__(self, encoder_input_tokens: Array,
               decoder_input_tokens: Array,
               enable_dropout: bool = False) -> Array:
    """Teacher-forced logits: the chunked decoder from position 0.

    Args:
      encoder_input_tokens: int [batch, enc_len], 0-padded.
      decoder_input_tokens: int [batch, dec_len], targets shifted right.
      enable_dropout: Drop out at `config.dropout_rate` (training; needs a
        'dropout' rng), as T5X's `enable_dropout`.

    Returns:
      float32 logits [batch, dec_len, vocab].
    """
    deterministic = not enable_dropout
    batch, length = decoder_input_tokens.shape
    encoded = self.prepare_decoding(encoder_input_tokens, deterministic)
    cache = init_cache(self.config, batch, length)
    start = jnp.zeros((batch,), jnp.int32)
    logits, _ = self.decode(decoder_input_tokens, start, cache, encoded,
                            deterministic)
    return logits
