r"""Where a speculative iteration's time goes, with the shipped models.

  python scripts/iteration_costs.py --draft=t5_local_draft_tiny --gamma=3

Prints the machine (CPU model and a digest of its flags, backend) and the
path decoder products take (`kernels.available()`: the few-row kernel's
code path, or 'xla'), then the K-curve: what a target call scoring
K = 1 .. --max_k tokens costs in single-token steps, and c (measured
afresh, not read from the cache). Where the kernel runs, the K-curve is
measured for it with float32 and with bfloat16 product inputs
(`kernels.set_product_inputs`), on a CPU with AMX tiles also with float32
inputs on the FMA chain (`kernels.set_amx_enabled(False)`), and for XLA's
dots in one interleaved run,
so the single-token steps compare directly; under each kernel curve its
arithmetic floor: the call's multiply-adds at the CPU's measured peak rate
(`peak_rate.cc`, 2 threads) over the one-token step, below which no
kernel can bring a K-token call on this CPU (none for bfloat16 inputs on
AMX tiles, whose rate is far above the vector units'). --product_inputs says which
of the two the rest of the script uses. Then how far a row's logits in a
K-token call are from the same positions scored one token per call (max
|difference| per K, per path). Then, at batch 1 on one held-out En->De
input:
  * the decoder-call costs the analysis uses (target at 1 and gamma+1
    tokens, draft at 1 and 2 tokens; the draft's first step after an
    all-accepted iteration feeds 2), each timed inside a compiled loop as
    the decoders make them;
  * each whole decoder's fixed cost per call (encoders, cache set-up: what
    a call with max_decode_len=1 costs beyond its one step) and its cost
    per loop step, from the difference between a full-length call and a
    one-step call;
so the loop's own overhead beyond the model calls can be read off.

With --layer_profile, also where a K-token call's time goes: the K-curve of
the target cut to 0 decoder layers (embedding, final norm and logits) and
with all of them, so one decoder layer's cost at each K, its weight
streaming rate at K = 1 (the memory bound) and its arithmetic rate at the
largest K (the compute bound) can be read off.
"""

from typing import List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode import benchmark
from spec_decode import compile as compile_lib
from spec_decode import costs
from spec_decode import evaluation
from spec_decode import kernels
from spec_decode import pretrained
from spec_decode.data import tasks
from spec_decode.kernels import library
from spec_decode.model import init_cache
from spec_decode.model import parameter_count
from spec_decode.model import truncated_model
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding

FLAGS = flags.FLAGS
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_string('draft', 't5_local_draft_tiny', 'Shipped draft.')
flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.')
flags.DEFINE_integer('example', 3, 'Index of the En->De test example.')
flags.DEFINE_integer('max_decode_len', 48, 'Output limit.')
flags.DEFINE_integer('repeats', 9, 'Timed calls per decoder.')
flags.DEFINE_integer('max_k', 8, 'Largest chunk of the K-curve.')
flags.DEFINE_enum('product_inputs', kernels.product_inputs(),
                  list(kernels.PRODUCT_INPUTS),
                  "What the kernel's products take the activations as, for "
                  'everything after the K-curves.')
flags.DEFINE_bool('layer_profile', False, 'Also split each K-token call '
                  'into one decoder layer and the rest (about 1 min more).')


def layer_profile(target) -> None:
  """Prints one decoder layer's cost and the rest's, per K (see above)."""
  layers = target.config.num_decoder_layers
  empty = truncated_model(target, 0)
  probe = np.ones((1, 32), np.int32)
  use_kernel = kernels.enabled()
  ks = range(1, FLAGS.max_k + 1)
  measured = benchmark.decoder_call_seconds(
      {(name, k): (model, k, use_kernel)
       for name, model in (('no decoder layers', empty),
                           ('all layers', target)) for k in ks},
      probe, FLAGS.repeats)
  seconds = {name: np.asarray([measured[(name, k)] for k in ks])
             for name in ('no decoder layers', 'all layers')}
  rest = seconds['no decoder layers']
  layer = (seconds['all layers'] - rest) / layers
  layer_params = parameter_count(target.params['decoder']['layers_0'])
  prepared = target.decode_kernels
  if prepared is None:
    layer_bytes = layer_params * np.dtype(target.config.dtype).itemsize
  else:  # What the kernel streams per step: its panels.
    layer_bytes = sum(panels.nbytes for panels in jax.tree_util.tree_leaves(
        prepared['decoder']['layers_0']))
  print('K:                                     ' +
        ' '.join(f'{k:6d}' for k in ks))
  print('embedding + final norm + logits, ms:   ' +
        ' '.join(f'{1e3 * v:6.2f}' for v in rest))
  print(f'one decoder layer (of {layers}), ms:        ' +
        ' '.join(f'{1e3 * v:6.2f}' for v in layer))
  print('one decoder layer over its K = 1 cost: ' +
        ' '.join(f'{v / layer[0]:6.2f}' for v in layer))
  # Two flops per weight per token (the attention over the cache is small).
  print(f'a layer holds {layer_bytes / 1e6:.1f} MB of weights: streamed at '
        f'{layer_bytes / layer[0] / 1e9:.1f} GB/s at K = 1; '
        f'{2 * layer_params * FLAGS.max_k / layer[-1] / 1e9:.1f} GFLOP/s '
        f'at K = {FLAGS.max_k}')


def k_curves(target, draft, paths) -> None:
  """Prints the K-curve and c on each path, measured interleaved.

  Args:
    target: The target.
    draft: The draft.
    paths: Name -> the path as `benchmark.kernel_setting` takes it; the
      last is the one the others are compared with.
  """
  probe = np.ones((1, 32), np.int32)
  ks = range(1, FLAGS.max_k + 1)
  variants = {}
  for path, use_kernel in paths.items():
    variants.update({(path, 'target', k): (target, k, use_kernel)
                     for k in ks})
    variants[(path, 'draft', 1)] = (draft, 1, use_kernel)
  seconds = benchmark.decoder_call_seconds(variants, probe, FLAGS.repeats)
  macs = decoder_macs_per_token(target)
  for path, use_kernel in paths.items():
    step = seconds[(path, 'target', 1)]
    print(f'K-curve on {path} (target call on K tokens / one-token step, '
          f'batch 1; one-token step {1e3 * step:.2f} ms): ' +
          ' '.join(f'{k}:{seconds[(path, "target", k)] / step:.2f}'
                   for k in ks) +
          f'; c = {seconds[(path, "draft", 1)] / step:.4f}')
    # Without AVX512_BF16, bfloat16 inputs run on the float32 FMAs; on AMX
    # tiles no vector rate bounds them (no floor printed).
    amx = (isinstance(use_kernel, str) and kernels.uses_amx()
           and not use_kernel.endswith(benchmark.WITHOUT_AMX))
    rate = (library.peak_mac_rate(use_kernel.split()[0], threads=2)
            or library.peak_mac_rate('float32', threads=2)
            if isinstance(use_kernel, str) and not amx else None)
    if rate:
      print(f'  its arithmetic floor (the call\'s {macs / 1e6:.1f}M '
            f'multiply-adds per token at the measured peak of '
            f'{rate / 1e9:.1f} G/s on 2 threads, in one-token steps; no '
            f'kernel goes below it): ' + ' '.join(
                f'{k}:{max(1.0, k * macs / rate / step):.2f}' for k in ks))
  last = list(paths)[-1]
  for path in list(paths)[:-1]:
    print(f'one-token step, {path} over {last}: '
          f'{seconds[(path, "target", 1)] / seconds[(last, "target", 1)]:.2f}')


def decoder_macs_per_token(model) -> int:
  """Multiply-adds of one decoder position's products: every decoder
  kernel, the logits layer's included, but the cross-attention keys and
  values (projected once per call from the encoder's output)."""
  leaves = jax.tree_util.tree_leaves_with_path(model.params['decoder'])
  total = 0
  for path, leaf in leaves:
    names = [getattr(entry, 'key', '') for entry in path]
    if names[-1] != 'kernel':
      continue
    if 'encoder_decoder_attention' in names and (
        'key' in names or 'value' in names):
      continue
    total += int(np.prod(leaf.shape))
  return total


def chunk_consistency(model, enc, use_kernel: bool) -> List[float]:
  """Max |logit difference|, per K, between one call on K tokens and the
  same K positions scored one call each (from the same cache)."""
  config = model.config
  tokens = jnp.asarray(np.random.RandomState(0).randint(
      2, config.vocab_size, (enc.shape[0], 16)), jnp.int32)
  with kernels.enabled_as(use_kernel):
    prepared = model.decode_kernels
  encoded = prepare_decoding(config, model.params, jnp.asarray(enc))
  step = jax.jit(lambda t, s, c: decode_chunk(config, model.params, t, s, c,
                                              encoded, prepared),
                 compiler_options=compile_lib.CPU_COMPILER_OPTIONS)
  start = jnp.zeros((enc.shape[0],), jnp.int32)
  # Positions 0..7 fed one at a time fill the cache both ways start from.
  cache = init_cache(config, enc.shape[0], 32)
  for i in range(8):
    _, cache = step(tokens[:, i:i + 1], start + i, cache)
  differences = []
  for k in range(1, FLAGS.max_k + 1):
    together, _ = step(tokens[:, 8:8 + k], start + 8, cache)
    one_by_one, single_cache = [], cache
    for i in range(k):
      logits, single_cache = step(tokens[:, 8 + i:9 + i], start + 8 + i,
                                  single_cache)
      one_by_one.append(logits)
    differences.append(float(jnp.max(jnp.abs(
        together - jnp.concatenate(one_by_one, axis=1)))))
  return differences


def main(argv):
  del argv
  target = pretrained.load(FLAGS.target)
  draft = pretrained.load(FLAGS.draft)
  print(costs.machine_line())
  kernels.set_product_inputs(FLAGS.product_inputs)
  path = kernels.available()
  print(f'decoder products: {path}' + (
      '' if path != 'xla' else ' (kernel switched off, not built, or not '
      'on a CPU)'))
  if path == 'xla':
    k_curves(target, draft, {'xla': False})
  else:
    curves = {}
    for inputs in kernels.PRODUCT_INPUTS:
      with kernels.product_inputs_as(inputs):
        curves[kernels.available()] = inputs
        if inputs == 'float32' and kernels.uses_amx():
          # The FMA chain beside the tiles.
          with kernels.amx_enabled_as(False):
            curves[kernels.available()] = (
                f'{inputs} {benchmark.WITHOUT_AMX}')
    curves['xla'] = False
    k_curves(target, draft, curves)
  source = tasks.load_pairs('translate_en_de', 'test')[FLAGS.example][0]
  enc = evaluation.trim_padding(evaluation.encode_inputs(
      pretrained.vocabulary(), 'translate_en_de', [source], 64))
  for use_kernel in ((True, False) if path != 'xla' else (False,)):
    differences = chunk_consistency(target, enc, use_kernel)
    print(f'max |logits of a K-token call - K one-token calls| on '
          f'{path if use_kernel else "xla"}: ' +
          ' '.join(f'{k}:{d:.2g}' for k, d in enumerate(differences, 1)))
  if FLAGS.layer_profile:
    layer_profile(target)
  calls = {
      'target, 1 token': (target, 1),
      f'target, {FLAGS.gamma + 1} tokens': (target, FLAGS.gamma + 1),
      'draft, 1 token': (draft, 1),
      'draft, 2 tokens': (draft, 2),
  }
  ms = {name: 1e3 * benchmark.decoder_step_seconds(model, enc, k, 20)
        for name, (model, k) in calls.items()}
  for name, value in ms.items():
    print(f'decoder call, {name}: {value:.2f} ms')

  results = {}

  def decoder(name, max_decode_len, **kwargs):
    def run():
      results[name] = sd.generate(target, enc, max_decode_len=max_decode_len,
                                  **kwargs)
      return results[name].tokens
    return run

  speculative = dict(draft=draft, gamma=FLAGS.gamma)
  timings = benchmark.interleaved_timings(
      {'baseline': decoder('baseline', FLAGS.max_decode_len),
       'baseline, 1 step': decoder('baseline, 1 step', 1),
       'speculative': decoder('speculative', FLAGS.max_decode_len,
                              **speculative),
       'speculative, 1 step': decoder('speculative, 1 step', 1,
                                      **speculative)},
      repeats=FLAGS.repeats, warmup=1)
  per_step = {}
  for name in ('baseline', 'speculative'):
    steps = int(np.asarray(results[name].num_iterations))
    full = benchmark.median(timings[name])
    one = benchmark.median(timings[f'{name}, 1 step'])
    per_step[name] = 1e3 * (full - one) / max(steps - 1, 1)
    print(f'{name}: {steps} loop steps for '
          f'{int(np.asarray(results[name].lengths)[0])} tokens in '
          f'{1e3 * full:.1f} ms: {per_step[name]:.2f} ms per step, fixed '
          f'cost per call {1e3 * one - per_step[name]:.1f} ms')
  model_calls = (FLAGS.gamma * ms['draft, 1 token']
                 + ms[f'target, {FLAGS.gamma + 1} tokens'])
  print(f"model calls per step: baseline {ms['target, 1 token']:.2f} ms, "
        f'speculative {model_calls:.2f} ms (gamma x draft + one target '
        f'call on gamma+1 tokens)')
  for name, calls_ms in (('baseline', ms['target, 1 token']),
                         ('speculative', model_calls)):
    print(f'{name} loop overhead beyond model calls: '
          f'{per_step[name] - calls_ms:.2f} ms per step')


if __name__ == '__main__':
  app.run(main)
