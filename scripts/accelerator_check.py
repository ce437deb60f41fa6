r"""Speculative decoding at T5-XL/XXL shapes on one accelerator, in minutes.

  python scripts/accelerator_check.py --output_json=output/accelerator.json
  python scripts/accelerator_check.py --targets=t5_1_1_tiny \
      --draft=t5_1_1_tiny --max_decode_len=8     # the CPU smoke test

Random bfloat16 weights of T5X's shapes (latency does not depend on the
values), batch 1, greedy. For each target it prints and records:
  * XLA's memory plan for the compiled loop (arguments, outputs and
    temporaries from `compile().memory_analysis()`) next to the device's
    measured peak (`memory_stats()`, where the backend reports one);
  * per-token latency of baseline decoding;
  * speculative decoding with the target as its own draft: every proposal is
    accepted, so this is the gamma + 1 tokens-per-call ceiling;
  * speculative decoding with a T5-small-shaped draft: random models never
    agree, so each iteration emits one token and costs gamma draft steps plus
    one (gamma + 1)-token target call. From it and the draft's own baseline
    latency follow c (draft step / target step) and the cost of scoring
    gamma + 1 tokens in target steps.
Outputs run to `max_decode_len` (the EOS id is set out of the vocabulary).
Each configuration is skipped, and said so, when `--deadline_seconds` would
not leave room for it.
"""

import functools
import json
import os
import platform
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import benchmark
from spec_decode import decoding
from spec_decode import speculative
from spec_decode.model import config as config_lib
from spec_decode.model import model as model_lib
from spec_decode.sampling import SamplingConfig

FLAGS = flags.FLAGS
flags.DEFINE_list('targets', ['t5_1_1_xl', 't5_1_1_xxl'], 'Target presets.')
flags.DEFINE_string('draft', 't5_1_1_small', 'Draft preset.')
flags.DEFINE_integer('gamma', 4, 'Draft tokens per iteration.')
flags.DEFINE_integer('max_decode_len', 64, 'Output tokens per call.')
flags.DEFINE_integer('enc_len', 64, 'Encoder input length.')
flags.DEFINE_integer('repeats', 3, 'Timed calls per decoder (median).')
flags.DEFINE_string('dtype', 'bfloat16', 'Parameter and activation dtype.')
flags.DEFINE_float('deadline_seconds', 1e9,
                   'Skip what would start after this many seconds.')
flags.DEFINE_string('output_json', None, 'Where to write the figures.')


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _normal(key, shape, scale, dtype):
  return (jax.random.normal(key, shape) * scale).astype(dtype)


def random_params(config, seed: int, dtype):
  """Random parameters of T5X's shapes, made on the device leaf by leaf."""
  shapes = model_lib.param_shapes(config)
  leaves, treedef = jax.tree_util.tree_flatten(shapes)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  made = []
  for key, leaf in zip(keys, leaves):
    fan_in = leaf.shape[0] if len(leaf.shape) == 2 else 1
    made.append(_normal(key, tuple(leaf.shape), float(1.0 / np.sqrt(fan_in)),
                        dtype))
  return jax.tree_util.tree_unflatten(treedef, made)


def nbytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize
                 for x in jax.tree_util.tree_leaves(tree)))


def compile_decoder(fn, static_argnums, args):
  """Compiles `fn` for `args`; returns (callable on dynamic args, plan)."""
  start = time.time()
  compiled = jax.jit(fn, static_argnums=static_argnums).lower(*args).compile()
  analysis = compiled.memory_analysis()
  plan = {'compile_seconds': time.time() - start}
  if analysis is not None:
    for field in ('argument_size_in_bytes', 'output_size_in_bytes',
                  'temp_size_in_bytes', 'generated_code_size_in_bytes'):
      plan[field] = int(getattr(analysis, field, 0) or 0)
  dynamic = [a for i, a in enumerate(args) if i not in static_argnums]
  return (lambda: compiled(*dynamic)), plan


def peak_bytes():
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def median_seconds(fn, repeats: int) -> float:
  jax.block_until_ready(fn())  # warm-up
  times = [benchmark.time_call(fn) for _ in range(repeats)]
  return benchmark.median(times)


def main(argv):
  del argv
  start = time.time()
  dtype = {'bfloat16': jnp.bfloat16, 'float32': jnp.float32}[FLAGS.dtype]
  device = jax.devices()[0]
  report = {'device': str(device.device_kind), 'backend': jax.default_backend(),
            'host': platform.processor() or platform.machine(),
            'jax': jax.__version__, 'gamma': FLAGS.gamma,
            'max_decode_len': FLAGS.max_decode_len, 'enc_len': FLAGS.enc_len,
            'dtype': FLAGS.dtype, 'rows': []}
  print(f"device: {report['device']} ({report['backend']})", flush=True)

  def write():
    if FLAGS.output_json:
      os.makedirs(os.path.dirname(os.path.abspath(FLAGS.output_json)),
                  exist_ok=True)
      with open(FLAGS.output_json, 'w') as f:
        json.dump(report, f, indent=1)

  def time_left():
    return FLAGS.deadline_seconds - (time.time() - start)

  sampling = SamplingConfig(0.0)
  length = FLAGS.max_decode_len
  draft_config = config_lib.t5_config(FLAGS.draft, dtype=FLAGS.dtype)
  draft_params = random_params(draft_config, 1, dtype)
  rng = jax.random.PRNGKey(0)
  tokens = jnp.asarray(np.random.RandomState(0).randint(
      2, draft_config.vocab_size, (1, FLAGS.enc_len)), jnp.int32)
  eos = draft_config.vocab_size  # Never produced: outputs run full length.
  draft_fn, _ = compile_decoder(
      decoding.baseline_generate.__wrapped__, (0, 4, 5),
      (draft_config, draft_params, tokens, rng, length, sampling, eos))
  draft_token = median_seconds(draft_fn, FLAGS.repeats) / length
  report['draft'] = {'preset': FLAGS.draft, 'bytes': nbytes(draft_params),
                     'baseline_ms_per_token': 1e3 * draft_token}
  print(f'draft {FLAGS.draft}: {1e3 * draft_token:.2f} ms/token', flush=True)
  write()

  for name in FLAGS.targets:
    config = config_lib.t5_config(name, dtype=FLAGS.dtype)
    params = random_params(config, 0, dtype)
    row = {'target': name, 'parameter_bytes': nbytes(params)}
    report['rows'].append(row)
    runs = {
        'baseline': (decoding.baseline_generate.__wrapped__, (0, 4, 5),
                     (config, params, tokens, rng, length, sampling, eos)),
        'self_draft': (speculative._speculative_generate.__wrapped__,  # pylint: disable=protected-access
                       (0, 1, 6, 7, 9, 10),
                       (config, config, params, params, tokens, rng, length,
                        sampling, eos, FLAGS.gamma, 1.0)),
        'small_draft': (speculative._speculative_generate.__wrapped__,  # pylint: disable=protected-access
                        (0, 1, 6, 7, 9, 10),
                        (config, draft_config, params, draft_params, tokens,
                         rng, length, sampling, eos, FLAGS.gamma, 1.0)),
    }
    for run, (fn, static, args) in runs.items():
      budget = 60.0 * (2.0 if 'xxl' in name else 1.0)
      if time_left() < budget:
        row[run] = f'skipped: {time_left():.0f} s left'
        print(f'{name} {run}: skipped ({time_left():.0f} s left)', flush=True)
        continue
      call, plan = compile_decoder(fn, static, args)
      seconds = median_seconds(call, FLAGS.repeats)
      result = call()
      plan.update({'ms_per_token': 1e3 * seconds / length,
                   'target_calls': int(np.asarray(result.target_calls)[0]),
                   'measured_peak_bytes': peak_bytes()})
      row[run] = plan
      print(f'{name} {run}: {plan}', flush=True)
      write()
    base, small = row.get('baseline'), row.get('small_draft')
    if isinstance(base, dict) and isinstance(small, dict):
      target_step = base['ms_per_token']
      row['c'] = report['draft']['baseline_ms_per_token'] / target_step
      # One token per iteration: gamma draft steps + one verification call.
      verify_ms = (small['ms_per_token'] -
                   FLAGS.gamma * report['draft']['baseline_ms_per_token'])
      row['verify_cost_in_target_steps'] = verify_ms / target_step
    if isinstance(base, dict) and isinstance(row.get('self_draft'), dict):
      row['self_draft_speedup'] = (base['ms_per_token'] /
                                   row['self_draft']['ms_per_token'])
    print(f"{name}: c={row.get('c')}, verify cost="
          f"{row.get('verify_cost_in_target_steps')}, self-draft speedup="
          f"{row.get('self_draft_speedup')}", flush=True)
    del params
    write()
  print(f'done in {time.time() - start:.0f} s', flush=True)


if __name__ == '__main__':
  app.run(main)
