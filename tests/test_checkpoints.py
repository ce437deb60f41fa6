"""T5X checkpoints: both T5X layouts load; ours round-trip; bad ones fail."""

import os
import shutil

import flax
import jax
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import checkpoints
from spec_decode.checkpoints import CheckpointError

from conftest import T5X_TINY
from conftest import T5X_TINY_PERTURBED
from conftest import random_model
from conftest import requires_fixtures
from conftest import tiny_config


def _leaves(params):
  return flax.traverse_util.flatten_dict(params)


def _assert_same(a, b):
  a, b = _leaves(a), _leaves(b)
  assert sorted(a) == sorted(b)
  for key in a:
    np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]),
                                  err_msg='/'.join(key))


@requires_fixtures
def test_msgpack_and_zarr_layouts_hold_the_same_parameters():
  config = tiny_config()
  inline = sd.load_t5x_checkpoint(os.path.join(T5X_TINY, 'checkpoint_0'),
                                  config)
  zarr = sd.load_t5x_checkpoint(
      os.path.join(T5X_TINY, 'zarr_checkpoint', 'checkpoint_1'), config)
  _assert_same(inline, zarr)
  # A model folder resolves to its latest checkpoint_<step>.
  latest = sd.load_t5x_checkpoint(os.path.join(T5X_TINY, 'zarr_checkpoint'))
  _assert_same(inline, latest)
  # The `checkpoint` file itself works too.
  direct = sd.load_t5x_checkpoint(os.path.join(
      T5X_TINY_PERTURBED, 'checkpoint_1', 'checkpoint'), config)
  assert direct['decoder']['decoder_norm']['scale'].min() > 0.5


@requires_fixtures
def test_cast_on_read():
  params = sd.load_t5x_checkpoint(
      os.path.join(T5X_TINY_PERTURBED, 'checkpoint_1'), dtype='bfloat16')
  assert {np.asarray(x).dtype.name for x in jax.tree_util.tree_leaves(
      params)} == {'bfloat16'}


@pytest.mark.parametrize('inline', [False, True])
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_save_load_round_trip(tmp_path, inline, dtype):
  model = random_model(0)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype),
                                  model.params)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_7'), params,
                                step=7, inline=inline)
  loaded = sd.load_t5x_checkpoint(path, model.config)
  _assert_same(params, loaded)
  _, step = sd.checkpoints.checkpoint_info(path)
  assert step == 7
  # Saving again over it replaces it in one piece.
  sd.save_t5x_checkpoint(path, params, step=8, inline=inline)
  assert sd.checkpoints.checkpoint_info(str(tmp_path))[1] == 8
  assert sorted(os.listdir(tmp_path)) == ['checkpoint_7']


def test_zarr_layout_is_t5x_s(tmp_path):
  model = random_model(0)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_0'), model.params)
  names = set(os.listdir(path))
  assert 'checkpoint' in names
  assert 'target.decoder.logits_dense.kernel' in names
  state = flax.serialization.msgpack_restore(
      open(os.path.join(path, 'checkpoint'), 'rb').read())
  assert state['version'] == 3
  spec = state['optimizer']['target']['decoder']['logits_dense']['kernel']
  assert spec['driver'] == 'zarr'
  assert spec['kvstore'] == {'driver': 'file',
                             'path': 'target.decoder.logits_dense.kernel/'}


def test_older_layout_without_optimizer_wrapper(tmp_path):
  model = random_model(0)
  folder = tmp_path / 'checkpoint_3'
  folder.mkdir()
  state = {'target': jax.tree_util.tree_map(np.asarray, model.params),
           'state': {'step': np.int32(3)}}
  (folder / 'checkpoint').write_bytes(
      flax.serialization.msgpack_serialize(state))
  _assert_same(model.params, sd.load_t5x_checkpoint(str(folder),
                                                    model.config))


def test_interrupted_save_leaves_no_checkpoint(tmp_path):
  params = {'token_embedder': {'embedding': np.zeros((4, 2), np.float32)},
            'broken': {'kernel': object()}}
  with pytest.raises(Exception):
    sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_1'), params)
  assert os.listdir(tmp_path) == []


def test_missing_path_names_it(tmp_path):
  missing = str(tmp_path / 'nope')
  with pytest.raises(FileNotFoundError, match='nope.*does not exist'):
    sd.load_t5x_checkpoint(missing)
  with pytest.raises(FileNotFoundError, match='holds neither'):
    sd.load_t5x_checkpoint(str(tmp_path))


def test_wrong_shapes_name_the_parameter(tmp_path):
  model = random_model(0)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_0'), model.params)
  wider = model.config.replace(emb_dim=64)
  with pytest.raises(ValueError, match='has shape .*config expects'):
    sd.load_t5x_checkpoint(path, wider)
  deeper = model.config.replace(num_encoder_layers=3)
  with pytest.raises(ValueError, match="missing parameter 'encoder/layers_2"):
    sd.load_t5x_checkpoint(path, deeper)


def test_truncated_msgpack_names_the_file(tmp_path):
  model = random_model(0)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_0'), model.params,
                                inline=True)
  file = os.path.join(path, 'checkpoint')
  data = open(file, 'rb').read()
  open(file, 'wb').write(data[:len(data) // 2])
  with pytest.raises(CheckpointError, match='checkpoint_0/checkpoint.*'
                     'truncated'):
    sd.load_t5x_checkpoint(path)


def test_missing_zarr_chunk_is_an_error_not_zeros(tmp_path):
  model = random_model(0)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_0'), model.params)
  array = os.path.join(path, 'target.decoder.logits_dense.kernel')
  for name in os.listdir(array):
    if not name.startswith('.'):
      os.remove(os.path.join(array, name))
  with pytest.raises(CheckpointError,
                     match="'decoder/logits_dense/kernel'.*incomplete"):
    sd.load_t5x_checkpoint(path)


def test_corrupt_zarr_chunk_names_the_parameter(tmp_path):
  model = random_model(0)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_0'), model.params)
  array = os.path.join(path, 'target.encoder.encoder_norm.scale')
  chunk = [n for n in os.listdir(array) if not n.startswith('.')][0]
  open(os.path.join(array, chunk), 'wb').write(b'not gzip')
  with pytest.raises(CheckpointError, match="'encoder/encoder_norm/scale'"):
    sd.load_t5x_checkpoint(path)


def test_missing_zarr_folder_names_the_parameter(tmp_path):
  model = random_model(0)
  path = sd.save_t5x_checkpoint(str(tmp_path / 'checkpoint_0'), model.params)
  shutil.rmtree(os.path.join(path, 'target.encoder.encoder_norm.scale'))
  with pytest.raises(CheckpointError, match="'encoder/encoder_norm/scale'"):
    sd.load_t5x_checkpoint(path)


def test_not_a_checkpoint(tmp_path):
  folder = tmp_path / 'checkpoint_0'
  folder.mkdir()
  (folder / 'checkpoint').write_bytes(
      flax.serialization.msgpack_serialize({'hello': np.zeros(2)}))
  with pytest.raises(CheckpointError, match='no parameters found'):
    sd.load_t5x_checkpoint(str(folder))


def test_checkpoint_step_reads_only_checkpoint_folders():
  assert checkpoints.checkpoint_step('checkpoint_1200') == 1200
  for name in ('checkpoint_', 'checkpoint_12.tmp-1', 'ckpt_3', 'checkpoint'):
    assert checkpoints.checkpoint_step(name) is None
