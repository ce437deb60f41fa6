"""Which devices decode: the ('data', 'model') mesh and the processes behind it.

`partitioning` says where each logical axis goes on a mesh; this module
builds the mesh itself (T5X's `num_partitions`, TPU topology when there is
one), picks a model-parallel size that fits a device's memory, and joins the
processes of a multi-host slice.
"""

from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from spec_decode.partitioning import MESH_AXES


def make_mesh(num_partitions: int = 1,
              devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A ('data', 'model') mesh, as T5X's partitioner builds.

  Args:
    num_partitions: Model-parallel size (T5X's `num_partitions`): the size
      of 'model'; 'data' takes the remaining devices.
    devices: Devices to use; default every device of every process
      (`jax.devices()`), so the mesh is global on a multi-host slice.

  Returns:
    A `jax.sharding.Mesh` of shape (len(devices) // num_partitions,
    num_partitions).

  Raises:
    ValueError: num_partitions < 1 or not dividing the number of devices.
  """
  devices = list(jax.devices() if devices is None else devices)
  if (isinstance(num_partitions, bool) or not isinstance(
      num_partitions, (int, np.integer)) or num_partitions < 1):
    raise ValueError(f'num_partitions must be a positive integer, got '
                     f'{num_partitions!r}.')
  if not devices or len(devices) % num_partitions:
    raise ValueError(
        f'num_partitions={num_partitions} must divide the number of devices '
        f'({len(devices)}).')
  shape = (len(devices) // num_partitions, num_partitions)
  try:
    # Follows the physical topology (ICI rings) on TPU slices.
    grid = mesh_utils.create_device_mesh(
        shape, devices=devices, allow_split_physical_axes=True)
  except Exception:  # pylint: disable=broad-except
    # Host-platform CPU devices and other topologies without a layout.
    grid = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(grid, MESH_AXES)


def choose_num_partitions(param_bytes: int, num_heads: int,
                          devices: Optional[Sequence[Any]] = None,
                          memory_fraction: float = 0.6) -> int:
  """The smallest model-parallel size whose parameter shard fits a device.

  T5X users pick `num_partitions` per chip by hand; 'auto' in the gin
  configs picks the smallest power of two that divides the device count and
  the heads and leaves the parameters at most `memory_fraction` of one
  device's memory (the rest is caches and workspace; `scripts/
  plan_memory.py` gives the exact figures).

  Args:
    param_bytes: The target's parameter bytes.
    num_heads: Its heads (the caches split them).
    devices: Default `jax.devices()`.
    memory_fraction: Share of a device's memory the parameters may take.

  Returns:
    num_partitions; 1 where devices report no memory limit (CPUs).
  """
  devices = list(jax.devices() if devices is None else devices)
  stats = devices[0].memory_stats() if hasattr(devices[0],
                                                'memory_stats') else None
  limit = (stats or {}).get('bytes_limit')
  if not limit:
    return 1
  size = 1
  while size < len(devices):
    if param_bytes / size <= memory_fraction * limit:
      return size
    if len(devices) % (2 * size) or num_heads % (2 * size):
      break
    size *= 2
  return size


def initialize_multiprocess(coordinator_address: Optional[str] = None,
                            num_processes: Optional[int] = None,
                            process_id: Optional[int] = None) -> int:
  """Joins this process to the others of a multi-host slice.

  Call it before anything touches a device. On TPU VMs the arguments are
  found from the environment (leave them None); elsewhere (several CPU
  hosts, a test) give all three. CPU collectives go through gloo.

  Returns:
    This process's index (0 prints and writes).
  """
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address, num_processes, process_id)
  return jax.process_index()
