"""The main job runs end to end on the shipped models."""

import json
import os
import subprocess
import sys

import pytest

from spec_decode import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_main_job_end_to_end(tmp_path):
  config = main.MainConfig(num_examples=2, show_examples=1,
                           max_decode_len=16)
  report = main.run(config, str(tmp_path))
  assert len(report['rows']) == 4
  for row in report['rows']:
    assert 0.0 <= row['alpha'] <= 1.0
    assert row['measured_speedup'] > 0 and row['predicted_speedup'] > 0
    if row['temperature'] == 0:
      assert row['greedy_identical'] is True
  saved = json.load(open(tmp_path / 'main.json'))
  assert saved['rows'][0]['task'] == 'translate_en_de'


@pytest.mark.slow
def test_main_cli_takes_gin_flags(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'spec_decode.main',
       '--gin.main.MainConfig.num_examples=1',
       "--gin.main.MainConfig.tasks=('summarize',)",
       '--gin.main.MainConfig.temperatures=(0.0,)',
       '--gin.main.MainConfig.max_decode_len=8',
       f'--output_dir={tmp_path}'],
      capture_output=True, text=True, cwd=ROOT, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert 'summarize' in result.stdout
  rows = json.load(open(tmp_path / 'main.json'))['rows']
  assert [r['task'] for r in rows] == ['summarize']
