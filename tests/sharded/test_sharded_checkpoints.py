"""T5X checkpoints read straight into shards, and decoded on the mesh."""

import os

import flax
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import checkpoints
from spec_decode import device_mesh
from spec_decode.model import truncated_model

from tests.conftest import golden
from tests.conftest import requires_fixtures
from tests.conftest import T5X_TINY
from tests.conftest import tiny_config

ZARR = os.path.join(T5X_TINY, 'zarr_checkpoint', 'checkpoint_1')


def _flat(tree):
  return flax.traverse_util.flatten_dict(tree, sep='/')


@requires_fixtures
def test_zarr_fixture_loads_into_a_2x4_mesh_shard_by_shard(monkeypatch):
  config = tiny_config()
  whole = _flat(sd.load_t5x_checkpoint(ZARR, config))
  reads = []
  real_read = checkpoints._read_slice  # pylint: disable=protected-access

  def counting_read(source, index, dtype, what):
    value = real_read(source, index, dtype, what)
    reads.append((what.rsplit("'", 2)[-2], value.nbytes))
    return value

  monkeypatch.setattr(checkpoints, '_read_slice', counting_read)
  mesh = device_mesh.make_mesh(num_partitions=4)
  sharded = _flat(sd.load_t5x_checkpoint(ZARR, config, mesh=mesh))
  assert sorted(sharded) == sorted(whole)
  for key, value in sharded.items():
    np.testing.assert_array_equal(np.asarray(value), whole[key])
  # Every read of a model-split leaf is one device's quarter, never the
  # whole array: no replicated full-size copy was made on the way.
  split = {'token_embedder/embedding', 'decoder/logits_dense/kernel',
           'decoder/layers_0/mlp/wi_0/kernel',
           'encoder/layers_1/attention/out/kernel'}
  for key in split:
    sizes = [size for name, size in reads if name == key]
    assert sizes, key
    assert max(sizes) == whole[key].nbytes // 4, key
    for shard in sharded[key].addressable_shards:
      assert shard.data.nbytes == whole[key].nbytes // 4
  embedding = [size for name, size in reads
               if name == 'token_embedder/embedding']
  # 8 devices, each holding a quarter (the 2 data replicas share reads or
  # repeat them; neither copies the whole table).
  assert sum(embedding) <= 2 * whole['token_embedder/embedding'].nbytes


@requires_fixtures
@pytest.mark.parametrize('shape', [  # One mesh fast, the others slow.
    pytest.param((8, 1), marks=pytest.mark.slow),
    pytest.param((4, 2), marks=pytest.mark.slow), (2, 4)])
def test_fixture_decodes_on_the_mesh_as_on_one_device(shape):
  config = tiny_config()
  data = golden('t5x_tiny')
  tokens = np.asarray(data['encoder_input_tokens'])
  tokens = np.concatenate([tokens, tokens[::-1], tokens[:2]])  # batch 8
  model = sd.Model(config, sd.load_t5x_checkpoint(ZARR, config))
  draft = truncated_model(model, 1)
  mesh = device_mesh.make_mesh(num_partitions=shape[1])
  sharded = sd.Model(config, sd.load_t5x_checkpoint(ZARR, config, mesh=mesh))
  sharded = sharded.shard(mesh)  # Already placed: shard() keeps it.
  for kwargs in (dict(), dict(draft=draft, gamma=3)):
    expected = sd.generate(model, tokens, max_decode_len=16, **kwargs)
    got = sd.generate(sharded, tokens, max_decode_len=16, **kwargs)
    np.testing.assert_array_equal(got.tokens, expected.tokens)


@requires_fixtures
def test_fixture_on_8_way_model_parallelism_names_the_parameter():
  config = tiny_config()  # joined_kv = 4 heads x 3 = 12: not 8-divisible.
  mesh = device_mesh.make_mesh(num_partitions=8)
  with pytest.raises(ValueError, match=r"num_heads.*size 4.*'model' of size 8"):
    sd.load_t5x_checkpoint(ZARR, config, mesh=mesh)


@requires_fixtures
def test_mesh_without_config_is_refused():
  mesh = device_mesh.make_mesh(num_partitions=2)
  with pytest.raises(ValueError, match='mesh needs config'):
    sd.load_t5x_checkpoint(ZARR, mesh=mesh)


@requires_fixtures
def test_gin_mesh_spec_loads_the_target_into_shards():
  from spec_decode import specs  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  target_spec = specs.ModelSpec('tiny', config=config, checkpoint=ZARR,
                                dtype='float32')
  target, draft = specs.MeshSpec(num_partitions=4).load(target_spec,
                                                        target_spec)
  assert dict(target.partitioning.mesh.shape) == {'data': 2, 'model': 4}
  assert draft.partitioning is None  # Replicated by generate.
  wo = target.params['decoder']['layers_0']['mlp']['wo']['kernel']
  assert wo.addressable_shards[0].data.shape == (16 // 4, 8)
  tokens = np.asarray(golden('t5x_tiny')['encoder_input_tokens'])
  np.testing.assert_array_equal(
      sd.generate(target, tokens, max_decode_len=8, draft=draft,
                  gamma=2).tokens,
      sd.generate(sd.Model(config, sd.load_t5x_checkpoint(ZARR, config)),
                  tokens, max_decode_len=8).tokens)
