"""scripts/pack_run.py: a training folder survives packing bit for bit."""

import json
import os
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np

from spec_decode import checkpoints
from spec_decode import train_state

from conftest import random_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(*args):
  subprocess.run([sys.executable, os.path.join(ROOT, 'scripts',
                                               'pack_run.py'), *args],
                 check=True, cwd=ROOT, capture_output=True)


def test_pack_then_unpack_gives_the_bfloat16_model(tmp_path):
  model = random_model(0, vocab_size=300, emb_dim=16, mlp_dim=32)
  run = tmp_path / 'run'
  checkpoints.save_t5x_checkpoint(str(run / 'checkpoint_7'), model.params,
                                  step=7)
  fields = {k: v for k, v in model.config.__dict__.items()}
  fields['mlp_activations'] = list(fields['mlp_activations'])
  (run / 'config.json').write_text(json.dumps({'model': fields}))
  (run / 'train_log.jsonl').write_text('{"step": 7}\n')
  _script('pack', f'--run_dir={run}', f'--output_dir={tmp_path / "parts"}',
          '--name=m', '--part_mib=0.01')
  parts = [p for p in os.listdir(tmp_path / 'parts') if '.part' in p]
  assert len(parts) > 1  # Cut into several parts.
  _script('unpack', f'--input_dir={tmp_path / "parts"}', '--name=m',
          f'--run_dir={tmp_path / "back"}')
  back = train_state.load_trained(str(tmp_path / 'back'))
  assert back.config == model.config
  for expected, got in zip(jax.tree_util.tree_leaves(model.params),
                           jax.tree_util.tree_leaves(back.params)):
    np.testing.assert_array_equal(
        np.asarray(expected).astype(ml_dtypes.bfloat16).astype(np.float32),
        np.asarray(got))
  assert (tmp_path / 'back' / 'train_log.jsonl').read_text() == (
      '{"step": 7}\n')
