"""Measured costs and their on-disk cache (gamma='auto': test_adaptive)."""

import json
import os
import subprocess
import sys

import pytest

import spec_decode as sd
from spec_decode import costs

from conftest import random_inputs
from conftest import random_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _profile(verify, c=0.05):
  return costs.CostProfile(1.0, c, tuple(verify))


def test_malformed_profiles_are_rejected():
  assert costs.CostProfile.from_json({'target_step_seconds': 1}) is None
  assert costs.CostProfile.from_json(
      {'target_step_seconds': 1, 'draft_step_seconds': -1,
       'verify_seconds': [1, 2]}) is None
  assert costs.CostProfile.from_json(
      {'target_step_seconds': 1, 'draft_step_seconds': 0.1,
       'verify_seconds': [1, float('nan')]}) is None
  good = _profile([1.0, 1.2])
  assert costs.CostProfile.from_json(good.to_json()) == good


@pytest.fixture
def pair():
  return (random_model(0, vocab_size=64, emb_dim=16, mlp_dim=32),
          random_model(1, vocab_size=64, emb_dim=8, mlp_dim=16,
                       num_decoder_layers=1))


def test_profile_is_measured_once_and_cached(tmp_path, pair, monkeypatch):
  target, draft = pair
  path = str(tmp_path / 'costs.json')
  measured = []
  real = costs.measure_profile

  def counting(*args, **kwargs):
    measured.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(costs, 'measure_profile', counting)
  first = costs.cost_profile(target, draft, 2, max_gamma=3, path=path)
  again = costs.cost_profile(target, draft, 2, max_gamma=3, path=path)
  assert first == again and len(measured) == 1
  assert first.max_gamma == 3 and first.c > 0
  # Another batch size is another entry.
  costs.cost_profile(target, draft, 3, max_gamma=3, path=path)
  assert len(measured) == 2
  assert len(costs.read_cache(path)) == 2


@pytest.mark.parametrize('content', ['{not json', '[]', '{"format": 0}',
                                     'BAD_ENTRY'])
def test_corrupt_or_stale_cache_is_measured_again(tmp_path, pair, content,
                                                  monkeypatch):
  target, draft = pair
  path = str(tmp_path / 'costs.json')
  key = costs.cache_key(target, draft, 1, 2)
  if content == 'BAD_ENTRY':
    content = json.dumps({'format': costs.CACHE_FORMAT, 'entries': {
        key: {'target_step_seconds': 'x'}}})
  with open(path, 'w') as f:
    f.write(content)
  fake = _profile([1.0, 1.1, 1.2])
  monkeypatch.setattr(costs, 'measure_profile', lambda *a, **k: fake)
  assert costs.cost_profile(target, draft, 1, max_gamma=2, path=path) == fake
  assert costs.read_cache(path)[key]['verify_seconds'] == [1.0, 1.1, 1.2]


def test_concurrent_writers_leave_a_whole_file(tmp_path):
  path = str(tmp_path / 'costs.json')
  code = ('import sys; from spec_decode import costs; '
          'p = costs.CostProfile(1.0, 0.1, (1.0, 1.2)); '
          '[costs.write_entry(sys.argv[1], sys.argv[2] + str(i), p, {}) '
          'for i in range(40)]')
  writers = [subprocess.Popen([sys.executable, '-c', code, path, name],
                              cwd=ROOT) for name in 'ab']
  reads = 0
  while any(w.poll() is None for w in writers):
    if os.path.exists(path):
      with open(path) as f:
        data = json.load(f)  # Never a torn file.
      assert data['format'] == costs.CACHE_FORMAT
      reads += 1
  assert all(w.returncode == 0 for w in writers)
  assert reads > 0
  assert not [n for n in os.listdir(tmp_path) if n.endswith('.tmp')]


def test_unknown_gamma_name_is_refused(pair):
  target, draft = pair
  with pytest.raises(ValueError, match="gamma must be a positive integer or "
                     "'auto'"):
    sd.generate(target, random_inputs(1, 4, 64, seed=0), max_decode_len=4,
                draft=draft, gamma='fast')
