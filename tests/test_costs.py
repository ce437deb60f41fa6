"""Measured costs, their on-disk cache, and gamma='auto'."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import spec_decode as sd
from spec_decode import analysis
from spec_decode import costs
from spec_decode import generation

from conftest import random_inputs
from conftest import random_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _profile(verify, c=0.05):
  return costs.CostProfile(1.0, c, tuple(verify))


def test_choose_gamma_maximises_the_prediction_or_picks_baseline():
  cheap = _profile([1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5])
  gamma, predicted = costs.choose_gamma(0.8, cheap, [40])
  expected = [analysis.walltime_improvement_at_lengths(
      0.8, g, 0.05, [40], cheap.verify_cost(g)) for g in range(1, 8)]
  assert gamma == 1 + int(np.argmax(expected))
  assert predicted == pytest.approx(max(expected))
  # Scoring two tokens costs two steps: no gamma can pay.
  dear = _profile([1.0, 2.0, 3.0, 4.0, 5.0])
  assert costs.choose_gamma(0.8, dear, [40]) == (0, 1.0)
  # A poor draft does not pay even on cheap verification.
  assert costs.choose_gamma(0.05, cheap, [40]) == (0, 1.0)


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


def test_auto_gamma_is_exact_and_says_what_it_chose(pair, monkeypatch,
                                                    tmp_path):
  target, draft = pair
  monkeypatch.setenv(costs.CACHE_DIR_ENV, str(tmp_path))
  generation.reset_auto_estimates()
  inputs = random_inputs(3, 6, 64, seed=2)
  baseline = sd.generate(target, inputs, max_decode_len=10)
  monkeypatch.setattr(costs, 'cost_profile', lambda *a, **k: _profile(
      [1.0, 1.0, 1.0, 1.0, 1.0], c=0.01))
  first = sd.generate(target, inputs, max_decode_len=10, draft=draft,
                      gamma='auto')
  assert first.gamma == generation.CALIBRATION_GAMMA
  assert first.predicted_speedup is None
  alpha, lengths = generation.auto_estimate(target, draft)
  assert 0.0 <= alpha <= 1.0 and len(lengths) == 3
  second = sd.generate(target, inputs, max_decode_len=10, draft=draft,
                       gamma='auto')
  for result in (first, second):
    np.testing.assert_array_equal(np.asarray(result.tokens),
                                  np.asarray(baseline.tokens))
  if second.gamma:
    assert second.predicted_speedup >= costs.MIN_PREDICTED_SPEEDUP
  # Where scoring more tokens costs proportionally more, baseline is chosen.
  monkeypatch.setattr(costs, 'cost_profile', lambda *a, **k: _profile(
      [1.0, 2.0, 3.0, 4.0, 5.0], c=0.5))
  third = sd.generate(target, inputs, max_decode_len=10, draft=draft,
                      gamma='auto')
  assert (third.gamma, third.predicted_speedup) == (0, 1.0)
  np.testing.assert_array_equal(np.asarray(third.tokens),
                                np.asarray(baseline.tokens))
  # After REEXPLORE_AFTER baseline choices in a row, one call speculates
  # at the calibration gamma again (fresh evidence), then the costs rule.
  streak = 1 if second.gamma else 2  # Baseline calls so far in a row.
  chosen = [sd.generate(target, inputs, max_decode_len=10, draft=draft,
                        gamma='auto')
            for _ in range(generation.REEXPLORE_AFTER - streak + 1)]
  assert [r.gamma for r in chosen] == (
      [0] * (generation.REEXPLORE_AFTER - streak)
      + [generation.CALIBRATION_GAMMA])
  assert chosen[-1].predicted_speedup is None
  np.testing.assert_array_equal(np.asarray(chosen[-1].tokens),
                                np.asarray(baseline.tokens))
  assert sd.generate(target, inputs, max_decode_len=10, draft=draft,
                     gamma='auto').gamma == 0


def test_unknown_gamma_name_is_refused(pair):
  target, draft = pair
  with pytest.raises(ValueError, match="gamma must be a positive integer or "
                     "'auto'"):
    sd.generate(target, random_inputs(1, 4, 64, seed=0), max_decode_len=4,
                draft=draft, gamma='fast')
