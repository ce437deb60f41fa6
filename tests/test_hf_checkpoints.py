"""Hugging Face T5 checkpoints: both layouts match transformers; bad ones fail.

Ground truth is `../shared/fixtures/hf_t5_{v1_1,original}_tiny/`: checkpoints
written by transformers' `save_pretrained` and the logits and greedy outputs
transformers itself computed on them.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

import spec_decode as sd
from spec_decode.checkpoints import CheckpointError
from spec_decode.model import truncated_model

from conftest import FIXTURES
from conftest import random_inputs

LAYOUTS = ('hf_t5_v1_1_tiny', 'hf_t5_original_tiny')
WEIGHTS = 'model.safetensors'


def _fixture(name: str) -> str:
  path = os.path.join(FIXTURES, name)
  if not os.path.isdir(path):
    pytest.skip(f'../shared/fixtures/{name} (transformers ground truth) is '
                'not present')
  return path


def _golden(name: str):
  return dict(np.load(os.path.join(_fixture(name), 'golden.npz')))


def _load(name: str) -> sd.Model:
  return sd.load_hf_checkpoint(_fixture(name))


def _copy(tmp_path, name: str) -> str:
  """A writable copy of a fixture folder (the fixtures are read-only)."""
  path = str(tmp_path / name)
  shutil.copytree(_fixture(name), path)
  for file in os.listdir(path):
    os.chmod(os.path.join(path, file), 0o644)
  return path


def _edit_config(path: str, **changes) -> None:
  """Rewrites config.json; a value of None deletes the field."""
  file = os.path.join(path, 'config.json')
  with open(file) as f:
    config = json.load(f)
  for key, value in changes.items():
    if value is None:
      config.pop(key, None)
    else:
      config[key] = value
  with open(file, 'w') as f:
    json.dump(config, f)


def _edit_tensors(path: str, edit) -> None:
  tensors = load_file(os.path.join(path, WEIGHTS))
  edit(tensors)
  save_file(tensors, os.path.join(path, WEIGHTS), metadata={'format': 'pt'})


def _float32_sensitivity(model: sd.Model, enc, dec) -> np.ndarray:
  """How far one-ulp weight nudges move each position's logits [B, T]."""
  base = np.asarray(model.logits(enc, dec))
  leaves, tree = jax.tree_util.tree_flatten(model.params)
  spread = np.zeros(base.shape[:2])
  for seed in range(4):
    rng = np.random.RandomState(seed)
    nudged = [np.nextafter(x, np.where(rng.rand(*x.shape) < 0.5, -np.inf,
                                       np.inf).astype(x.dtype))
              for x in map(np.asarray, leaves)]
    other = sd.Model(model.config, jax.tree_util.tree_unflatten(tree, nudged))
    spread = np.maximum(spread, np.abs(
        np.asarray(other.logits(enc, dec)) - base).max(-1))
  return spread


@pytest.mark.parametrize('name', LAYOUTS)
def test_logits_match_transformers(name):
  g = _golden(name)
  model = _load(name)
  enc, dec = g['encoder_input_tokens'], g['decoder_input_tokens']
  error = np.abs(np.asarray(model.logits(enc, dec)) - g['logits']).max(-1)
  # Within 1e-4 wherever float32 can tell: at an ill-conditioned position,
  # where nudging the weights by one ulp already moves the logits by more
  # than 1e-4, transformers' own float32 rounding is that large (v1.1 fixture
  # row 0 position 3: 2.5e-4; there we are 10x closer than transformers to a
  # float64 evaluation of the same network).
  sensitivity = _float32_sensitivity(model, enc, dec)
  ill = sensitivity > 1e-4
  assert ill.sum() <= 2, f'too many ill-conditioned positions: {ill.sum()}'
  tolerance = np.where(ill, 2 * sensitivity, 1e-4)
  assert np.all(error <= tolerance), (error, tolerance)


@pytest.mark.parametrize('name', LAYOUTS)
def test_greedy_matches_transformers(name):
  g = _golden(name)
  result = sd.generate(_load(name), g['encoder_input_tokens'],
                       max_decode_len=int(g['decode_max_len']))
  # transformers keeps EOS and pads with zeros after it, as DecodeResult does.
  np.testing.assert_array_equal(np.asarray(result.tokens), g['greedy_tokens'])


def test_layouts_map_onto_t5x_tree():
  v11, original = _load(LAYOUTS[0]), _load(LAYOUTS[1])
  assert v11.config.mlp_activations == ('gelu', 'linear')
  assert not v11.config.logits_via_embedding
  assert original.config.mlp_activations == ('relu',)
  assert original.config.logits_via_embedding
  assert 'logits_dense' not in original.params['decoder']
  assert (v11.config.num_encoder_layers, v11.config.num_decoder_layers,
          v11.config.head_dim, v11.config.mlp_dim) == (2, 3, 8, 64)
  hf = load_file(os.path.join(_fixture(LAYOUTS[0]), WEIGHTS))
  layer = v11.params['decoder']['layers_2']
  # HF Linear weights are [out, in]; T5X kernels are [in, out].
  np.testing.assert_array_equal(
      layer['encoder_decoder_attention']['key']['kernel'],
      hf['decoder.block.2.layer.1.EncDecAttention.k.weight'].T)
  np.testing.assert_array_equal(
      layer['mlp']['wi_1']['kernel'],
      hf['decoder.block.2.layer.2.DenseReluDense.wi_1.weight'].T)
  np.testing.assert_array_equal(
      layer['pre_mlp_layer_norm']['scale'],
      hf['decoder.block.2.layer.2.layer_norm.weight'])
  np.testing.assert_array_equal(
      v11.params['encoder']['relpos_bias']['rel_embedding'],
      hf['encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'
        ].T)
  np.testing.assert_array_equal(v11.params['decoder']['logits_dense']['kernel'],
                                hf['lm_head.weight'].T)
  original_hf = load_file(os.path.join(_fixture(LAYOUTS[1]), WEIGHTS))
  np.testing.assert_array_equal(
      original.params['encoder']['layers_1']['mlp']['wi']['kernel'],
      original_hf['encoder.block.1.layer.1.DenseReluDense.wi.weight'].T)


@pytest.mark.slow  # Fast-suite time: four gammas on the real checkpoint.
def test_greedy_speculative_equals_baseline():
  target = _load(LAYOUTS[0])
  draft = truncated_model(target, num_decoder_layers=1)
  enc = np.concatenate([_golden(LAYOUTS[0])['encoder_input_tokens'],
                        random_inputs(4, 12, 384, seed=0)])
  baseline = sd.generate(target, enc, max_decode_len=16)
  for gamma in (1, 2, 3, 5):
    fast = sd.generate(target, enc, max_decode_len=16, draft=draft,
                       gamma=gamma)
    np.testing.assert_array_equal(np.asarray(fast.tokens),
                                  np.asarray(baseline.tokens),
                                  err_msg=f'gamma={gamma}')
    np.testing.assert_array_equal(np.asarray(fast.lengths),
                                  np.asarray(baseline.lengths))


def test_sharded_checkpoint_loads_the_same(tmp_path):
  path = _copy(tmp_path, LAYOUTS[0])
  tensors = load_file(os.path.join(path, WEIGHTS))
  os.remove(os.path.join(path, WEIGHTS))
  names = sorted(tensors)
  shards = {'model-00001-of-00002.safetensors': names[:30],
            'model-00002-of-00002.safetensors': names[30:]}
  for file, keys in shards.items():
    save_file({k: tensors[k] for k in keys}, os.path.join(path, file))
  index = {'metadata': {}, 'weight_map': {
      k: file for file, keys in shards.items() for k in keys}}
  with open(os.path.join(path, 'model.safetensors.index.json'), 'w') as f:
    json.dump(index, f)
  sharded, single = sd.load_hf_checkpoint(path), _load(LAYOUTS[0])
  for a, b in zip(jax.tree_util.tree_leaves(sharded.params),
                  jax.tree_util.tree_leaves(single.params)):
    np.testing.assert_array_equal(a, b)
  # A shard the index names must exist.
  os.remove(os.path.join(path, 'model-00002-of-00002.safetensors'))
  with pytest.raises(CheckpointError, match='model-00002-of-00002'):
    sd.load_hf_checkpoint(path)


def test_bfloat16_weights_and_activations(tmp_path):
  path = _copy(tmp_path, LAYOUTS[0])
  _edit_tensors(path, lambda t: t.update(
      {k: v.astype(jnp.bfloat16) for k, v in t.items()}))
  model = sd.load_hf_checkpoint(path)  # bf16 on disk, float32 by default
  assert model.config.dtype == 'float32'
  assert {x.dtype.name for x in jax.tree_util.tree_leaves(model.params)} == {
      'float32'}
  model = sd.load_hf_checkpoint(path, dtype='bfloat16')
  assert model.config.dtype == 'bfloat16'
  assert {x.dtype.name for x in jax.tree_util.tree_leaves(model.params)} == {
      'bfloat16'}
  with pytest.raises(ValueError, match='dtype'):
    sd.load_hf_checkpoint(path, dtype='float16')


@pytest.mark.parametrize('name,changes,factor', [
    # transformers 5 writes scale_decoder_outputs; older configs imply it by
    # tie_word_embeddings, so without it nothing changes.
    (LAYOUTS[0], dict(scale_decoder_outputs=None), 1.0),
    (LAYOUTS[1], dict(scale_decoder_outputs=None), 1.0),
    # An untied head after rescaling, and a tied head without it, become an
    # untied `logits_dense` with the factor folded in.
    (LAYOUTS[0], dict(scale_decoder_outputs=True), 32 ** -0.5),
    (LAYOUTS[1], dict(scale_decoder_outputs=False), 32 ** 0.5),
])
def test_output_scaling_and_tying(tmp_path, name, changes, factor):
  g = _golden(name)
  path = _copy(tmp_path, name)
  _edit_config(path, **changes)
  model = sd.load_hf_checkpoint(path)
  logits = model.logits(g['encoder_input_tokens'], g['decoder_input_tokens'])
  reference = _load(name).logits(g['encoder_input_tokens'],
                                 g['decoder_input_tokens'])
  np.testing.assert_allclose(logits, np.asarray(reference) * factor,
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('field,value', [
    ('model_type', 'umt5'),
    ('model_type', 'bart'),
    ('feed_forward_proj', 'gated-silu'),
    ('feed_forward_proj', 'swiglu'),
    ('layer_norm_epsilon', 1e-5),
    ('is_encoder_decoder', False),
    ('decoder_start_token_id', 2),
    ('d_model', None),
    ('num_heads', 0),
])
def test_unsupported_configs_name_the_field(tmp_path, field, value):
  path = _copy(tmp_path, LAYOUTS[0])
  _edit_config(path, **{field: value})
  with pytest.raises(ValueError, match=field) as info:
    sd.load_hf_checkpoint(path)
  assert 'config.json' in str(info.value)
  if value is not None:
    assert repr(value) in str(info.value)


def _write_config_text(path):
  with open(os.path.join(path, 'config.json'), 'w') as f:
    f.write('{"d_model": 3')  # cut off mid-object


def _truncate(path):
  with open(os.path.join(path, WEIGHTS), 'rb') as f:
    data = f.read()
  with open(os.path.join(path, WEIGHTS), 'wb') as f:
    f.write(data[:len(data) // 2])


def _drop(name):
  return lambda path: _edit_tensors(path, lambda t: t.pop(name))


def _set(name, value_of):
  return lambda path: _edit_tensors(
      path, lambda t: t.update({name: value_of(t)}))


BLOCK1_BIAS = ('encoder.block.1.layer.0.SelfAttention.'
               'relative_attention_bias.weight')


@pytest.mark.parametrize('breakage,message', [
    (lambda p: os.remove(os.path.join(p, 'config.json')), 'config.json'),
    (_write_config_text, 'config.json'),
    (lambda p: os.remove(os.path.join(p, WEIGHTS)), WEIGHTS),
    (_truncate, WEIGHTS),
    (_drop('decoder.block.1.layer.2.DenseReluDense.wo.weight'),
     'decoder.block.1.layer.2.DenseReluDense.wo.weight'),
    (_drop('lm_head.weight'), 'lm_head.weight'),
    (_set('encoder.block.0.layer.1.DenseReluDense.wo.weight',
          lambda t: t['encoder.block.0.layer.1.DenseReluDense.wo.weight'].T),
     'encoder.block.0.layer.1.DenseReluDense.wo.weight'),
    (_set('decoder.embed_tokens.weight', lambda t: t['shared.weight'] + 1),
     'decoder.embed_tokens.weight'),
    # umT5 keeps a position bias in every block; T5X's tree has one per stack.
    (_set(BLOCK1_BIAS,
          lambda t: t[BLOCK1_BIAS.replace('block.1', 'block.0')]),
     BLOCK1_BIAS),
])
def test_bad_files_and_tensors_are_named(tmp_path, breakage, message):
  path = _copy(tmp_path, LAYOUTS[0])
  breakage(path)
  with pytest.raises(CheckpointError, match=message.replace('.', r'\.')):
    sd.load_hf_checkpoint(path)


def test_missing_folder(tmp_path):
  with pytest.raises(CheckpointError, match='no such folder'):
    sd.load_hf_checkpoint(str(tmp_path / 'absent'))
