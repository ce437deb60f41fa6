r"""Builds the drafts' training data from a trained target.

  python scripts/distill.py --target_dir=runs/target --output_dir=data/distill
  python scripts/distill.py --target=t5_local_target   # the shipped target

For each task: the target's greedy outputs on (a subset of) the training
inputs, and the target's top-k distribution at every output position. Drafts
then train on it with configs/train/draft_*.gin. Also writes the unigram
counts of the target's outputs (for the unigram draft).
"""

import os
import time

from absl import app
from absl import flags
import numpy as np

from spec_decode import checkpoints
from spec_decode import distill
from spec_decode import model as model_lib
from spec_decode import pretrained
from spec_decode.data import tasks

FLAGS = flags.FLAGS
flags.DEFINE_string('target_dir', 'runs/target',
                    'Training folder (or checkpoint) of the target.')
flags.DEFINE_string('target', None,
                    'A shipped target (spec_decode.pretrained name) to '
                    'distill instead of --target_dir: the drafts then learn '
                    'the very weights they will be paired with.')
flags.DEFINE_string('data_dir', 'data', 'Folder from prepare_data.py.')
flags.DEFINE_string('output_dir', 'data/distill', 'Where to write.')
flags.DEFINE_multi_string('task', ['translate_en_de', 'summarize'], 'Tasks.')
flags.DEFINE_list('max_examples', ['50000', '20000'],
                  'Training examples per task (in --task order).')
flags.DEFINE_list('max_decode_len', ['64', '32'],
                  'Output length limit per task (in --task order).')
flags.DEFINE_integer('max_input_length', 64, 'Input truncation, as trained.')
flags.DEFINE_integer('top_k', 16, 'Teacher probabilities kept per position.')
flags.DEFINE_integer('batch_size', 128, 'Decoding batch size.')


def load_trained(path: str) -> model_lib.Model:
  """A float32 model from a training folder written by spec_decode.train."""
  import json  # pylint: disable=g-import-not-at-top
  with open(os.path.join(path, 'config.json')) as f:
    fields = json.load(f)['model']
  config = model_lib.T5Config(**{**fields, 'dtype': 'float32'})
  params = checkpoints.load_t5x_checkpoint(path, config, dtype='float32')
  return model_lib.Model(config, params)


def main(argv):
  del argv
  if FLAGS.target:
    target = pretrained.load(FLAGS.target)
  else:
    target = load_trained(FLAGS.target_dir)
  print(f'target: {target}', flush=True)
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  counts = np.zeros(target.config.vocab_size, np.int64)
  for task, limit, decode_len in zip(FLAGS.task, FLAGS.max_examples,
                                     FLAGS.max_decode_len):
    start = time.time()
    split = tasks.TokenizedSplit.load(
        tasks.tokenized_path(FLAGS.data_dir, task, 'train'))
    rng = np.random.RandomState(0)
    indices = np.sort(rng.permutation(len(split))[:int(limit)])
    outputs = distill.teacher_outputs(target, split, indices,
                                      int(decode_len), FLAGS.batch_size,
                                      FLAGS.max_input_length)
    outputs.save(os.path.join(FLAGS.output_dir, f'{task}_train.npz'))
    print(f'{task}: {len(outputs)} teacher outputs in '
          f'{time.time() - start:.0f} s', flush=True)
    soft = distill.teacher_top_k(target, outputs, FLAGS.top_k)
    soft.save(os.path.join(FLAGS.output_dir, f'{task}_train_teacher.npz'))
    counts += distill.token_counts(outputs, target.config.vocab_size)
    print(f'{task}: top-{FLAGS.top_k} targets in {time.time() - start:.0f} s',
          flush=True)
  np.save(os.path.join(FLAGS.output_dir, 'unigram_counts.npy'), counts)


if __name__ == '__main__':
  app.run(main)
