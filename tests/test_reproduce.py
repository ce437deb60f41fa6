"""gin configs parse and build without touching the network; tables write."""

import dataclasses
import glob
import os
import subprocess
import sys

import gin
import numpy as np
import pytest

from spec_decode import gin_utils
from spec_decode import report
from spec_decode import reproduce
from spec_decode import sweeps
from spec_decode import specs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, 'configs')
SHARED = gin_utils.NOT_ROWS


def _rows(folder):
  return sorted(f for f in glob.glob(os.path.join(CONFIGS, folder, '*.gin'))
                if os.path.basename(f) not in SHARED)


def _build(path, cls, monkeypatch):
  # Loading a model would read a checkpoint (gs:// for the paper rows): the
  # build must not try.
  monkeypatch.setattr(specs.ModelSpec, 'load', _no_load)
  gin.clear_config()
  gin.add_config_file_search_path(CONFIGS)
  gin.parse_config_files_and_bindings([path], [], finalize_config=False)
  return gin_utils.build(cls)


def _no_load(self):
  raise AssertionError(f'{self.label} was loaded while building a config')


@pytest.mark.parametrize('path', _rows('paper'), ids=os.path.basename)
def test_paper_rows_build_offline(path, monkeypatch):
  row = _build(path, reproduce.ComparisonRow, monkeypatch)
  assert row.target.label == 'T5-XXL'
  assert row.target.config.emb_dim == 4096
  assert row.target.checkpoint.startswith('gs://')
  assert row.draft.label in ('T5-small', 'T5-base', 'T5-large')
  assert row.data.source == 'seqio'
  assert row.batch_size == 1
  assert row.paper_alpha and row.paper_speedup
  assert 'T5-XXL' in row.describe()
  assert row.mesh.num_partitions == 'auto'


def test_paper_rows_take_num_partitions_from_the_command_line(monkeypatch):
  monkeypatch.setattr(specs.ModelSpec, 'load', _no_load)
  gin.clear_config()
  gin.add_config_file_search_path(CONFIGS)
  gin.parse_config_files_and_bindings(
      [os.path.join(CONFIGS, 'paper', 'ende_t0_small.gin')],
      ['NUM_PARTITIONS = 8'], finalize_config=False)
  row = gin_utils.build(reproduce.ComparisonRow)
  assert row.mesh == specs.MeshSpec(num_partitions=8)
  # On a CPU (no device memory limit) 'auto' is 1: nothing is sharded.
  assert specs.MeshSpec('auto').build(row.target.config, 'bfloat16') is None


def test_there_is_a_paper_row_per_table_2_row():
  assert len(_rows('paper')) == 12


@pytest.mark.parametrize('path', _rows('local'), ids=os.path.basename)
def test_local_rows_build(path, monkeypatch):
  row = _build(path, reproduce.ComparisonRow, monkeypatch)
  assert row.target.pretrained == 't5_local_target'
  assert row.draft.pretrained.startswith('t5_local_draft')
  assert row.data.source == 'local'


@pytest.mark.parametrize('folder', ['paper', 'local'])
def test_table_3_builds(folder, monkeypatch):
  table = _build(os.path.join(CONFIGS, folder, 'table3.gin'),
                 reproduce.AcceptanceTable, monkeypatch)
  assert len(table.drafts) >= 3
  assert table.temperatures == (0.0, 1.0)


def test_sweep_builds(monkeypatch):
  sweep = _build(os.path.join(CONFIGS, 'local', 'sweep.gin'),
                 sweeps.Sweep, monkeypatch)
  assert sweep.batch_sizes[-1] == 64 and 1 in sweep.gammas
  assert sweep.leniences == (1.0, 0.5, 0.3, 0.1)


def test_model_configs_parse():
  for path in glob.glob(os.path.join(CONFIGS, 'models', '*.gin')):
    gin.clear_config()
    gin.parse_config_files_and_bindings([path], [], finalize_config=False)


def test_dry_run_prints_what_it_would_load():
  result = subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'reproduce_paper.py'),
       '--table=2', f'--rows={os.path.join(CONFIGS, "paper")}',
       '--gin_dry_run', '--gin.T5_1_1_XXL_CHECKPOINT="gs://bucket/xxl"'],
      capture_output=True, text=True, check=True, cwd=ROOT)
  assert result.stdout.count('row ') == 12
  assert "T5X checkpoint 'gs://bucket/xxl'" in result.stdout


def test_includes_resolve_without_a_source_checkout(tmp_path, monkeypatch):
  # A regular `pip install .` has no configs/ next to the package: includes
  # must resolve through the folder of the file being parsed.
  monkeypatch.setattr(gin_utils, 'CONFIGS_DIR', str(tmp_path / 'absent'))
  monkeypatch.chdir(tmp_path)
  row = os.path.join(CONFIGS, 'paper', 'ende_t0_small.gin')
  assert CONFIGS in gin_utils.config_search_paths([row])
  assert str(tmp_path / 'absent') not in gin_utils.config_search_paths([row])


def test_gin_dot_flags_become_bindings():
  assert gin_utils.rewrite_gin_args(
      ['prog', '--gin.A.b=3', '--other=1']) == [
          'prog', '--gin_bindings=A.b = 3', '--other=1']
  with pytest.raises(ValueError, match='--gin.NAME=VALUE'):
    gin_utils.rewrite_gin_args(['--gin.A'])


def test_tables_are_written(tmp_path):
  rows = [{'row': 'a', 'alpha': 0.5, 'measured_speedup': 1.25},
          {'row': 'b', 'alpha': 0.75, 'measured_speedup': None}]
  paths = report.write_rows(rows, str(tmp_path), 'table2',
                            ['row', 'alpha', 'measured_speedup'])
  assert open(paths['md']).read().splitlines()[2] == '| a | 0.500 | 1.250 |'
  assert open(paths['csv']).read().splitlines()[0] == (
      'row,alpha,measured_speedup')


def test_crossing_batch_size():
  rows = [{'batch_size': b, 'measured_speedup': s}
          for b, s in [(1, 1.8), (4, 1.3), (16, 0.9), (64, 0.5)]]
  assert sweeps.crossing_batch_size(rows) == 16
  assert sweeps.crossing_batch_size(rows[:2]) is None


def test_verification_comparison_builds_every_setting(monkeypatch):
  comparison = _build(os.path.join(CONFIGS, 'local', 'verification.gin'),
                      sweeps.VerificationComparison, monkeypatch)
  settings = comparison.settings()
  # 4 rows x 2 batch sizes x 2 rules x (fixed, adaptive).
  assert len(settings) == 32
  assert {s.verification for s in settings} == {'token', 'block'}
  assert {(s.draft_stop, s.gamma) for s in settings} == {
      (None, 4), ('confidence', 6)}
  assert {s.data.task for s in settings} == {'translate_en_de', 'summarize'}
  assert all(s.num_examples >= 2 * s.batch_size for s in settings)
  assert {s.draft_threshold for s in settings if s.draft_stop} == {0.4}


def test_block_gain_pairs_the_rules_seed_by_seed(monkeypatch):
  comparison = dataclasses.replace(
      _build(os.path.join(CONFIGS, 'local', 'verification.gin'),
             sweeps.VerificationComparison, monkeypatch), seeds=(0, 1, 2))
  calls = []

  def fake_acceptance(target, draft, data, temperature, *, gamma,
                      num_examples, batch_size, max_decode_len, seed,
                      decode_options):
    calls.append((data.task, temperature, gamma, seed, decode_options))
    # Block gains 0.1 per call on every seed but the last.
    gain = 0.1 if decode_options['verification'] == 'block' and seed < 2 else 0
    return {'tokens_per_target_call': 1.5 + gain}

  monkeypatch.setattr(reproduce, 'acceptance', fake_acceptance)
  rows = sweeps.block_gain(comparison)
  # Greedy rows are skipped: 2 sampled rows x 2 draft lengths x 3 seeds.
  assert {c[1] for c in calls} == {1.0}
  assert len(calls) == 2 * 2 * 3 * 2
  assert {c[4]['verification'] for c in calls} == {'token', 'block'}
  assert {(c[2], c[4]['draft_stop']) for c in calls} == {
      (4, None), (6, 'confidence')}
  summaries = [r for r in rows if r['seed'] == 'mean']
  assert len(rows) == 4 * 3 + len(summaries) and len(summaries) == 4
  for summary in summaries:
    np.testing.assert_allclose(summary['block_gain'], 0.2 / 3)
    np.testing.assert_allclose(summary['block_gain_std'],
                               np.std([0.1, 0.1, 0.0], ddof=1))
    assert summary['seeds_block_ahead'] == 2


def test_candidate_comparison_measures_every_setting(monkeypatch):
  comparison = dataclasses.replace(
      _build(os.path.join(CONFIGS, 'local', 'candidates.gin'),
             sweeps.CandidateComparison, monkeypatch), seeds=(0, 1))
  settings = comparison.settings()
  # 4 rows x 2 batch sizes x 2 gammas x k in (1, 2, 4).
  assert len(settings) == 48
  assert {s.num_candidates for s in settings} == {1, 2, 4}
  assert all(s.decode_options()['num_candidates'] == s.num_candidates
             for s in settings)
  comparison = dataclasses.replace(comparison, rows=comparison.rows[1:2],
                                   batch_sizes=(1,), gammas=(3,))
  measured, counted = [], []

  def fake_measure_row(row, costs):
    measured.append((row.num_candidates, costs))
    first = None if row.num_candidates == 1 else 0.6
    return {**row.decode_options(), 'alpha_beta': 0.5,
            'first_token_acceptance': first,
            'accepted_per_target_call': 1.8, 'measured_speedup': 0.9}

  def fake_acceptance(target, draft, data, temperature, *, gamma,
                      num_examples, batch_size, max_decode_len, seed,
                      decode_options):
    k = decode_options['num_candidates']
    counted.append((seed, k))
    return {'accepted_per_target_call': 1.7 + 0.1 * seed,
            'alpha_beta': 0.5,
            'first_token_acceptance': None if k == 1 else 0.6 + 0.2 * seed}

  monkeypatch.setattr(reproduce, 'load_pair', lambda *a: (None, None))
  monkeypatch.setattr(reproduce, 'measure_row', fake_measure_row)
  monkeypatch.setattr(reproduce, 'acceptance', fake_acceptance)
  monkeypatch.setattr(sweeps.benchmark, 'measure_costs',
                      lambda t, d, batch, gamma: {'c': 0.1,
                                                  'verify_cost': gamma / 6})
  monkeypatch.setattr(specs.DataSpec, 'load',
                      lambda self, n: (np.ones((n, 4), np.int32), None))
  rows = sweeps.candidate_comparison(comparison)
  assert [r['num_candidates'] for r in rows] == [1, 2, 4]
  # The target call's cost is measured at the width of k candidates.
  assert [c['verify_cost'] for _, c in measured] == [3 / 6, 6 / 6, 12 / 6]
  for row, k in zip(rows, (1, 2, 4)):
    first = 0.5 if k == 1 else 0.6
    assert row['width'] == 1 + 3 * k
    assert row['predicted_tokens_per_call'] == pytest.approx(
        1 + first * (1 + 0.5 + 0.25))
    assert row['predicted_speedup_candidates'] == pytest.approx(
        row['predicted_tokens_per_call'] / (3 * 0.1 + k * 3 / 6))
    assert row['seed_tokens_mean'] == pytest.approx(1.75)
    assert row['seed_tokens_std'] == pytest.approx(np.std([1.7, 1.8],
                                                          ddof=1))
    # Each seed's prediction from its own P_k and alpha, then their mean.
    firsts = [0.5, 0.5] if k == 1 else [0.6, 0.8]
    assert row['seed_predicted_mean'] == pytest.approx(
        np.mean([1 + f * 1.75 for f in firsts]))
  assert sorted(counted) == sorted((s, k) for s in (0, 1) for k in (1, 2, 4))
