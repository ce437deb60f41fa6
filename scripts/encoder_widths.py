r"""A decoding call's encoder over the used columns only, against every column.

  python scripts/encoder_widths.py
  python scripts/encoder_widths.py --input_length=128 --num_calls=16

Takes the main job's committed test inputs (--num_calls per task), padded to
--input_length columns as T5X pads to a task's feature length (as the
main job decodes them), and decodes
each at batch 1, greedy, with the baseline and with a fixed --gamma, once
with the encoder pass trimmed to the smallest compiled width covering the
input (`spec_decode.model.encoder_widths`, the default on one CPU device)
and once over every column (`encoder_widths.trimming(False)`): all four
programs compiled first, then timed in turn per input (interleaved,
medians of --repeats). Also the encoder pass alone (encoder and
cross-attention projections), both ways.

Prints the machine and the decoder products' path, then per task: ms per
call of each variant, the full pass over the trimmed one, the inputs'
mean used columns, and whether the outputs are identical (tokens, and the
largest difference of their log-probabilities). --output writes it as JSON.
"""

import json

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode import benchmark
from spec_decode import costs
from spec_decode import evaluation
from spec_decode import pretrained
from spec_decode.data import tasks
from spec_decode.model import encoder_widths
from spec_decode.model.model import prepare_decoding

FLAGS = flags.FLAGS
flags.DEFINE_list('tasks', ['translate_en_de', 'summarize'], 'Tasks.')
flags.DEFINE_integer('num_calls', 32, 'Inputs per task (batch 1 each).')
flags.DEFINE_integer('input_length', 64, 'Encoder inputs padded to this.')
flags.DEFINE_integer('max_decode_len', 48, 'Output limit.')
flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration (speculative).')
flags.DEFINE_integer('repeats', 5, 'Timed calls per input and variant.')
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_string('draft', 't5_local_draft_tiny', 'Shipped draft.')
flags.DEFINE_string('output', None, 'Write the figures as JSON here.')


def _encoder_pass(model, trim: bool):
  """The encoder pass alone, compiled for one setting (a new function per
  call, so each setting gets its own trace)."""
  encode = jax.jit(lambda params, tokens, prepared: prepare_decoding(
      model.config, params, tokens, prepared))

  # Traced at its first call: the setting must hold there.
  def run(tokens):
    with encoder_widths.trimming(trim):
      return encode(model.device_params, tokens, model.decode_kernels)
  return run


def measure(target, draft, enc: np.ndarray):
  """One task: every variant on every input."""
  variants = {}
  for trim, name in ((True, 'trimmed'), (False, 'full')):
    variants[f'baseline {name}'] = (trim, {})
    variants[f'gamma {FLAGS.gamma} {name}'] = (trim, dict(
        draft=draft, gamma=FLAGS.gamma))
  passes = {f'encoder {name}': _encoder_pass(target, trim)
            for trim, name in ((True, 'trimmed'), (False, 'full'))}
  results = {}

  def run(name, index):
    trim, options = variants[name]

    def call():
      with encoder_widths.trimming(trim):
        result = sd.generate(target, enc[index:index + 1],
                             max_decode_len=FLAGS.max_decode_len, **options)
      results[(name, index)] = result
      return result.tokens
    return call

  def encode(name, index):
    tokens = jnp.asarray(enc[index:index + 1])
    return lambda: passes[name](tokens).cross_keys[-1]

  seconds = {name: [] for name in (*variants, *passes)}
  for index in range(len(enc)):
    calls = {name: run(name, index) for name in variants}
    calls.update({name: encode(name, index) for name in passes})
    timings = benchmark.interleaved_timings(
        calls, FLAGS.repeats, warmup=1 if index == 0 else 0,
        start=index * FLAGS.repeats)
    for name in seconds:
      seconds[name].append(benchmark.median(timings[name]))
  ms_per_call = {name: 1e3 * float(np.mean(s)) for name, s in seconds.items()}
  identical, logprob_difference = True, 0.0
  for index in range(len(enc)):
    for kind in ('baseline', f'gamma {FLAGS.gamma}'):
      got = results[(f'{kind} trimmed', index)]
      want = results[(f'{kind} full', index)]
      identical &= bool(np.array_equal(np.asarray(got.tokens),
                                       np.asarray(want.tokens)))
      logprob_difference = max(logprob_difference, float(np.max(np.abs(
          np.asarray(got.token_logprobs) - np.asarray(want.token_logprobs)))))
  used = np.asarray([int(encoder_widths.used_columns(jnp.asarray(row[None])))
                     for row in enc])
  return {
      'ms_per_call': ms_per_call,
      'full_over_trimmed': {
          kind: ms_per_call[f'{kind} full'] / ms_per_call[f'{kind} trimmed']
          for kind in ('baseline', f'gamma {FLAGS.gamma}', 'encoder')},
      'mean_used_columns': float(used.mean()),
      'widths': list(encoder_widths.widths(enc.shape[1])),
      'outputs_identical': identical,
      'max_logprob_difference': logprob_difference,
  }


def main(argv):
  del argv
  report = costs.timing_report({name: FLAGS[name].value for name in (
      'num_calls', 'input_length', 'max_decode_len', 'gamma', 'repeats')})
  report['rows'] = []
  target = pretrained.load(FLAGS.target)
  draft = pretrained.load(FLAGS.draft)
  vocabulary = pretrained.vocabulary()
  for task in FLAGS.tasks:
    pairs = tasks.load_pairs(task, 'test')
    sources = [pairs[i % len(pairs)][0] for i in range(FLAGS.num_calls)]
    enc = evaluation.encode_inputs(vocabulary, task, sources,
                                   FLAGS.input_length)
    row = {'task': task, **measure(target, draft, enc)}
    report['rows'].append(row)
    print(f"\n{task}: {row['mean_used_columns']:.1f} of {FLAGS.input_length}"
          f" columns used on average (widths {row['widths']})")
    for name, ms in row['ms_per_call'].items():
      print(f'  {name:24s} {ms:7.2f} ms per call')
    print('  full pass over trimmed: ' + ', '.join(
        f'{kind} {ratio:.3f}x'
        for kind, ratio in row['full_over_trimmed'].items()))
    print(f"  outputs identical: {row['outputs_identical']} (largest "
          f"log-probability difference {row['max_logprob_difference']:.2g})",
          flush=True)
  if FLAGS.output:
    with open(FLAGS.output, 'w') as f:
      json.dump(report, f, indent=1)


if __name__ == '__main__':
  app.run(main)
