r"""Builds the drafts' training data from a trained target.

  python scripts/distill_target.py --target_dir=runs/target --output_dir=data/distill
  python scripts/distill_target.py --target=t5_local_target   # the shipped target
  python scripts/distill_target.py --target=t5_local_target --splits=validation \
      --output_dir=data/distill   # add validation outputs to a folder

For each task: the target's greedy outputs on (a subset of) the training
inputs, and the target's top-k distribution at every output position. Drafts
then train on it with configs/train/draft_*.gin. Also writes the target's
greedy outputs on the first validation inputs (training reports a draft's
agreement with them) and the unigram counts of the target's training outputs
(for the unigram draft).
"""

import os
import time

from absl import app
from absl import flags
import numpy as np

from spec_decode import distill
from spec_decode import pretrained
from spec_decode import train_state
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
flags.DEFINE_multi_enum('splits', ['train', 'validation'],
                        ['train', 'validation'],
                        'train: outputs and top-k distributions on training '
                        'inputs (what drafts learn from); validation: '
                        'outputs on validation inputs (what training '
                        'measures agreement against).')
flags.DEFINE_integer('validation_examples', 1000,
                     'Validation inputs per task (the first ones).')
flags.DEFINE_list('max_decode_len', ['64', '32'],
                  'Output length limit per task (in --task order).')
flags.DEFINE_integer('max_input_length', 64, 'Input truncation, as trained.')
flags.DEFINE_integer('top_k', 16, 'Teacher probabilities kept per position.')
flags.DEFINE_integer('batch_size', 128, 'Decoding batch size.')
flags.DEFINE_integer('top_k_batch_size', 64,
                     'Batch size of the top-k (teacher-forced) pass.')
flags.DEFINE_integer('length_multiple', 16,
                     'Inputs and outputs are padded to a multiple of this '
                     '(larger: fewer compiled shapes, e.g. 32 on a GPU).')


def main(argv):
  del argv
  if FLAGS.target:
    target = pretrained.load(FLAGS.target)
  else:
    target = train_state.load_trained(FLAGS.target_dir)
  print(f'target: {target}', flush=True)
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  counts = np.zeros(target.config.vocab_size, np.int64)
  for task, limit, decode_len in zip(FLAGS.task, FLAGS.max_examples,
                                     FLAGS.max_decode_len):
    if 'train' in FLAGS.splits:
      start = time.time()
      split = tasks.TokenizedSplit.load(
          tasks.tokenized_path(FLAGS.data_dir, task, 'train'))
      rng = np.random.RandomState(0)
      indices = np.sort(rng.permutation(len(split))[:int(limit)])
      outputs = distill.teacher_outputs(
          target, split, indices, int(decode_len), FLAGS.batch_size,
          FLAGS.max_input_length, length_multiple=FLAGS.length_multiple)
      outputs.save(os.path.join(FLAGS.output_dir, f'{task}_train.npz'))
      print(f'{task}: {len(outputs)} teacher outputs in '
            f'{time.time() - start:.0f} s', flush=True)
      soft = distill.teacher_top_k(target, outputs, FLAGS.top_k,
                                   FLAGS.top_k_batch_size,
                                   length_multiple=FLAGS.length_multiple)
      soft.save(os.path.join(FLAGS.output_dir, f'{task}_train_teacher.npz'))
      counts += distill.token_counts(outputs, target.config.vocab_size)
      print(f'{task}: top-{FLAGS.top_k} targets in '
            f'{time.time() - start:.0f} s', flush=True)
    if 'validation' in FLAGS.splits:
      split = tasks.TokenizedSplit.load(
          tasks.tokenized_path(FLAGS.data_dir, task, 'validation'))
      indices = range(min(FLAGS.validation_examples, len(split)))
      outputs = distill.teacher_outputs(
          target, split, indices, int(decode_len), FLAGS.batch_size,
          FLAGS.max_input_length, length_multiple=FLAGS.length_multiple)
      outputs.save(os.path.join(FLAGS.output_dir, f'{task}_validation.npz'))
      print(f'{task}: {len(outputs)} validation outputs', flush=True)
  if 'train' in FLAGS.splits:
    np.save(os.path.join(FLAGS.output_dir, 'unigram_counts.npy'), counts)


if __name__ == '__main__':
  app.run(main)
