"""Process 0's figures on every process (the two-process decode itself is
tests/test_device_mesh.py::test_two_processes_decode_over_one_mesh)."""

import dataclasses

import numpy as np

from spec_decode import costs
from spec_decode import multihost_agreement


def _profile(scale):
  return costs.CostProfile(
      0.002 * scale, 0.0002 * scale, (0.002 * scale, 0.0021 * scale),
      (0, 1), (0.003 * scale, 0.004 * scale), (0.0025 * scale, 0.0035),
      plain_iteration_seconds=0.0031, call_seconds=0.01 * scale)


def test_one_process_keeps_its_own():
  profile = _profile(1.0)
  assert multihost_agreement.process_zero_profile(profile) is profile
  assert not multihost_agreement.is_multihost()
  assert multihost_agreement.process_zero_flag(True)
  np.testing.assert_array_equal(
      multihost_agreement.process_zero_values([0.5, 2.0]), [0.5, 2.0])


def test_a_profile_is_sent_as_process_zeros(monkeypatch):
  # Another process's view: what arrives is process 0's profile.
  sent = _profile(3.0)

  def from_process_zero(values):
    flat = np.concatenate([
        np.atleast_1d(np.asarray(getattr(sent, field.name), np.float32))
        for field in dataclasses.fields(sent)])
    assert flat.shape == np.shape(values)  # The same layout on every process.
    return flat

  monkeypatch.setattr(multihost_agreement, 'is_multihost', lambda: True)
  monkeypatch.setattr(multihost_agreement.multihost_utils,
                      'broadcast_one_to_all', from_process_zero)
  got = multihost_agreement.process_zero_profile(_profile(1.0))
  assert got.iteration_counts == (0, 1)
  assert all(isinstance(count, int) for count in got.iteration_counts)
  assert isinstance(got.verify_seconds, tuple)
  for name in ('target_step_seconds', 'call_seconds', 'verify_seconds',
               'greedy_iteration_seconds'):
    np.testing.assert_allclose(getattr(got, name), getattr(sent, name),
                               rtol=1e-6)
