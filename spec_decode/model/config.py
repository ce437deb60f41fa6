"""T5 v1.1 model configuration and the T5X presets."""

import dataclasses
from typing import Any, Dict, Tuple

import jax.numpy as jnp
import numpy as np

_DTYPES = {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 v1.1 encoder-decoder, named as in T5X.

  The config is frozen and hashable, so it can be a static argument of jitted
  functions. `dtype` is the activation dtype as a string; parameters are always
  stored in float32 (or whatever a checkpoint was cast to on read).

  Attributes:
    vocab_size: Number of token ids, shared by encoder and decoder.
    emb_dim: Width of the residual stream.
    num_heads: Attention heads per attention block.
    num_encoder_layers: Encoder depth.
    num_decoder_layers: Decoder depth. Zero gives a model whose logits depend
      on the current token only (a bigram model), which is how the paper's
      cheap n-gram drafts are expressed.
    head_dim: Width of each attention head.
    mlp_dim: Hidden width of the gated MLP.
    mlp_activations: Activations of the gated MLP branches, T5X style.
    dtype: Activation dtype, 'bfloat16' (T5X's default) or 'float32'; a
      dtype object (`jnp.bfloat16`, `np.float32`) is stored as its name.
    logits_via_embedding: Tie the output layer to the token embedding. T5 v1.1
      unties them (False).
    float32_attention_logits: Compute attention logits in float32.
    relative_attention_num_buckets: Relative position buckets (T5: 32).
    relative_attention_max_distance: Distance lumped into the last bucket.
    dropout_rate: Dropout of embeddings, sublayer outputs and MLP hidden
      units while training (T5X fine-tunes with 0.1). Decoding and scoring
      never drop out, whatever the rate.
  """

  vocab_size: int = 32128
  emb_dim: int = 512
  num_heads: int = 6
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  head_dim: int = 64
  mlp_dim: int = 1024
  mlp_activations: Tuple[str, ...] = ('gelu', 'linear')
  dtype: str = 'bfloat16'
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  dropout_rate: float = 0.0

  def __post_init__(self):
    # Lists are not hashable; gin and JSON hand us lists.
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    if not isinstance(self.dtype, str):
      # T5X's Python configs pass jnp/np dtypes; gin files pass strings. The
      # string form keeps the config hashable and JSON-serialisable.
      try:
        object.__setattr__(self, 'dtype', np.dtype(self.dtype).name)
      except TypeError:
        pass  # Refused below, naming the value.
    if self.dtype not in _DTYPES:
      raise ValueError(
          f'dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}.')
    for name in ('vocab_size', 'emb_dim', 'num_heads', 'head_dim', 'mlp_dim',
                 'relative_attention_num_buckets',
                 'relative_attention_max_distance'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name} must be a positive integer, got {value!r}.')
    for name in ('num_encoder_layers', 'num_decoder_layers'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(
            f'{name} must be a non-negative integer, got {value!r}.')
    if (not isinstance(self.dropout_rate, (int, float))
        or not 0.0 <= self.dropout_rate < 1.0):
      raise ValueError(
          f'dropout_rate must be in [0, 1), got {self.dropout_rate!r}.')
    if not self.mlp_activations:
      raise ValueError('mlp_activations must name at least one activation.')

  @property
  def activation_dtype(self) -> Any:
    """The jnp dtype of activations."""
    return _DTYPES[self.dtype]

  def replace(self, **overrides) -> 'T5Config':
    """Returns a copy with `overrides` applied."""
    return dataclasses.replace(self, **overrides)


# T5X's t5_1_1 gin files (vocab 32128, gated GELU, untied logits).
PRESETS: Dict[str, Dict[str, Any]] = {
    't5_1_1_tiny': dict(emb_dim=8, num_heads=4, num_encoder_layers=2,
                        num_decoder_layers=2, head_dim=3, mlp_dim=16),
    't5_1_1_small': dict(emb_dim=512, num_heads=6, num_encoder_layers=8,
                         num_decoder_layers=8, head_dim=64, mlp_dim=1024),
    't5_1_1_base': dict(emb_dim=768, num_heads=12, num_encoder_layers=12,
                        num_decoder_layers=12, head_dim=64, mlp_dim=2048),
    't5_1_1_large': dict(emb_dim=1024, num_heads=16, num_encoder_layers=24,
                         num_decoder_layers=24, head_dim=64, mlp_dim=2816),
    't5_1_1_xl': dict(emb_dim=2048, num_heads=32, num_encoder_layers=24,
                      num_decoder_layers=24, head_dim=64, mlp_dim=5120),
    't5_1_1_xxl': dict(emb_dim=4096, num_heads=64, num_encoder_layers=24,
                       num_decoder_layers=24, head_dim=64, mlp_dim=10240),
}


def t5_config(name: str, **overrides) -> T5Config:
  """Returns the T5X preset `name` with `overrides` applied.

  Args:
    name: One of `PRESETS` (e.g. 't5_1_1_small').
    **overrides: Any `T5Config` field, e.g. `dtype='float32'`.

  Returns:
    The config.

  Raises:
    ValueError: `name` is not a preset or an override is not a field.
  """
  if name not in PRESETS:
    raise ValueError(
        f'name must be one of {sorted(PRESETS)}, got {name!r}.')
  fields = {f.name for f in dataclasses.fields(T5Config)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(
        f'Unknown T5Config field(s) {unknown}; expected some of '
        f'{sorted(fields)}.')
  return T5Config(**{**PRESETS[name], **overrides})
