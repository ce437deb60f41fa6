r"""Drafts' agreement with the target on validation inputs, without decoding.

  python scripts/agreement.py --distillation_dir=data/distill \
      --drafts=t5_local_draft_tiny,t5_local_draft_small,runs/draft_tiny

For each draft (a shipped name, or a training folder or checkpoint written by
scripts/train_model.py): its teacher-forced argmax agreement with the target's
greedy outputs on the validation inputs scripts/distill_target.py recorded. Greedy
speculative decoding accepts a draft token exactly when the two argmaxes
agree, so this is the paper's alpha at T=0 on held-out inputs, in seconds;
draft training logs the same figure as `<task>/target_agreement`. With
--target (the model whose outputs the folder holds), also each draft's
expected acceptance at temperature 1 along those outputs: the mean of
beta = sum_x min(p(x), q(x)), the exact acceptance probability of
speculative sampling at a position (the paper's alpha at T=1).

  python scripts/agreement.py --distillation_dir=data/distill_cpu \
      --target=runs/target_cpu_dropout --drafts=runs/draft_tiny_cpu
"""

import json
import os

from absl import app
from absl import flags

from spec_decode import losses
from spec_decode import pretrained
from spec_decode import train
from spec_decode import train_eval
from spec_decode import train_state
from spec_decode.data import batching

FLAGS = flags.FLAGS
flags.DEFINE_list('drafts', ['t5_local_draft_tiny', 't5_local_draft_small'],
                  'Shipped model names or training folders.')
flags.DEFINE_string('distillation_dir', 'data/distill',
                    'Folder with <task>_validation.npz from distill_target.py.')
flags.DEFINE_multi_string('task', ['translate_en_de', 'summarize'], 'Tasks.')
flags.DEFINE_integer('examples', 1000, 'Validation examples per task (the '
                     'first ones; all if fewer were recorded).')
flags.DEFINE_integer('max_input_length', 64, 'Input truncation, as trained.')
flags.DEFINE_string('output', None, 'Optional JSON file for the figures.')
flags.DEFINE_string('target', None,
                    'The target (shipped name or training folder) whose '
                    'outputs --distillation_dir holds: also report expected '
                    'acceptance at temperature 1.')


def load_model(name: str):
  """A shipped model by name, or the latest checkpoint of a training folder."""
  if name in pretrained.available():
    return pretrained.load(name)
  if os.path.isdir(name):
    return train_state.load_trained(name)
  raise app.UsageError(f'{name!r} is neither one of '
                       f'{pretrained.available()} nor a folder.')


def main(argv):
  del argv
  mixture = {task: 1.0 for task in FLAGS.task}
  config = train.TrainConfig(distillation_dir=FLAGS.distillation_dir,
                             mixture=mixture,
                             max_input_length=FLAGS.max_input_length)
  splits = train_eval.load_agreement_splits(config.distillation_dir, mixture)
  if splits is None:
    raise app.UsageError(
        f'--distillation_dir={FLAGS.distillation_dir!r} has no '
        '<task>_validation.npz for every --task; write them with python '
        'scripts/distill_target.py --target=t5_local_target --splits=validation '
        f'--output_dir={FLAGS.distillation_dir}')
  sampler = batching.BatchSampler(splits, mixture, config.batch_tokens,
                                  config.seed,
                                  max_input_length=FLAGS.max_input_length)
  counts = {task: min(FLAGS.examples, len(splits[task])) for task in FLAGS.task}
  target = load_model(FLAGS.target) if FLAGS.target else None
  results = {}
  for name in FLAGS.drafts:
    draft = load_model(name)
    eval_step = train_eval.make_eval_step(losses.make_loss_fn(
        draft.config, config.z_loss, config.soft_target_weight))
    results[name] = train_eval.evaluate_agreement(
        eval_step, draft.params, sampler, mixture, FLAGS.examples)
    line = ', '.join(
        f'{task} {results[name][f"{task}/target_agreement"]:.3f}'
        for task in FLAGS.task)
    if target is not None:
      results[name].update(train_eval.expected_acceptance(
          target, draft, sampler, mixture, FLAGS.examples))
      line += '; at T=1 ' + ', '.join(
          f'{task} {results[name][f"{task}/expected_acceptance"]:.3f}'
          for task in FLAGS.task)
    print(f'{name}: greedy {line} ('
          + ', '.join(f'{counts[task]} {task} inputs' for task in FLAGS.task)
          + ')', flush=True)
  if FLAGS.output:
    with open(FLAGS.output, 'w') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  app.run(main)
