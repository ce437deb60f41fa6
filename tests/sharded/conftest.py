"""The sharded suite runs on 8 host-platform CPU devices.

JAX fixes its device count when it starts, so this folder runs in its own
process: `tests/test_partitioning.py` starts it with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (CI runs it that way
through the README's test command). To run it by hand:

  XLA_FLAGS=--xla_force_host_platform_device_count=8 \\
      python -m pytest -q tests/sharded
"""

import jax
import pytest

MESH_SHAPES = ((8, 1), (4, 2), (2, 4), (1, 8))


def pytest_sessionstart(session):
  del session
  if jax.device_count() < 8:
    pytest.exit('tests/sharded needs 8 devices: set XLA_FLAGS='
                '--xla_force_host_platform_device_count=8 before Python '
                'starts.', returncode=4)
