"""Reading Hugging Face T5 checkpoints (safetensors) into T5X's tree.

A Hugging Face T5 folder holds `config.json` and either `model.safetensors`
or shards listed in `model.safetensors.index.json`. Tensors are read with the
`safetensors` numpy API, so neither torch nor transformers is needed, and
(like T5X checkpoints here) nothing is unpickled: `pytorch_model.bin` is never
read.

Two layouts map onto our model exactly:

- T5 v1.1 / flan-t5 / mT5 (`feed_forward_proj='gated-gelu'`): gated MLP
  `wi_0`, `wi_1`, `wo` and an untied `lm_head`.
- Original T5 (`feed_forward_proj='relu'`): one `wi`, output tied to the
  embedding and scaled by d_model**-0.5, i.e. T5X's `logits_via_embedding`.

HF Linear weights are [out, in] and T5X kernels [in, out]; HF's relative
attention bias is [buckets, heads] and T5X's [heads, buckets]. Both stacks
keep it in block 0 only and share it across layers, as T5X does.
"""

import contextlib
import functools
import json
import os
from typing import Any, Dict, Optional, Tuple

import flax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from spec_decode.checkpoints import CheckpointError
from spec_decode.model import Model
from spec_decode.model import param_shapes
from spec_decode.model import T5Config

CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
INDEX_FILE = 'model.safetensors.index.json'

# HF's T5 and mT5 are the same network (transformers copies one into the
# other); umT5 has a position bias per layer, which T5X's tree cannot hold.
_MODEL_TYPES = ('t5', 'mt5')
_ACTIVATIONS = {'gated-gelu': ('gelu', 'linear'), 'relu': ('relu',)}
_EPSILON = 1e-6  # RMSNorm's epsilon, fixed as in T5X.

# T5X sublayer -> HF module inside `{stack}.block.{i}.layer.`, per stack.
_SUBLAYERS = {
    'encoder': {'pre_attention_layer_norm': '0.layer_norm',
                'attention': '0.SelfAttention',
                'pre_mlp_layer_norm': '1.layer_norm',
                'mlp': '1.DenseReluDense'},
    'decoder': {'pre_self_attention_layer_norm': '0.layer_norm',
                'self_attention': '0.SelfAttention',
                'pre_cross_attention_layer_norm': '1.layer_norm',
                'encoder_decoder_attention': '1.EncDecAttention',
                'pre_mlp_layer_norm': '2.layer_norm',
                'mlp': '2.DenseReluDense'},
}
_PROJECTIONS = {'query': 'q', 'key': 'k', 'value': 'v', 'out': 'o'}


def _get(hf: Dict[str, Any], name: str, default: Any = None,
         required: bool = False) -> Any:
  if name not in hf or hf[name] is None:
    if required:
      raise ValueError(f'{CONFIG_FILE}: field {name!r} is missing.')
    return default
  return hf[name]


def _expect(hf: Dict[str, Any], name: str, default: Any,
            allowed: Tuple[Any, ...]) -> Any:
  value = _get(hf, name, default)
  # Compare types too: JSON's 1 is not true, nor 0 false.
  if not any(type(value) is type(a) and value == a for a in allowed):
    choices = ' or '.join(repr(a) for a in allowed)
    raise ValueError(f'{CONFIG_FILE}: {name} must be {choices}, got '
                     f'{value!r}.')
  return value


def _int(hf: Dict[str, Any], name: str, default: Optional[int] = None,
         minimum: int = 1) -> int:
  value = _get(hf, name, default, required=default is None)
  if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
    raise ValueError(f'{CONFIG_FILE}: {name} must be an integer >= {minimum}, '
                     f'got {value!r}.')
  return value


def config_from_hf(hf: Dict[str, Any], dtype: str = 'float32'
                   ) -> Tuple[T5Config, bool, bool, int]:
  """Derives our config from the contents of a HF T5 `config.json`.

  Args:
    hf: The parsed `config.json`.
    dtype: Activation dtype of the returned config.

  Returns:
    The `T5Config`; whether the output layer is tied to `shared.weight`;
    whether the decoder output is scaled by d_model**-0.5 before it; the EOS
    id.

  Raises:
    ValueError: A field is missing or has a value we do not model; the
      message names the field and the expected value.
  """
  _expect(hf, 'model_type', None, _MODEL_TYPES)
  _expect(hf, 'is_encoder_decoder', True, (True,))
  proj = _expect(hf, 'feed_forward_proj', 'relu', tuple(_ACTIVATIONS))
  epsilon = _get(hf, 'layer_norm_epsilon', _EPSILON)
  if not isinstance(epsilon, (int, float)) or abs(epsilon - _EPSILON) > 1e-12:
    raise ValueError(f'{CONFIG_FILE}: layer_norm_epsilon must be {_EPSILON} '
                     f'(T5X fixes it), got {epsilon!r}.')
  # Our decoders start from token 0 and treat 0 as encoder padding.
  _expect(hf, 'pad_token_id', 0, (0,))
  _expect(hf, 'decoder_start_token_id', 0, (0,))
  eos = _get(hf, 'eos_token_id', 1)
  if isinstance(eos, list) and len(eos) == 1:
    eos = eos[0]
  if not isinstance(eos, int) or isinstance(eos, bool):
    raise ValueError(f'{CONFIG_FILE}: eos_token_id must be one integer, got '
                     f'{eos!r}.')
  tied = _expect(hf, 'tie_word_embeddings', True, (True, False))
  # transformers 5 saves the rescaling; older configs imply it by tying.
  scaled = _expect(hf, 'scale_decoder_outputs', tied, (True, False))
  sizes = {name: _int(hf, name) for name in (
      'vocab_size', 'd_model', 'num_heads', 'd_kv', 'd_ff', 'num_layers')}
  try:
    config = T5Config(
        vocab_size=sizes['vocab_size'], emb_dim=sizes['d_model'],
        num_heads=sizes['num_heads'], head_dim=sizes['d_kv'],
        mlp_dim=sizes['d_ff'], num_encoder_layers=sizes['num_layers'],
        num_decoder_layers=_int(hf, 'num_decoder_layers', sizes['num_layers'],
                                minimum=0),
        mlp_activations=_ACTIVATIONS[proj], dtype=dtype,
        logits_via_embedding=tied and scaled,
        relative_attention_num_buckets=_int(
            hf, 'relative_attention_num_buckets', 32),
        relative_attention_max_distance=_int(
            hf, 'relative_attention_max_distance', 128),
        dropout_rate=_get(hf, 'dropout_rate', 0.0))
  except ValueError as e:
    raise ValueError(f'{CONFIG_FILE}: {e}') from e
  return config, tied, scaled, eos


def _hf_name(key: Tuple[str, ...]) -> Tuple[str, bool]:
  """The HF tensor holding T5X parameter `key`, and whether to transpose."""
  if key == ('token_embedder', 'embedding'):
    return 'shared.weight', False
  stack, module = key[0], key[1]
  if module in ('encoder_norm', 'decoder_norm'):
    return f'{stack}.final_layer_norm.weight', False
  if module == 'relpos_bias':
    return (f'{stack}.block.0.layer.0.SelfAttention.'
            'relative_attention_bias.weight', True)
  if module == 'logits_dense':
    return 'lm_head.weight', True
  index = int(module[len('layers_'):])
  prefix = f'{stack}.block.{index}.layer.{_SUBLAYERS[stack][key[2]]}'
  if key[-1] == 'scale':
    return f'{prefix}.weight', False
  return f'{prefix}.{_PROJECTIONS.get(key[3], key[3])}.weight', True


def _tensor_files(path: str) -> Dict[str, str]:
  """Maps every tensor name to the safetensors file that holds it."""
  if os.path.isfile(os.path.join(path, WEIGHTS_FILE)):
    file = os.path.join(path, WEIGHTS_FILE)
    with _open(file) as f:
      return {name: file for name in f.keys()}
  index = os.path.join(path, INDEX_FILE)
  if not os.path.isfile(index):
    raise CheckpointError(
        f'{path}: holds neither {WEIGHTS_FILE} nor {INDEX_FILE} (only '
        'safetensors are read, never pickled pytorch_model.bin files).')
  try:
    with open(index) as f:
      weight_map = json.load(f)['weight_map']
    # Shards live next to the index; a path elsewhere is not a shard.
    if not all(isinstance(v, str) and os.path.basename(v) == v
               for v in weight_map.values()):
      raise ValueError('shard names must be plain file names')
    return {str(k): os.path.join(path, v) for k, v in weight_map.items()}
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise CheckpointError(f'{index}: not a safetensors index (a JSON object '
                          f'whose "weight_map" names shard files): {e!r}'
                          ) from e


def _open(file: str) -> Any:
  if not os.path.isfile(file):
    raise CheckpointError(f'{file}: file is missing.')
  try:
    return safe_open(file, framework='np')
  except Exception as e:  # safetensors raises its own error types.
    raise CheckpointError(f'{file}: not a readable safetensors file; it may '
                          f'be truncated ({type(e).__name__}: {e}).') from e


def _read(path: str, files: Dict[str, str], handles: Dict[str, Any],
          name: str) -> np.ndarray:
  """Reads tensor `name` from whichever open file holds it."""
  if name not in files:
    raise CheckpointError(f'{path}: tensor {name!r} is missing from the '
                          'checkpoint.')
  try:
    value = handles[files[name]].get_tensor(name)
  except Exception as e:  # safetensors raises its own error types.
    raise CheckpointError(f'{files[name]}: cannot read tensor {name!r} '
                          f'({type(e).__name__}: {e}).') from e
  if not jnp.issubdtype(value.dtype, jnp.floating):  # bfloat16 too
    raise CheckpointError(f'{files[name]}: tensor {name!r} has dtype '
                          f'{value.dtype}; expected floating point.')
  return value


def load_hf_checkpoint(path: str, dtype: Optional[str] = None) -> Model:
  """Loads a Hugging Face T5 checkpoint folder as a `spec_decode.Model`.

  The result is a `Model` rather than bare parameters because the config, the
  output scaling and the EOS id all come from `config.json`, and a `Model` is
  what `generate` takes (as a target or as a draft).

  Args:
    path: A local folder with `config.json` and `model.safetensors` (or
      `model.safetensors.index.json` and its shards), as written by
      `save_pretrained` or downloaded from the Hub.
    dtype: Activation dtype, and the dtype parameters are cast to on read:
      'float32' or 'bfloat16'. None means 'float32', which is what
      transformers computes in by default.

  Returns:
    A `Model` with T5X's parameter tree: original T5 checkpoints get
    `logits_via_embedding=True`, T5 v1.1 / flan-t5 / mT5 an untied
    `decoder/logits_dense`.

  Raises:
    CheckpointError: A file is missing, unreadable or truncated, a tensor is
      missing, unexpected or has the wrong shape (names the file or tensor).
    ValueError: `config.json` describes a model we do not implement (names
      the field and the value expected).
  """
  path = os.path.abspath(os.fspath(path))
  dtype = 'float32' if dtype is None else dtype
  if dtype not in ('float32', 'bfloat16'):
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}.")
  config, tied, scaled, eos_id = config_from_hf(_read_config_json(path),
                                                dtype)
  return _load_params(path, config, tied, scaled, eos_id, dtype)


def _read_config_json(path: str) -> Dict[str, Any]:
  """config.json of a checkpoint folder as a dict, or a clear error."""
  if not os.path.isdir(path):
    raise CheckpointError(f'{path}: no such folder; expected a Hugging Face '
                          'checkpoint folder.')
  config_file = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(config_file):
    raise CheckpointError(f'{config_file}: file is missing; a Hugging Face '
                          'checkpoint folder holds config.json.')
  try:
    with open(config_file) as f:
      hf = json.load(f)
  except ValueError as e:
    raise CheckpointError(f'{config_file}: not valid JSON: {e}') from e
  if not isinstance(hf, dict):
    raise CheckpointError(f'{config_file}: expected a JSON object.')
  return hf


def hf_model_config(path: str, dtype: str = 'float32') -> T5Config:
  """The `T5Config` of a Hugging Face checkpoint folder, reading no weights.
  """
  return config_from_hf(_read_config_json(os.path.abspath(path)), dtype)[0]


def _load_params(path: str, config: T5Config, tied: bool, scaled: bool,
                 eos_id: int, dtype: str) -> Model:
  """Reads the safetensors of `path` into T5X's tree for `config`."""
  expected = flax.traverse_util.flatten_dict(param_shapes(config))
  files = _tensor_files(path)
  with contextlib.ExitStack() as stack:
    handles = {file: stack.enter_context(_open(file))
               for file in sorted(set(files.values()))}
    read = functools.partial(_read, path, files, handles)
    shared = read('shared.weight')
    used = {'shared.weight'}
    params = {}
    for key, shape in expected.items():
      name, transpose = _hf_name(key)
      if key[1] == 'logits_dense' and tied:
        # Tied but not rescaled: T5X's attend() always rescales, so the head
        # becomes an untied copy of the embedding.
        name = 'shared.weight'
      value = shared if name == 'shared.weight' else read(name)
      used.add(name)
      hf_shape = tuple(reversed(shape.shape)) if transpose else shape.shape
      if value.shape != hf_shape:
        raise CheckpointError(
            f'{path}: tensor {name!r} has shape {value.shape}, but '
            f'{CONFIG_FILE} implies {hf_shape}.')
      value = np.asarray(value, np.float32)
      if transpose:
        value = value.T
      if key[1] == 'logits_dense' and scaled:
        # An untied head after rescaling: fold d_model**-0.5 into it.
        value = value * np.float32(config.emb_dim ** -0.5)
      params[key] = np.asarray(jnp.asarray(np.ascontiguousarray(value),
                                           dtype))
    # Copies of the embedding that T5X keeps once; tied heads likewise.
    for name in ('encoder.embed_tokens.weight', 'decoder.embed_tokens.weight',
                 'lm_head.weight'):
      if name in files and name not in used:
        if not np.array_equal(read(name), shared):
          why = ('config.json sets tie_word_embeddings' if name ==
                 'lm_head.weight' else 'T5X has one token embedding')
          raise CheckpointError(f'{path}: tensor {name!r} differs from '
                                f"'shared.weight', but {why}.")
        used.add(name)
    extra = sorted(set(files) - used)
    if extra:
      raise CheckpointError(
          f'{path}: unexpected tensor {extra[0]!r} ({len(extra)} in all); '
          'config.json implies no such parameter (wrong num_layers, or a '
          'per-layer position bias as in umT5?).')
  return Model(config, flax.traverse_util.unflatten_dict(params),
               eos_id=eos_id)
