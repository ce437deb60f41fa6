"""The model's kernels in the few-row kernel's layout, prepared once.

At decode time on one CPU device the products of a decoding call run on
`spec_decode.kernels` (see there for why). Their weights come from here: a
Flax variable collection, `DECODE_KERNELS`, beside 'params', holding a
`PackedKernel` at each product's module path:

  decoder/layers_i/self_attention/joined_qkv    query | key | value
  decoder/layers_i/self_attention/out/kernel
  decoder/layers_i/encoder_decoder_attention/query/kernel, out/kernel
  decoder/layers_i/encoder_decoder_attention/joined_kv   key | value, run
      once per call on the encoder output
  decoder/layers_i/mlp/joined_wi                wi_0 | wi_1
  decoder/layers_i/mlp/wo/kernel
  decoder/logits_dense/kernel
  encoder/layers_i/attention/joined_qkv, out/kernel
  encoder/layers_i/mlp/joined_wi, wo/kernel

Products that share an input are joined (one call, one weight stream).
The encoder pass is part of every decoding call and, at batch 1, a
product of a few dozen rows (the input's tokens): the kernel's regime too.
The T5X parameter tree is untouched: checkpoints, training and scoring use
it with XLA's dots, and so does any product with more rows than
`kernels.MAX_ROWS`. The prepared copy costs memory beside the params:
half the dense weights in bfloat16 panels (the shipped models: 62 MB for
the target, 4 MB for the tiny draft), all of them in float32 panels.
"""

from typing import Any, Dict

import jax.numpy as jnp
import numpy as np

from spec_decode import kernels
from spec_decode.model.config import T5Config

DECODE_KERNELS = 'decode_kernels'
JOINED_QKV = 'joined_qkv'
JOINED_KV = 'joined_kv'
JOINED_WI = 'joined_wi'


def _pack(kernel_arrays, activation_dtype) -> kernels.PackedKernel:
  joined = np.concatenate([np.asarray(k, np.float32) for k in kernel_arrays],
                          axis=1)
  even = joined.shape[0] % 2 == 0  # No T5 has an odd input width.
  if kernels.product_inputs() == 'bfloat16' and even:
    return kernels.pack_kernel(joined, inputs='bfloat16')
  dtype = kernels.packed_dtype(joined, activation_dtype)
  if (kernels.uses_amx() and even
      and kernels.packed_dtype(joined) == np.dtype(jnp.bfloat16)):
    # float32 inputs in bfloat16 parts on AMX tiles: weights that are
    # bfloat16 values only (those products are then exact).
    return kernels.pack_kernel(joined, dtype, amx=True)
  return kernels.pack_kernel(joined, dtype)


def _mlp(config: T5Config, mlp: Dict[str, Any], dtype) -> Dict[str, Any]:
  if len(config.mlp_activations) > 1:
    tree = {JOINED_WI: _pack([mlp[f'wi_{i}']['kernel']
                              for i in range(len(config.mlp_activations))],
                             dtype)}
  else:
    tree = {'wi': {'kernel': _pack([mlp['wi']['kernel']], dtype)}}
  tree['wo'] = {'kernel': _pack([mlp['wo']['kernel']], dtype)}
  return tree


def _self_attention(block: Dict[str, Any], dtype) -> Dict[str, Any]:
  return {
      JOINED_QKV: _pack([block[name]['kernel']
                         for name in ('query', 'key', 'value')], dtype),
      'out': {'kernel': _pack([block['out']['kernel']], dtype)},
  }


def prepare(config: T5Config, params: Dict[str, Any]) -> Dict[str, Any]:
  """The `DECODE_KERNELS` collection for a model's parameters.

  Each kernel is packed in the dtype that changes no result
  (`kernels.packed_dtype`): bfloat16 for bfloat16 models and for float32
  weights that are bfloat16 values, float32 otherwise. With
  `kernels.set_product_inputs('bfloat16')` every kernel is packed for
  bfloat16 inputs instead (weights rounded to bfloat16 too). Where
  `kernels.uses_amx()`, kernels holding bfloat16 values are laid out for
  AMX tiles (float32 inputs in bfloat16 parts; the same bytes).

  Args:
    config: The model config.
    params: Its T5X parameter tree.

  Returns:
    A nested dict of `PackedKernel`s keyed by module path.
  """
  dtype = config.activation_dtype
  decoder = params['decoder']
  decoder_tree: Dict[str, Any] = {}
  for index in range(config.num_decoder_layers):
    layer = decoder[f'layers_{index}']
    cross = layer['encoder_decoder_attention']
    decoder_tree[f'layers_{index}'] = {
        'self_attention': _self_attention(layer['self_attention'], dtype),
        'encoder_decoder_attention': {
            'query': {'kernel': _pack([cross['query']['kernel']], dtype)},
            JOINED_KV: _pack([cross['key']['kernel'],
                              cross['value']['kernel']], dtype),
            'out': {'kernel': _pack([cross['out']['kernel']], dtype)},
        },
        'mlp': _mlp(config, layer['mlp'], dtype),
    }
  if not config.logits_via_embedding:
    # The logits layer computes in float32 whatever the model's dtype.
    decoder_tree['logits_dense'] = {'kernel': _pack(
        [decoder['logits_dense']['kernel']], np.float32)}
  encoder_tree = {
      f'layers_{index}': {
          'attention': _self_attention(
              params['encoder'][f'layers_{index}']['attention'], dtype),
          'mlp': _mlp(config, params['encoder'][f'layers_{index}']['mlp'],
                      dtype),
      } for index in range(config.num_encoder_layers)}
  return {'decoder': decoder_tree, 'encoder': encoder_tree}
