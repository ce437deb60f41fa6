"""The ('data', 'model') mesh, 'auto' model-parallel size, multi-host runs."""

import os
import socket
import subprocess
import sys

import jax
import pytest

from spec_decode import device_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_make_mesh_has_t5x_axes():
  mesh = device_mesh.make_mesh()
  assert mesh.axis_names == ('data', 'model')
  assert mesh.shape['model'] == 1
  assert mesh.shape['data'] == jax.device_count()


@pytest.mark.parametrize('bad', [0, -1, 2.0, True])
def test_make_mesh_rejects_bad_num_partitions(bad):
  if bad == 2.0 or bad is True:
    match = 'num_partitions must be a positive integer'
  else:
    match = 'num_partitions'
  with pytest.raises(ValueError, match=match):
    device_mesh.make_mesh(bad)


def test_make_mesh_needs_a_divisor_of_the_device_count():
  with pytest.raises(ValueError, match=r'must divide the number of devices'):
    device_mesh.make_mesh(jax.device_count() + 1)


class _FakeDevice:
  """A device that reports a memory limit, as GPUs and TPUs do."""

  def __init__(self, bytes_limit):
    self._bytes_limit = bytes_limit

  def memory_stats(self):
    return {'bytes_limit': self._bytes_limit}


@pytest.mark.parametrize('param_gb, expected', [
    (1, 1), (10, 2), (20, 4), (40, 8), (400, 8)])
def test_choose_num_partitions_takes_the_smallest_that_fits(param_gb,
                                                            expected):
  # 16 GB devices, parameters may take 60%: 9.6 GB per device.
  devices = [_FakeDevice(16e9)] * 8
  assert device_mesh.choose_num_partitions(
      int(param_gb * 1e9), num_heads=64, devices=devices) == expected


def test_choose_num_partitions_stops_at_what_divides_the_heads():
  devices = [_FakeDevice(16e9)] * 8
  assert device_mesh.choose_num_partitions(
      int(40e9), num_heads=6, devices=devices) == 2


def test_choose_num_partitions_is_1_without_a_memory_limit():
  assert device_mesh.choose_num_partitions(int(1e12), num_heads=64) == 1


@pytest.mark.slow
def test_two_processes_decode_over_one_mesh():
  """The multi-host path (TPU VM slices): rows fed per process, results
  gathered on every process, equal to decoding on one device."""
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = s.getsockname()[1]
  worker = os.path.join(ROOT, 'tests', 'sharded', 'multiprocess_worker.py')
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  processes = [subprocess.Popen(
      [sys.executable, worker, str(port), str(index)], cwd=ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for index in range(2)]
  outputs = [p.communicate(timeout=600)[0] for p in processes]
  for index, (process, output) in enumerate(zip(processes, outputs)):
    assert process.returncode == 0, output[-4000:]
    assert f'OK {index}' in output, output[-4000:]
