r"""The floor under a K-token decoder call: its matrix products alone.

  python scripts/k_token_dots.py

A decoder call on K tokens per row multiplies K-row activations by every
kernel of the decoder (per layer: self-attention q/k/v/out, cross-attention
q/out, wi_0/wi_1/wo; then the logits layer). This script keeps only those
products, chained as the decoder chains them (residual sums and the gated
MLP's product; no attention, norms or cache), with the shipped target's real
weights, and times the chain at K = 1 .. --max_k in one compiled call:

  * on XLA's dots with the project's CPU options
    (`compile.CPU_COMPILER_OPTIONS`) and with XLA's defaults, with T5X's
    kernel layout [in, out] (`x @ W`) and with each kernel stored
    transposed, [out, in] (`W_t @ x^T`: the small K becomes the product's
    minor output dimension);
  * on the few-row kernel (`spec_decode.kernels`), with bfloat16 panels
    (what decoding uses for the shipped models, whose weights are bfloat16
    values) and float32 panels on the vector units' FMA chain; on a CPU with
    AMX, bfloat16 panels on the tiles with float32 inputs split into
    bfloat16 parts (what decoding uses there); and with bfloat16 inputs
    (`kernels.set_product_inputs('bfloat16')`: activations rounded at each
    product, VDPBF16PS where the CPU has AVX512_BF16).

All settings take turns at each K (interleaved, after warm-up; medians).
Printed: the machine and the kernel's code path, then per setting the
chain's time at each K over its own K = 1 time, its K = 1 time and
streaming rate, and each setting's time over the XLA-defaults [in, out]
row at each K (where the kernel stops paying: `kernels.MAX_ROWS`). A
decoder call cannot cost less, in single steps, than the best of these
rows allows, whatever is done around the products. Last, the arithmetic
floor: the CPU's peak multiply-add rate, measured on 1 and 2 threads
(float32 FMAs; bfloat16 dot products where the CPU has AVX512_BF16), and
what K rows of the chain's weights cost at that rate in single K = 1
chains: past the K where it reaches 1, no kernel can keep a K-token call at
one step's cost on this CPU. --output writes the milliseconds as JSON.

  python scripts/k_token_dots.py --ks=1,2,3,4,5,6,7,8,16,32,64,96,128
"""

import json
from typing import Callable, Dict, List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import benchmark
from spec_decode import compile as compile_lib
from spec_decode import costs
from spec_decode import kernels
from spec_decode.kernels import library
from spec_decode import pretrained

FLAGS = flags.FLAGS
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_list('ks', ['1', '2', '3', '4', '5', '6', '7', '8'],
                  'Rows (tokens) per product.')
flags.DEFINE_integer('repeats', 15, 'Timed calls per K and setting.')
flags.DEFINE_string('output', None, 'Write the milliseconds as JSON here.')

LAYER_KERNELS = (('self_attention', 'query'), ('self_attention', 'key'),
                 ('self_attention', 'value'), ('self_attention', 'out'),
                 ('encoder_decoder_attention', 'query'),
                 ('encoder_decoder_attention', 'out'),
                 ('mlp', 'wi_0'), ('mlp', 'wi_1'), ('mlp', 'wo'))


def decoder_kernels(params) -> List[Dict[str, jax.Array]]:
  """Per layer, the kernels a decoder step multiplies by; then logits."""
  decoder = params['decoder']
  layers = sorted((k for k in decoder if k.startswith('layers_')),
                  key=lambda k: int(k.split('_')[1]))
  chain = [{f'{block}/{name}': decoder[layer][block][name]['kernel']
            for block, name in LAYER_KERNELS} for layer in layers]
  chain.append({'logits': decoder['logits_dense']['kernel']})
  return chain


def dot_chain(mul: Callable) -> Callable:
  """The decoder's products on x [K, emb], each as `mul(x, kernel)`."""
  def run(x, chain):
    for layer in chain[:-1]:
      get = lambda name, layer=layer: layer[name]
      qkv = (mul(x, get('self_attention/query')) +
             mul(x, get('self_attention/key')) +
             mul(x, get('self_attention/value')))
      x = x + mul(qkv, get('self_attention/out'))
      x = x + mul(mul(x, get('encoder_decoder_attention/query')),
                  get('encoder_decoder_attention/out'))
      hidden = mul(x, get('mlp/wi_0')) * mul(x, get('mlp/wi_1'))
      x = x + mul(hidden, get('mlp/wo'))
    return mul(x, chain[-1]['logits'])
  return run


def _transposed_product(x, kernel):
  # kernel [out, in]: (kernel @ x^T)^T, K minor in the dot.
  return jax.lax.dot_general(kernel, x, (((1,), (1,)), ((), ()))).T


def settings(chain) -> Dict[str, tuple]:
  """Name -> (jitted chain, its kernels)."""
  chain_t = jax.tree_util.tree_map(lambda w: jnp.asarray(np.asarray(w).T),
                                   chain)
  result = {}
  for options_name, options in (
      ('XLA, project options', compile_lib.CPU_COMPILER_OPTIONS),
      ('XLA defaults', None)):
    result[f'{options_name}, [in, out]'] = (
        jax.jit(dot_chain(lambda x, w: x @ w), compiler_options=options),
        chain)
    result[f'{options_name}, [out, in]'] = (
        jax.jit(dot_chain(_transposed_product), compiler_options=options),
        chain_t)
  if kernels.enabled():
    # One jitted chain: each packing below is its own argument layout.
    kernel_chain = jax.jit(dot_chain(kernels.matmul),
                           compiler_options=compile_lib.CPU_COMPILER_OPTIONS)
    for dtype in (jnp.bfloat16, jnp.float32):
      result[f'few-row kernel, {jnp.dtype(dtype).name} panels'] = (
          kernel_chain, jax.tree_util.tree_map(
              lambda w, dtype=dtype: kernels.pack_kernel(w, dtype), chain))
    if kernels.uses_amx():
      # What decoding runs on such a CPU: float32 inputs split into
      # bfloat16 parts on the tiles (the weights are bfloat16 values).
      result['few-row kernel, bfloat16 panels, AMX tiles'] = (
          kernel_chain, jax.tree_util.tree_map(
              lambda w: kernels.pack_kernel(w, jnp.bfloat16, amx=True),
              chain))
    result['few-row kernel, bfloat16 inputs'] = (
        kernel_chain, jax.tree_util.tree_map(
            lambda w: kernels.pack_kernel(w, inputs='bfloat16'), chain))
  return result


def main(argv):
  del argv
  machine = costs.machine_description()
  print(costs.machine_line())
  print(f'few-row kernel: {kernels.available()}')
  target = pretrained.load(FLAGS.target)
  chain = decoder_kernels(target.params)
  weight_bytes = sum(w.size * w.dtype.itemsize
                     for w in jax.tree_util.tree_leaves(chain))
  print(f'{weight_bytes / 1e6:.1f} MB of float32 kernels per decoder step')
  ks = [int(k) for k in FLAGS.ks]
  rng = np.random.RandomState(0)
  chains = settings(chain)
  ms = {name: [] for name in chains}
  for k in ks:
    x = jnp.asarray(rng.randn(k, target.config.emb_dim), jnp.float32)
    timings = benchmark.interleaved_timings(
        {name: (lambda fn=fn, weights=weights: fn(x, weights))
         for name, (fn, weights) in chains.items()}, FLAGS.repeats)
    for name in chains:
      ms[name].append(1e3 * benchmark.median(timings[name]))
    print(f'K = {k}: ' + ', '.join(f'{name} {ms[name][-1]:.2f} ms'
                                    for name in chains), flush=True)
  width = max(len(name) for name in chains) + 2
  print('\ntime at K over the same setting at K = 1')
  print('K:'.ljust(width) + ''.join(f'{k:7d}' for k in ks))
  for name in chains:
    bytes_per_step = weight_bytes / (2 if 'bfloat16' in name else 1)
    print(f'{name}:'.ljust(width) +
          ''.join(f'{m / ms[name][0]:7.2f}' for m in ms[name]) +
          f'   (K = 1: {ms[name][0]:.2f} ms, '
          f'{bytes_per_step / ms[name][0] / 1e6:.1f} GB/s)')
  reference = 'XLA defaults, [in, out]'
  print(f'\ntime over {reference} at the same K')
  for name in chains:
    print(f'{name}:'.ljust(width) + ''.join(
        f'{m / r:7.2f}' for m, r in zip(ms[name], ms[reference])))
  floors = arithmetic_floors(weight_bytes // 4, ks, ms)
  if FLAGS.output:
    with open(FLAGS.output, 'w') as f:
      json.dump({'machine': machine, 'kernel': kernels.available(),
                 'ks': ks, 'milliseconds': ms, 'arithmetic_floors': floors},
                f, indent=1)


def arithmetic_floors(weights: int, ks, ms) -> dict:
  """Prints (and returns) the least time K rows' multiply-adds take at the
  CPU's measured peak rate, over the fastest K = 1 product chain."""
  rates = {}
  for kind in ('float32', 'bfloat16'):
    for threads in (1, 2):
      rate = library.peak_mac_rate(kind, threads)
      if rate:
        rates[f'{kind}, {threads} thread{"s" if threads > 1 else ""}'] = rate
  if not rates:
    print('\n(no measured multiply-add rate: the kernel library is not '
          'built here)')
    return {}
  step = min(values[0] for values in ms.values())
  print('\nmeasured peak multiply-add rates: ' + ', '.join(
      f'{name} {rate / 1e9:.1f} G/s' for name, rate in rates.items()))
  shared = rates.get('float32, 2 threads', 0) < 1.2 * rates.get(
      'float32, 1 thread', 1e30)
  if shared:
    print("(2 threads no faster than 1: this machine's CPUs share one "
          "core's vector units)")
  print(f'K rows x {weights / 1e6:.1f}M weights at the best rate of each '
        f'kind, over the fastest K = 1 chain ({step:.2f} ms):')
  floors = {}
  for kind in ('float32', 'bfloat16'):
    best = max((rate for name, rate in rates.items()
                if name.startswith(kind)), default=None)
    if best is None:
      continue
    floors[kind] = [k * weights / best * 1e3 / step for k in ks]
    print(f'  {kind} inputs:'.ljust(20) + ''.join(
        f'{value:7.2f}' for value in floors[kind]))
  return floors


if __name__ == '__main__':
  app.run(main)
