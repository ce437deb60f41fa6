r"""Where a speculative iteration's time goes, with the shipped models.

  python scripts/iteration_costs.py --draft=t5_local_draft_tiny --gamma=3

Prints, at batch 1 on one held-out En->De input: the isolated decoder-call
times the analysis uses (target at 1 and gamma+1 tokens, draft at 1 and 2
tokens; the draft's first step of an iteration feeds 2), and the per-step
times of the whole compiled decoders (baseline per token, speculative per
iteration), so the loop's overhead beyond the model calls can be read off.
"""

from absl import app
from absl import flags
import numpy as np

import spec_decode as sd
from spec_decode import analysis
from spec_decode import benchmark
from spec_decode import evaluation
from spec_decode import pretrained
from spec_decode.data import tasks

FLAGS = flags.FLAGS
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_string('draft', 't5_local_draft_tiny', 'Shipped draft.')
flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.')
flags.DEFINE_integer('example', 3, 'Index of the En->De test example.')
flags.DEFINE_integer('max_decode_len', 48, 'Output limit.')
flags.DEFINE_integer('repeats', 7, 'Timed calls per decoder.')


def main(argv):
  del argv
  target = pretrained.load(FLAGS.target)
  draft = pretrained.load(FLAGS.draft)
  source = tasks.load_pairs('translate_en_de', 'test')[FLAGS.example][0]
  enc = evaluation.encode_inputs(pretrained.vocabulary(), 'translate_en_de',
                                 [source], 64)
  calls = {
      'target, 1 token': (target, 1),
      f'target, {FLAGS.gamma + 1} tokens': (target, FLAGS.gamma + 1),
      'draft, 1 token': (draft, 1),
      'draft, 2 tokens': (draft, 2),
  }
  ms = {name: 1e3 * analysis.decoder_step_seconds(model, enc, k, 50)
        for name, (model, k) in calls.items()}
  for name, value in ms.items():
    print(f'isolated call, {name}: {value:.2f} ms')

  results = {}

  def decoder(name, **kwargs):
    def run():
      results[name] = sd.generate(target, enc,
                                  max_decode_len=FLAGS.max_decode_len,
                                  **kwargs)
      return results[name].tokens
    return run

  timings = benchmark.interleaved_timings(
      {'baseline': decoder('baseline'),
       'speculative': decoder('speculative', draft=draft,
                              gamma=FLAGS.gamma)},
      repeats=FLAGS.repeats, warmup=1)
  model_calls = (FLAGS.gamma * ms['draft, 1 token']
                 + ms[f'target, {FLAGS.gamma + 1} tokens'])
  for name in ('baseline', 'speculative'):
    steps = int(np.asarray(results[name].num_iterations))
    per_step = 1e3 * benchmark.median(timings[name]) / steps
    print(f'{name}: {steps} loop steps for '
          f'{int(np.asarray(results[name].lengths)[0])} tokens, '
          f'{per_step:.2f} ms per step')
  print(f"model calls per step: baseline {ms['target, 1 token']:.2f} ms, "
        f'speculative {model_calls:.2f} ms (gamma x draft + one target '
        f'call on gamma+1 tokens)')


if __name__ == '__main__':
  app.run(main)
