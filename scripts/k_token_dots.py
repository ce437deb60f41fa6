r"""The floor under a K-token decoder call: its matrix products alone.

  python scripts/k_token_dots.py

A decoder call on K tokens per row multiplies K-row activations by every
kernel of the decoder (per layer: self-attention q/k/v/out, cross-attention
q/out, wi_0/wi_1/wo; then the logits layer). This script keeps only those
products, chained as the decoder chains them (residual sums and the gated
MLP's product; no attention, norms or cache), with the shipped target's real
weights, and times the chain at K = 1 .. --max_k in one compiled call:

  * with the project's CPU options (`compile.CPU_COMPILER_OPTIONS`) and
    with XLA's defaults;
  * with T5X's kernel layout [in, out] (`x @ W`), and with each kernel
    stored transposed, [out, in] (`W_t @ x^T`: the small K becomes the
    product's minor output dimension).

Printed: the machine, then per setting the chain's time at each K over its
own K = 1 time. A decoder call cannot cost less, in single steps, than the
best of these rows allows, whatever is done around the products; the
dots at K = 1 stream the weights at the machine's memory bandwidth, which
is also printed.
"""

import time
from typing import Callable, Dict, List

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import compile as compile_lib
from spec_decode import costs
from spec_decode import pretrained

FLAGS = flags.FLAGS
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_integer('max_k', 8, 'Largest K.')
flags.DEFINE_integer('repeats', 15, 'Timed calls per K (median).')

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


def dot_chain(transposed: bool) -> Callable:
  """The decoder's products on x [K, emb], kernels [in, out] or [out, in]."""
  def mul(x, kernel):
    if transposed:  # kernel [out, in]: (kernel @ x^T)^T, K minor in the dot.
      return jax.lax.dot_general(kernel, x, (((1,), (1,)), ((), ()))).T
    return x @ kernel

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


def median_ms(fn, *args) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1e3 * float(np.median(times))


def main(argv):
  del argv
  machine = costs.machine_description()
  print('machine: ' + ', '.join(f'{k} {v}' for k, v in machine.items()))
  target = pretrained.load(FLAGS.target)
  chain = decoder_kernels(target.params)
  chain_t = jax.tree_util.tree_map(lambda w: jnp.asarray(np.asarray(w).T),
                                   chain)
  weight_bytes = sum(w.size * w.dtype.itemsize
                     for w in jax.tree_util.tree_leaves(chain))
  emb = target.config.emb_dim
  rng = np.random.RandomState(0)
  ks = list(range(1, FLAGS.max_k + 1))
  print(f'{weight_bytes / 1e6:.1f} MB of kernels per decoder step')
  print('K:' + ' ' * 42 + ''.join(f'{k:7d}' for k in ks))
  options = {'project options': compile_lib.CPU_COMPILER_OPTIONS,
             'XLA defaults': None}
  for options_name, compiler_options in options.items():
    for layout, transposed, kernels in (('[in, out]', False, chain),
                                        ('[out, in]', True, chain_t)):
      fn = jax.jit(dot_chain(transposed), compiler_options=compiler_options)
      ms = [median_ms(fn, jnp.asarray(rng.randn(k, emb), jnp.float32),
                      kernels) for k in ks]
      print(f'{options_name}, kernels {layout}:'.ljust(44) +
            ''.join(f'{m / ms[0]:7.2f}' for m in ms) +
            f'   (K = 1: {ms[0]:.2f} ms, {weight_bytes / ms[0] / 1e6:.1f} '
            'GB/s)', flush=True)


if __name__ == '__main__':
  app.run(main)
