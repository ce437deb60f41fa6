"""Decoding over a ('data', 'model') mesh equals decoding on one device."""

import re

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import spec_decode as sd
from spec_decode import device_mesh
from spec_decode import partitioning
from spec_decode import speculative
from spec_decode.model import init_cache
from spec_decode.model import truncated_model

from tests.conftest import random_inputs
from tests.conftest import random_model
from tests.sharded.conftest import MESH_SHAPES

MAX_LEN = 12
BATCH = 8
VOCAB = 256  # Divides every model axis size up to 8, as do heads and mlp.


def _target() -> sd.Model:
  return random_model(3, vocab_size=VOCAB, num_heads=8, head_dim=4,
                      emb_dim=32, mlp_dim=64, num_decoder_layers=3)


def _inputs(batch: int = BATCH) -> np.ndarray:
  return random_inputs(batch, 9, VOCAB, seed=5)[:batch]


def _eos_inside_horizon(model: sd.Model, tokens: np.ndarray) -> int:
  """A token the unsharded greedy output emits mid-sequence, as the EOS, so
  rows end at different points inside the horizon."""
  out = np.asarray(sd.generate(model, tokens, max_decode_len=MAX_LEN,
                               eos_id=0).tokens)
  middle = out[:, 2:MAX_LEN - 2].ravel()
  return int(np.bincount(middle[middle > 1]).argmax())


def _mesh(shape):
  return device_mesh.make_mesh(num_partitions=shape[1])


# The fast suite decodes on one mixed mesh and pads an odd batch on another;
# the slow suite adds the all-data and all-model meshes and one more padding.
FAST_SHAPES = ((4, 2),)


@pytest.mark.parametrize('shape, batch', [
    *(pytest.param(shape, BATCH, marks=() if shape in FAST_SHAPES
                   else pytest.mark.slow) for shape in MESH_SHAPES),
    pytest.param((4, 2), 7, marks=pytest.mark.slow),
    ((2, 4), 3)])  # Batches padded to the data size.
def test_greedy_equals_unsharded_for_every_row(shape, batch):
  target = _target()
  draft = truncated_model(target, 1)
  tokens = _inputs(batch)
  eos = _eos_inside_horizon(target, tokens)
  kwargs = dict(max_decode_len=MAX_LEN, eos_id=eos)
  base = sd.generate(target, tokens, **kwargs)
  spec = sd.generate(target, tokens, draft=draft, gamma=3, **kwargs)
  lengths = np.asarray(base.lengths)
  assert lengths.min() < MAX_LEN, 'no row stopped at EOS: a weak test'

  sharded = target.shard(_mesh(shape))
  sharded_base = sd.generate(sharded, tokens, **kwargs)
  sharded_spec = sd.generate(sharded, tokens, draft=draft, gamma=3, **kwargs)
  np.testing.assert_array_equal(sharded_base.tokens, base.tokens)
  np.testing.assert_array_equal(sharded_spec.tokens, spec.tokens)
  np.testing.assert_array_equal(sharded_spec.tokens, base.tokens)
  np.testing.assert_array_equal(sharded_spec.lengths, lengths)
  assert sharded_spec.tokens.shape == (batch, MAX_LEN)


@pytest.mark.parametrize('shape', [(4, 2), pytest.param((1, 8),
                                                         marks=pytest.mark.slow)])
def test_sharded_draft_option(shape):
  target = _target()
  draft = truncated_model(target, 1)
  tokens = _inputs()
  mesh = _mesh(shape)
  expected = sd.generate(target, tokens, max_decode_len=MAX_LEN, draft=draft,
                         gamma=4)
  got = sd.generate(target.shard(mesh), tokens, max_decode_len=MAX_LEN,
                    draft=draft.shard(mesh), gamma=4)
  np.testing.assert_array_equal(got.tokens, expected.tokens)


def test_parameters_are_really_split():
  mesh = _mesh((2, 4))
  sharded = _target().shard(mesh)
  params = sharded.params
  split = {
      'decoder/layers_0/mlp/wi_0/kernel': 1,      # ('embed', 'mlp')
      'decoder/layers_0/mlp/wo/kernel': 0,        # ('mlp', 'embed')
      'decoder/layers_0/self_attention/query/kernel': 1,  # joined_kv
      'decoder/logits_dense/kernel': 1,           # vocab
      'token_embedder/embedding': 0,              # vocab
      'decoder/relpos_bias/rel_embedding': 0,     # heads
  }
  for path, axis in split.items():
    leaf = params
    for name in path.split('/'):
      leaf = leaf[name]
    assert len(leaf.addressable_shards) == 8
    for shard in leaf.addressable_shards:
      expected = list(leaf.shape)
      expected[axis] //= 4
      assert list(shard.data.shape) == expected, path
  norm = params['decoder']['decoder_norm']['scale']
  assert all(s.data.shape == norm.shape for s in norm.addressable_shards)


def test_caches_split_over_data_and_model():
  mesh = _mesh((2, 4))
  plan = partitioning.Partitioning.create(mesh)
  config = _target().config

  @jax.jit
  def make():
    with partitioning.active(plan):
      return init_cache(config, BATCH, 16)

  cache = make()
  # [batch, heads, ...]: rows over 'data', heads over 'model'.
  assert cache.keys[0].sharding.spec == PartitionSpec('data', 'model')
  assert cache.values[0].sharding.spec == PartitionSpec('data', 'model')
  shard = cache.keys[0].addressable_shards[0].data
  assert shard.shape == (BATCH // 2, config.num_heads // 4, config.head_dim,
                         16)


def test_loop_gathers_no_cache_and_compiles_once():
  mesh = _mesh((2, 4))
  target = _target().shard(mesh)
  draft = truncated_model(_target(), 1).placed_like(target.partitioning)
  tokens = partitioning.shard_batch(_inputs(), target.partitioning)
  args = (target.config, draft.config, target.params, draft.params, tokens,
          jax.random.PRNGKey(0), MAX_LEN, sd.SamplingConfig(), 1, 3, 1.0,
          'token', None, target.partitioning, draft.partitioning)
  hlo = speculative._speculative_generate.lower(*args).compile().as_text()  # pylint: disable=protected-access
  config = target.config
  cache_len = MAX_LEN + 3 + 2
  # A whole (or head-gathered) cache has all heads and all positions.
  whole = re.compile(
      rf'all-gather[^\n]*\[\d+,{config.num_heads},\d+,{cache_len}\]|'
      rf'all-gather[^\n]*\[\d+,{config.num_heads},{cache_len},\d+\]')
  assert not whole.search(hlo), whole.search(hlo).group(0)

  before = speculative._speculative_generate._cache_size()  # pylint: disable=protected-access
  for seed in range(2):
    sd.generate(target, _inputs(), max_decode_len=MAX_LEN, draft=draft,
                gamma=3, rng=jax.random.PRNGKey(seed))
  assert speculative._speculative_generate._cache_size() - before <= 1  # pylint: disable=protected-access


def test_results_are_ordinary_arrays():
  sharded = _target().shard(_mesh((4, 2)))
  result = sd.generate(sharded, _inputs(7), max_decode_len=MAX_LEN)
  assert np.asarray(result.tokens).shape == (7, MAX_LEN)
  assert np.asarray(result.lengths).shape == (7,)


def test_indivisible_heads_name_the_dimension():
  config = sd.T5Config(vocab_size=VOCAB, emb_dim=24, num_heads=6, head_dim=4,
                       mlp_dim=64, num_encoder_layers=1, num_decoder_layers=1,
                       dtype='float32')
  model = sd.Model(config, sd.init_params(config, jax.random.PRNGKey(0)))
  with pytest.raises(ValueError, match=r"num_heads.*size 6.*'model' of size 4"):
    model.shard(_mesh((2, 4)))


def test_draft_on_another_mesh_is_refused():
  target = _target().shard(_mesh((2, 4)))
  draft = truncated_model(_target(), 1).shard(_mesh((4, 2)))
  with pytest.raises(ValueError, match='different mesh'):
    sd.generate(target, _inputs(), max_decode_len=4, draft=draft)
  with pytest.raises(ValueError, match='model.shard'):
    sd.generate(_target(), _inputs(), max_decode_len=4, draft=draft)


@pytest.mark.slow
@pytest.mark.parametrize('shape', [(4, 2), (1, 8)])  # Mixed; all model.
def test_temperature_one_equals_unsharded(shape):
  """Same rng, same draws: jax's partitionable threefry gives each element
  the same random bits however the array is split, and float32 logits that
  differ only by reduction order (~1e-6) do not move a Gumbel argmax here."""
  target = _target()
  draft = truncated_model(target, 1)
  tokens = _inputs()
  sharded = target.shard(_mesh(shape))
  for seed in range(3):
    kwargs = dict(max_decode_len=MAX_LEN, temperature=1.0,
                  rng=jax.random.PRNGKey(seed))
    np.testing.assert_array_equal(
        sd.generate(sharded, tokens, **kwargs).tokens,
        sd.generate(target, tokens, **kwargs).tokens)
    np.testing.assert_array_equal(
        sd.generate(sharded, tokens, draft=draft, gamma=3, **kwargs).tokens,
        sd.generate(target, tokens, draft=draft, gamma=3, **kwargs).tokens)
