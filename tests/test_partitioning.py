"""Logical axis rules and their errors, placement; the 8-device suite.

Decoding on a mesh is checked in tests/sharded, which needs 8 host devices
fixed before JAX starts, so the two tests at the end run it in a fresh
process (fast part in the default run, slow part with -m slow).
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec

from spec_decode import device_mesh
from spec_decode import partitioning

from conftest import random_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plan(rules=None) -> partitioning.Partitioning:
  return partitioning.Partitioning.create(device_mesh.make_mesh(1), rules)


def test_standard_rules_follow_t5x():
  plan = _plan()
  assert plan.spec(('batch', 'length', 'embed')) == PartitionSpec(
      'data', None, None)
  assert plan.spec(('embed', 'mlp')) == PartitionSpec(None, 'model')
  assert plan.spec(('vocab', 'embed')) == PartitionSpec('model', None)
  assert plan.spec(('embed', 'joined_kv')) == PartitionSpec(None, 'model')
  # One mesh axis splits one dimension: heads takes 'model', kv stays whole.
  assert plan.spec(('batch', 'heads', 'kv', 'length')) == PartitionSpec(
      'data', 'model', None, None)


def test_rules_override_like_t5x():
  plan = _plan([('batch', 'data'), ('mlp', None), ('heads', 'model')])
  assert plan.spec(('embed', 'mlp')) == PartitionSpec(None, None)
  assert plan.spec(('heads', 'relpos_buckets')) == PartitionSpec('model',
                                                                  None)


def test_data_parallel_rules_replicate_over_model():
  rules = dict(partitioning.data_parallel_rules())
  assert rules['batch'] == 'data'
  assert 'model' not in rules.values()


@pytest.mark.parametrize('rules, match', [
    ([('vocabulary', 'model')], "unknown logical axis 'vocabulary'"),
    ([('vocab', 'tensor')], "mesh axis 'tensor'"),
    ([('vocab',)], r'logical_axis_rules\[0\] must be a pair'),
])
def test_bad_rules_are_named(rules, match):
  with pytest.raises(ValueError, match=match):
    partitioning.check_rules(rules)


def test_mesh_without_t5x_axes_is_refused():
  mesh = Mesh(np.asarray(jax.devices()[:1]), ('replica',))
  with pytest.raises(ValueError, match=r"exactly the axes \('data', 'model'\)"):
    random_model().shard(mesh)
  with pytest.raises(TypeError, match='mesh must be a jax.sharding.Mesh'):
    random_model().shard('data')


@pytest.mark.slow  # Fast-suite time; the 8-device suite covers real meshes.
def test_single_device_mesh_decodes_as_without_one():
  import spec_decode as sd  # pylint: disable=g-import-not-at-top
  model = random_model()
  tokens = np.array([[5, 6, 7, 0], [9, 3, 0, 0], [4, 4, 4, 4]], np.int32)
  sharded = model.shard(device_mesh.make_mesh(1, jax.devices()[:1]))
  for kwargs in (dict(), dict(draft=model, gamma=2)):
    np.testing.assert_array_equal(
        sd.generate(sharded, tokens, max_decode_len=6, **kwargs).tokens,
        sd.generate(model, tokens, max_decode_len=6, **kwargs).tokens)


def test_repeat_rows_to_multiple_repeats_the_last_row():
  tokens = np.arange(6, dtype=np.int32).reshape(3, 2)
  padded = partitioning.repeat_rows_to_multiple(tokens, 4)
  assert padded.shape == (4, 2)
  np.testing.assert_array_equal(padded[3], tokens[2])
  assert partitioning.repeat_rows_to_multiple(tokens, 3) is tokens


def _sharded_suite(marker: str) -> None:
  env = dict(os.environ)
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') +
                      ' --xla_force_host_platform_device_count=8').strip()
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-m',
       marker, 'tests/sharded'], cwd=ROOT, env=env, capture_output=True,
      text=True, check=False)
  assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]


def test_sharded_suite_on_8_host_devices():
  """Greedy identity over 4 meshes, real splits, shard-by-shard loading."""
  _sharded_suite('not slow')


@pytest.mark.slow
def test_sharded_suite_on_8_host_devices_slow():
  """Temperature 1 on every mesh."""
  _sharded_suite('slow')
