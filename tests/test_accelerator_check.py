"""scripts/accelerator_check.py at tiny shapes on the CPU."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_accelerator_check_runs_and_reports_every_figure(tmp_path):
  output = tmp_path / 'check.json'
  subprocess.run(
      [sys.executable, os.path.join(ROOT, 'scripts', 'accelerator_check.py'),
       '--targets=t5_1_1_tiny', '--draft=t5_1_1_tiny', '--gamma=3',
       '--max_decode_len=6', '--enc_len=8', '--repeats=1',
       f'--output_json={output}'], check=True, cwd=ROOT, capture_output=True)
  report = json.loads(output.read_text())
  (row,) = report['rows']
  for run in ('baseline', 'self_draft', 'small_draft'):
    assert row[run]['ms_per_token'] > 0
    assert row[run]['argument_size_in_bytes'] >= row['parameter_bytes']
  # The target as its own draft accepts everything: gamma + 1 tokens a call.
  assert row['self_draft']['target_calls'] == 2  # ceil(6 / 4)
  assert row['baseline']['target_calls'] == 6
  assert row['c'] > 0 and 'verify_cost_in_target_steps' in row
