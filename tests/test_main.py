"""The main job runs end to end on the shipped models."""

import json
import os
import subprocess
import sys

import pytest

from spec_decode import auto_generation
from spec_decode import cost_cache as cache_lib
from spec_decode import costs
from spec_decode import main

from conftest import saved_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def cost_cache(tmp_path_factory):
  """One cost cache for this module's runs of the shipped pair: the first
  run measures the costs, as a new user's first run does; later runs read
  them, as a user's later runs do."""
  return str(tmp_path_factory.mktemp('cost_cache'))


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path, monkeypatch, cost_cache):
  monkeypatch.setenv(cache_lib.CACHE_DIR_ENV, cost_cache)
  cache_lib.forget_acceptance()
  config = main.MainConfig(num_examples=3, show_examples=1,
                           max_decode_len=16)
  assert config.gamma == 'auto'
  report = main.run(config, str(tmp_path))
  assert len(report['rows']) == 4
  assert report['machine']['cpu'] and report['costs']['verify_seconds']
  assert report['decoder_products'] in ('avx2', 'avx512', 'avx512+amx',
                                       'portable', 'xla')
  profile = costs.CostProfile.from_json(report['costs'])
  for row in report['rows']:
    # Each row chose per iteration, inside the loop: a histogram of counts,
    # up to the most the measured costs ever favour.
    max_gamma = auto_generation.default_max_gamma(
        profile, row['temperature'] == 0)
    assert len(row['proposal_counts']) == max_gamma + 1
    assert 0.0 <= row['mean_proposals'] <= max_gamma
    assert row['predicted_speedup_in_loop'] > 0
    if row['mean_proposals'] > 0:
      assert 0.0 <= row['alpha'] <= 1.0
    assert row['measured_speedup'] > 0
    if row['gamma']:
      assert row['predicted_speedup'] > 0
    if row['temperature'] == 0:
      assert row['greedy_identical'] is True
  # The measured costs were cached for the next run.
  assert cache_lib.read_cache(cache_lib.cache_path())
  saved = json.load(open(tmp_path / 'main.json'))
  assert saved['rows'][0]['task'] == 'translate_en_de'


@pytest.mark.slow
def test_main_job_with_a_fixed_gamma(tmp_path, monkeypatch, cost_cache):
  monkeypatch.setenv(cache_lib.CACHE_DIR_ENV, cost_cache)
  config = main.MainConfig(num_examples=2, show_examples=0,
                           max_decode_len=12, gamma=2,
                           tasks=('translate_en_de',), temperatures=(0.0,))
  (row,) = main.run(config, str(tmp_path))['rows']
  assert row['mean_proposals'] == 2 and row['greedy_identical'] is True
  assert row['predicted_speedup'] > 0 and row['gamma'] == 2


def test_main_job_takes_any_model_spec(tmp_path, monkeypatch):
  # Costs are not what this checks: a made-up profile skips measuring them.
  profile = costs.CostProfile(1e-3, 1e-4, (1e-3,) + (1.5e-3,) * 8,
                              (0, 1, 3, 7, 8), (1e-3, 1.6e-3, 1.8e-3,
                                                2.2e-3, 2.3e-3),
                              (1e-3, 1.5e-3, 1.7e-3, 2.1e-3, 2.2e-3))
  monkeypatch.setattr(main.costs_lib, 'cost_profile',
                      lambda *args, **kwargs: profile)
  config = main.MainConfig(
      target=saved_model(str(tmp_path), 0),
      draft=saved_model(str(tmp_path), 1, num_decoder_layers=1),
      num_examples=2, show_examples=0, max_decode_len=6, gamma=2,
      tasks=('translate_en_de',), temperatures=(0.0,), timing_repeats=1)
  (row,) = main.run(config, str(tmp_path))['rows']
  assert row['greedy_identical'] is True and row['mean_proposals'] == 2


def test_main_job_refuses_a_vocabulary_larger_than_the_target(tmp_path):
  config = main.MainConfig(target=saved_model(str(tmp_path), 0,
                                               vocab_size=512))
  with pytest.raises(ValueError, match='vocabulary has 8000 pieces'):
    main.run(config, str(tmp_path))


def test_main_job_refuses_a_bad_gamma(tmp_path):
  with pytest.raises(ValueError, match="gamma must be 'auto' or a positive"):
    main.run(main.MainConfig(gamma=0), str(tmp_path))


def test_main_job_refuses_a_bad_margin(tmp_path):
  with pytest.raises(ValueError, match="min_gain is only for gamma='auto'"):
    main.run(main.MainConfig(gamma=3, min_gain=1.2), str(tmp_path))
  with pytest.raises(ValueError, match='min_gain must be >= 1'):
    main.run(main.MainConfig(min_gain=0.5), str(tmp_path))


def test_main_job_refuses_unknown_product_inputs(tmp_path):
  with pytest.raises(ValueError, match='kernel_product_inputs must be one of'):
    main.run(main.MainConfig(kernel_product_inputs='int8'), str(tmp_path))


@pytest.mark.slow
def test_main_cli_takes_gin_flags(tmp_path, cost_cache):
  result = subprocess.run(
      [sys.executable, '-m', 'spec_decode.main',
       '--gin.main.MainConfig.num_examples=1',
       "--gin.main.MainConfig.tasks=('summarize',)",
       '--gin.main.MainConfig.temperatures=(0.0,)',
       '--gin.main.MainConfig.max_decode_len=8',
       f'--output_dir={tmp_path}'],
      capture_output=True, text=True, cwd=ROOT, check=False,
      env={**os.environ, cache_lib.CACHE_DIR_ENV: cost_cache})
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'summarize' in result.stdout
  rows = json.load(open(tmp_path / 'main.json'))['rows']
  assert [r['task'] for r in rows] == ['summarize']


@pytest.mark.parametrize('command', [
    ['-m', 'spec_decode.main'], ['-m', 'spec_decode.infer'],
    ['scripts/reproduce_paper.py'], ['scripts/plan_memory.py']])
def test_help_lists_the_flags_with_their_help(command):
  result = subprocess.run([sys.executable, *command, '--help'], cwd=ROOT,
                          capture_output=True, text=True, check=False)
  # absl's --help exits with status 1 after printing.
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]
  for flag, words in (('--gin_file', 'gin files to parse'),
                      ('multiprocess', 'jax.distributed.initialize')):
    assert flag in result.stdout
    assert words in result.stdout


def test_console_scripts_are_the_module_entry_points():
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  from spec_decode import infer  # pylint: disable=g-import-not-at-top
  scripts = {entry.name: entry for entry in
             metadata.entry_points(group='console_scripts')
             if entry.value.startswith('spec_decode.')}
  if not scripts:
    pytest.skip('spec_decode is not installed (pip install -e .)')
  assert scripts['spec-decode'].load() is main.cli
  assert scripts['spec-decode-infer'].load() is infer.cli
