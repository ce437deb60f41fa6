r"""Exports trained models into the package (bfloat16, T5X format) + manifest.

  python scripts/export_models.py   # after train_model.py and distill_target.py
  python scripts/export_models.py --models=t5_local_draft_tiny   # one model
  python scripts/export_models.py --run_dir=t5_local_target=runs/target_cpu_dropout \
      --run_dir=t5_local_draft_tiny=runs/draft_tiny_cpu_on_policy ...

Each model is written as a T5X checkpoint (gzip zarr leaves) under
spec_decode/pretrained/assets/<name>/ and described in manifest.json (config,
role, parameter counts, training time, validation loss, translation scores on
the En->De test split).
"""

import json
import os
import time

from absl import app
from absl import flags
import jax
import numpy as np

from spec_decode import checkpoints
from spec_decode import distill
from spec_decode import pretrained
from spec_decode import train_eval
from spec_decode import train_state
from spec_decode.data import tasks
from spec_decode.model import parameter_count

FLAGS = flags.FLAGS
flags.DEFINE_string('runs_dir', 'runs', 'Training folders.')
flags.DEFINE_string('data_dir', 'data', 'Folder from prepare_data.py.')
flags.DEFINE_string('distill_dir', 'data/distill', 'From distill_target.py.')
flags.DEFINE_integer('eval_examples', 400, 'En->De test examples scored.')
flags.DEFINE_integer('batch_size', 50, 'Decoding batch size for scoring.')
flags.DEFINE_list('models', None, 'Names to export (default: all); the '
                  "others' manifest entries are kept as they are.")
flags.DEFINE_multi_string('run_dir', [], 'NAME=FOLDER: export NAME from this '
                          'training folder instead of <runs_dir>/<its '
                          'default folder>.')

# name -> (training folder or None, role)
MODELS = {
    't5_local_target': ('target', 'target'),
    't5_local_draft_small': ('draft_small', 'draft'),
    't5_local_draft_tiny': ('draft_tiny', 'draft'),
    't5_local_bigram_draft': ('draft_bigram', 'draft (bigram)'),
    't5_local_unigram_draft': (None, 'draft (unigram)'),
}


def training_summary(run_dir: str):
  with open(os.path.join(run_dir, 'train_log.jsonl')) as f:
    records = [json.loads(line) for line in f]
  evals = [r for r in records if any(k.endswith('/loss') for k in r)]
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = json.load(f)
  return {
      'steps': records[-1]['step'],
      'batch_tokens': config['batch_tokens'],
      'distilled': bool(config.get('distillation_dir')),
      'validation': {k: v for k, v in evals[-1].items()
                     if k.endswith(('/loss', '/accuracy',
                                    '/target_agreement'))} if evals else {},
      'logged_seconds': training_seconds(records),
  }


def training_seconds(records) -> float:
  """Wall-clock seconds between log records, without resumption pauses.

  A run stopped and resumed later leaves one long gap between two records;
  such a gap (over 5x the median interval) counts as one median interval.
  """
  times = np.array([r['time'] for r in records], np.float64)
  gaps = np.diff(times)
  if not len(gaps):
    return 0.0
  typical = float(np.median(gaps))
  return float(np.sum(np.where(gaps > 5 * typical, typical, gaps)))


def main(argv):
  del argv
  vocabulary = pretrained.vocabulary()
  names = FLAGS.models or list(MODELS)
  unknown = sorted(set(names) - set(MODELS))
  if unknown:
    raise app.UsageError(f'--models: unknown {unknown}; expected names from '
                         f'{sorted(MODELS)}.')
  run_dirs = {}
  for item in FLAGS.run_dir:
    name, sep, folder = item.partition('=')
    if not sep or name not in MODELS or MODELS[name][0] is None:
      raise app.UsageError(
          f'--run_dir={item!r}: expected NAME=FOLDER with NAME one of '
          f'{sorted(n for n, (run, _) in MODELS.items() if run)}.')
    run_dirs[name] = folder
  manifest = {}
  if FLAGS.models and os.path.exists(pretrained.MANIFEST_PATH):
    with open(pretrained.MANIFEST_PATH) as f:
      manifest = json.load(f)
  test_pairs = tasks.load_pairs('translate_en_de', 'test',
                                FLAGS.data_dir)[:FLAGS.eval_examples]
  for name in names:
    run, role = MODELS[name]
    start = time.time()
    if run is None:
      counts = np.load(os.path.join(FLAGS.distill_dir, 'unigram_counts.npy'))
      model = distill.unigram_model(counts, vocabulary.eos_id)
      summary, step = {'fitted': 'closed form from target output counts'}, 0
    else:
      run_dir = run_dirs.get(name, os.path.join(FLAGS.runs_dir, run))
      summary = training_summary(run_dir)
      model = train_state.load_trained(run_dir, eos_id=vocabulary.eos_id)
      step = summary['steps']
    metrics = train_eval.translation_metrics(model, vocabulary, test_pairs,
                                             FLAGS.batch_size)
    folder = os.path.join(pretrained.ASSETS_DIR, name)
    bf16 = jax.tree_util.tree_map(
        lambda x: np.asarray(x).astype('bfloat16'), model.params)
    checkpoints.save_t5x_checkpoint(folder, bf16, step=step)
    # The activation dtype is the loader's choice; dropout is for training.
    config_fields = {k: v for k, v in model.config.__dict__.items()
                     if k not in ('dtype', 'dropout_rate')}
    config_fields['mlp_activations'] = list(config_fields['mlp_activations'])
    count = parameter_count(model.params)
    manifest[name] = {
        'role': role, 'checkpoint': name, 'config': config_fields,
        'parameters': count,
        'decoder_parameters': parameter_count(model.params['decoder']),
        'max_input_length': 64, 'training': summary,
        'en_de_test': metrics,
    }
    print(f"{name}: {count:,} parameters, chrF {metrics['chrf']:.1f}, "
          f"BLEU {metrics['bleu']:.1f} ({time.time() - start:.0f} s)",
          flush=True)
  manifest = {name: manifest[name] for name in MODELS if name in manifest}
  with open(pretrained.MANIFEST_PATH, 'w') as f:
    json.dump(manifest, f, indent=1, ensure_ascii=False)
  print('wrote', pretrained.MANIFEST_PATH)


if __name__ == '__main__':
  app.run(main)
