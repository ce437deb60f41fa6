"""The memory plan's parameter bytes per device at T5-XXL's shapes."""

import jax.numpy as jnp
import pytest

from spec_decode import memory_plan
from spec_decode import device_mesh
from spec_decode import partitioning
from spec_decode.model import param_shapes
from spec_decode.model import parameter_count
from spec_decode.model import t5_config


@pytest.mark.parametrize('num_partitions', [1, 4, 8])
def test_xxl_parameter_bytes_per_device_are_a_model_share(num_partitions):
  config = t5_config('t5_1_1_xxl', dtype='bfloat16')
  mesh = device_mesh.make_mesh(num_partitions)
  plan = partitioning.Partitioning.create(mesh)
  abstract = memory_plan._abstract_params(config, plan, jnp.bfloat16)  # pylint: disable=protected-access
  per_device = memory_plan._per_device_bytes(abstract)  # pylint: disable=protected-access
  ideal = parameter_count(param_shapes(config)) * 2 / num_partitions
  # Only the layer norms (and relative biases' buckets) stay whole.
  assert per_device == pytest.approx(ideal, rel=0.01)
