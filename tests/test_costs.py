"""Measured costs and their on-disk cache (gamma='auto': test_adaptive)."""

import json
import os
import subprocess
import sys

import pytest

import spec_decode as sd
from spec_decode import cost_cache
from spec_decode import costs

from conftest import cost_profile_from_curve
from conftest import random_inputs
from conftest import random_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _profile(verify, c=0.05):
  return cost_profile_from_curve(verify, c)


def test_malformed_profiles_are_rejected():
  good = _profile([1.0, 1.2]).to_json()
  assert costs.CostProfile.from_json({'target_step_seconds': 1}) is None
  assert costs.CostProfile.from_json({**good, 'draft_step_seconds': -1}) is None
  assert costs.CostProfile.from_json(
      {**good, 'verify_seconds': [1, float('nan')]}) is None
  assert costs.CostProfile.from_json(
      {**good, 'iteration_counts': [1, 3]}) is None
  # An entry from before whole iterations were timed is stale.
  stale = dict(good)
  del stale['iteration_seconds']
  assert costs.CostProfile.from_json(stale) is None
  assert costs.CostProfile.from_json(
      {**good, 'greedy_iteration_seconds': [1.0]}) is None
  # An iteration timed below half its own target call is a failed
  # measurement, not a cheap iteration.
  assert costs.CostProfile.from_json(
      {**good, 'iteration_seconds': [1.0, 1e-9]}) is None
  assert costs.CostProfile.from_json(
      {**good, 'greedy_iteration_seconds': [1e-9, 1.3]}) is None
  # So is one from before plain steps and one-off costs were timed.
  for name in ('plain_iteration_seconds', 'call_seconds',
               'call_extra_seconds'):
    older = dict(good)
    del older[name]
    assert costs.CostProfile.from_json(older) is None
  assert costs.CostProfile.from_json({**good, 'call_seconds': 0.0}) is None
  assert costs.CostProfile.from_json(
      {**good, 'call_extra_seconds': -1e-3}) is None
  assert costs.CostProfile.from_json(
      {**good, 'call_extra_seconds': 0.0}) == _profile([1.0, 1.2])
  assert costs.CostProfile.from_json(good) == _profile([1.0, 1.2])


def test_iteration_cost_is_timed_at_the_next_measured_count():
  profile = costs.CostProfile(0.01, 0.001, (0.01, 0.011, 0.012, 0.013),
                              (0, 1, 3), (0.0125, 0.015, 0.02),
                              (0.01, 0.011, 0.014))
  assert profile.iteration_cost(0) == 1.0
  assert profile.iteration_cost(1) == pytest.approx(0.015 / 0.0125)
  assert profile.iteration_cost(2) == profile.iteration_cost(3) == (
      pytest.approx(0.02 / 0.0125))
  # Greedy iterations are priced against greedy baseline steps.
  assert profile.iteration_cost(0, greedy=True) == 1.0
  assert profile.iteration_cost(3, greedy=True) == pytest.approx(1.4)


def test_one_off_costs_and_plain_steps_are_in_baseline_steps():
  profile = costs.CostProfile(0.01, 0.001, (0.01, 0.011), (0, 1),
                              (0.0125, 0.015), (0.01, 0.011),
                              plain_iteration_seconds=0.0135,
                              greedy_plain_iteration_seconds=0.0095,
                              call_seconds=0.05, call_extra_seconds=0.01)
  assert profile.plain_cost() == pytest.approx(0.0135 / 0.0125)
  # The speculative loop does all a baseline step does: a plain step timed
  # below one is noise.
  assert profile.plain_cost(greedy=True) == 1.0
  assert profile.call_cost() == pytest.approx(4.0)
  assert profile.call_cost(greedy=True) == pytest.approx(5.0)
  assert profile.call_extra_cost(greedy=True) == pytest.approx(1.0)


@pytest.fixture
def pair():
  return (random_model(0, vocab_size=64, emb_dim=16, mlp_dim=32),
          random_model(1, vocab_size=64, emb_dim=8, mlp_dim=16,
                       num_decoder_layers=1))


def test_profile_is_measured_once_and_cached(tmp_path, pair, monkeypatch):
  target, draft = pair
  path = str(tmp_path / 'costs.json')
  measured = []

  def counting(*args, **kwargs):
    measured.append(_profile([1.0, 1.2]))
    return measured[-1]

  monkeypatch.setattr(costs, 'measure_profile', counting)
  first = costs.cost_profile(target, draft, 2, max_gamma=1, path=path)
  again = costs.cost_profile(target, draft, 2, max_gamma=1, path=path)
  assert first == again and len(measured) == 1
  # A fresh process reads it back from the file.
  costs._LOADED.clear()  # pylint: disable=protected-access
  assert costs.cost_profile(target, draft, 2, max_gamma=1, path=path) == first
  assert len(measured) == 1
  # Another batch size is another entry.
  costs.cost_profile(target, draft, 3, max_gamma=1, path=path)
  assert len(measured) == 2
  assert len(costs.read_cache(path)) == 2


# Slow: it compiles gamma='auto''s program at two lengths and two samplings.
@pytest.mark.slow
def test_a_measured_profile_holds_what_the_rule_needs(pair):
  target, draft = pair
  # max_gamma 1: the fewest programs to compile (target calls of 1 and 2
  # tokens, iterations proposing 0 and 1); few timed runs, since only the
  # profile's form is checked.
  profile = costs.measure_profile(target, draft, 2, max_gamma=1, repeats=2,
                                  steps=3)
  assert profile.max_gamma == 1 and profile.c > 0
  assert profile.iteration_counts == (0, 1)
  # Every iteration costs at least its own target call; the profile
  # reads back as it was written.
  for timed in (profile.iteration_seconds, profile.greedy_iteration_seconds):
    assert all(seconds >= profile.verify_seconds[count]
               for count, seconds in zip(profile.iteration_counts, timed))
  assert costs.CostProfile.from_json(profile.to_json()) == profile


@pytest.mark.parametrize('content', ['{not json', '[]', '{"format": 0}',
                                     'BAD_ENTRY'])
def test_corrupt_or_stale_cache_is_measured_again(tmp_path, pair, content,
                                                  monkeypatch):
  target, draft = pair
  path = str(tmp_path / 'costs.json')
  key = costs.cache_key(target, draft, 1, 2)
  if content == 'BAD_ENTRY':
    content = json.dumps({'format': cost_cache.CACHE_FORMAT, 'entries': {
        key: {'target_step_seconds': 'x'}}})
  with open(path, 'w') as f:
    f.write(content)
  fake = _profile([1.0, 1.1, 1.2])
  monkeypatch.setattr(costs, 'measure_profile', lambda *a, **k: fake)
  assert costs.cost_profile(target, draft, 1, max_gamma=2, path=path) == fake
  assert costs.read_cache(path)[key]['verify_seconds'] == [1.0, 1.1, 1.2]


def test_concurrent_writers_leave_a_whole_file(tmp_path):
  path = str(tmp_path / 'costs.json')
  code = ('import sys; from spec_decode import cost_cache, costs; '
          'p = costs.CostProfile(1.0, 0.1, (1.0, 1.2), (0, 1), (1.0, 1.2), '
          '(1.0, 1.1)); '
          '[cost_cache.write_entry(sys.argv[1], sys.argv[2] + str(i), '
          'p.to_json()) for i in range(40)]')
  writers = [subprocess.Popen([sys.executable, '-c', code, path, name],
                              cwd=ROOT) for name in 'ab']
  reads = 0
  while any(w.poll() is None for w in writers):
    if os.path.exists(path):
      with open(path) as f:
        data = json.load(f)  # Never a torn file.
      assert data['format'] == cost_cache.CACHE_FORMAT
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
