"""Per-device memory from abstract shapes (spec_decode.memory_plan)."""

import json
import os
import subprocess
import sys

import pytest

import spec_decode as sd
from spec_decode import memory_plan
from spec_decode.model import param_shapes
from spec_decode.model import parameter_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _configs():
  target = sd.T5Config(vocab_size=512, emb_dim=64, num_heads=4, head_dim=16,
                       mlp_dim=128, num_encoder_layers=2,
                       num_decoder_layers=3, dtype='bfloat16')
  return target, target.replace(num_decoder_layers=1, num_encoder_layers=1)


def test_single_device_plan_counts_parameters_and_caches():
  target, draft = _configs()
  plan = memory_plan.plan_speculative(
      target, draft, batch_size=2, input_length=16, max_decode_len=8,
      gamma=3, num_partitions=1)
  assert plan['target_param_bytes'] == 2 * parameter_count(
      param_shapes(target))
  assert plan['draft_param_bytes'] == 2 * parameter_count(param_shapes(draft))
  cache_len = 8 + 3 + 2
  per_layer = 2 * 2 * 4 * 16 * 2  # keys + values, batch, heads, dim, bf16
  assert plan['cache_bytes'] == per_layer * (
      (target.num_decoder_layers + draft.num_decoder_layers)
      * (cache_len + 16))
  # Arguments hold at least both models' weights.
  assert plan['argument_bytes'] >= (plan['target_param_bytes'] +
                                    plan['draft_param_bytes'])
  assert plan['total_bytes'] > 0
  assert set(plan['fits']) == set(memory_plan.CHIP_MEMORY)
  assert all(plan['fits'].values())


def test_more_partitions_than_devices_is_a_clear_error():
  target, draft = _configs()
  with pytest.raises(ValueError, match='needs that many devices'):
    memory_plan.plan_speculative(
        target, draft, batch_size=1, input_length=8, max_decode_len=4,
        gamma=2, num_partitions=64)


# The script end to end (a subprocess compiling both models): slow suite;
# the plan's arithmetic is checked fast above.
@pytest.mark.slow
def test_script_plans_a_local_row_over_two_partitions(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  result = subprocess.run(
      [sys.executable, 'scripts/plan_memory.py',
       '--rows=configs/local/ende_t0_tiny.gin', '--num_partitions=1,2',
       f'--output_dir={tmp_path}'], cwd=ROOT, env=env, capture_output=True,
      text=True, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  with open(os.path.join(tmp_path, 'memory_plan.json')) as f:
    rows = json.load(f)
  assert [r['num_partitions'] for r in rows] == [1, 2]
  # Parameters split over 'model' halve (the shipped target divides by 2).
  assert rows[1]['target_params_gb'] == pytest.approx(
      rows[0]['target_params_gb'] / 2, rel=0.05)
  assert rows[1]['draft_params_gb'] == rows[0]['draft_params_gb']
