r"""Latency of baseline and speculative decoding with random-weight models.

Prints (and writes as JSON) the per-token latency of baseline decoding at each
batch size, and, with a draft, the target calls, tokens per target call and
per-token latency of speculative decoding measured in the same run
(interleaved, after compilation, medians).

  python scripts/benchmark_decoding.py --batch_sizes=1,8
  python scripts/benchmark_decoding.py --batch_sizes=1 --draft=truncated --gamma=4

Random weights give a target and draft that rarely agree unless the draft
shares the target's weights (`--draft=truncated` keeps the target's first
decoder layer), so these figures measure the machinery, not a trained pair.
"""

import json
import os

from absl import app
from absl import flags
import jax
import numpy as np

import spec_decode as sd
from spec_decode import benchmark
from spec_decode.model import truncated_model

FLAGS = flags.FLAGS
flags.DEFINE_string('target', 't5_1_1_small', 'Target preset.')
flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'],
                  'Activation dtype (float32 is faster on CPU).')
flags.DEFINE_list('batch_sizes', ['1', '8'], 'Batch sizes to measure.')
flags.DEFINE_integer('input_len', 32, 'Encoder input length.')
flags.DEFINE_integer('max_decode_len', 64, 'Tokens decoded per row.')
flags.DEFINE_integer('repeats', 5, 'Timed calls per variant.')
flags.DEFINE_enum('draft', 'none', ['none', 'truncated', 'tiny'],
                  'none: baseline only; truncated: the target cut to '
                  '--draft_layers decoder layers; tiny: a small random model.')
flags.DEFINE_integer('draft_layers', 1, 'Decoder layers of a truncated draft.')
flags.DEFINE_integer('gamma', 4, 'Draft tokens per iteration.')
flags.DEFINE_float('temperature', 0.0, 'Sampling temperature.')
flags.DEFINE_string('output', '', 'Write the figures to this JSON file.')


def make_draft(target: sd.Model) -> sd.Model:
  if FLAGS.draft == 'truncated':
    return truncated_model(target, FLAGS.draft_layers)
  config = sd.T5Config(vocab_size=target.config.vocab_size, emb_dim=64,
                       num_heads=2, head_dim=32, mlp_dim=128,
                       num_encoder_layers=1, num_decoder_layers=1,
                       dtype=FLAGS.dtype)
  return sd.Model(config, sd.init_params(config, jax.random.PRNGKey(1)))


def main(argv):
  del argv
  print(f'jax {jax.__version__} on {jax.devices()[0].device_kind}')
  config = sd.t5_config(FLAGS.target, dtype=FLAGS.dtype)
  target = sd.Model(config, sd.init_params(config, jax.random.PRNGKey(0)))
  draft = None if FLAGS.draft == 'none' else make_draft(target)
  print(f'target: {target}')
  if draft is not None:
    print(f'draft:  {draft}')
  rows = []
  for batch in map(int, FLAGS.batch_sizes):
    enc = np.random.RandomState(batch).randint(
        2, config.vocab_size, size=(batch, FLAGS.input_len)).astype(np.int32)
    # eos_id 0 is never sampled by these models, so every row runs the full
    # length and per-token figures compare like with like.
    common = dict(max_decode_len=FLAGS.max_decode_len, eos_id=0,
                  temperature=FLAGS.temperature,
                  rng=jax.random.PRNGKey(0))
    fns = {'baseline': lambda: sd.generate(target, enc, **common).tokens}
    if draft is not None:
      fns['speculative'] = lambda: sd.generate(
          target, enc, draft=draft, gamma=FLAGS.gamma, **common).tokens
    timings = benchmark.interleaved_timings(fns, FLAGS.repeats)
    row = {'batch_size': batch, 'max_decode_len': FLAGS.max_decode_len}
    tokens = FLAGS.max_decode_len
    row['baseline_ms_per_token'] = 1e3 * benchmark.median(
        timings['baseline']) / tokens
    if draft is not None:
      result = sd.generate(target, enc, draft=draft, gamma=FLAGS.gamma,
                           **common)
      row.update(
          gamma=FLAGS.gamma,
          speculative_ms_per_token=1e3 * benchmark.median(
              timings['speculative']) / tokens,
          target_calls=float(np.mean(result.target_calls)),
          tokens_per_target_call=float(np.mean(
              result.tokens_per_target_call)),
          acceptance_rate=float(np.mean(result.acceptance_rate)),
          mean_beta=float(np.mean(result.mean_beta)))
      row['speedup'] = (row['baseline_ms_per_token']
                        / row['speculative_ms_per_token'])
    rows.append(row)
    print(' '.join(f'{k}={v:.3f}' if isinstance(v, float) else f'{k}={v}'
                   for k, v in row.items()), flush=True)
  if FLAGS.output:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output)), exist_ok=True)
    with open(FLAGS.output, 'w') as f:
      json.dump({'target': FLAGS.target, 'draft': FLAGS.draft,
                 'dtype': FLAGS.dtype, 'device': jax.devices()[0].device_kind,
                 'rows': rows}, f, indent=2)
    print(f'wrote {FLAGS.output}')


if __name__ == '__main__':
  app.run(main)
