"""Our own CPU matrix kernel for decoder calls on few rows.

A decoder call on M = batch x chunk tokens multiplies M-row activations by
every decoder kernel. At small M its cost should be what streaming the
weights from memory costs, whatever M is: that is the premise of
speculative decoding (scoring gamma + 1 tokens costs about one step). On
CPUs XLA breaks it (a 2..16-row product repacks the weight every call), so
decoder products at decode time on one CPU device run `few_rows.cc`, called
as an XLA FFI custom call inside the compiled loop, on weights laid out for
it once per model (`pack_kernel`); so does the encoder pass of a decoding
call (at batch 1 a product of a few dozen rows). Training, teacher-forced
scoring, accelerators and sharded models keep XLA's dots.

  kernels.available()      # 'avx2', 'avx512', 'avx512+amx', 'portable' or 'xla'
  kernels.set_enabled(False)   # or SPEC_DECODE_KERNELS=off: XLA's dots

Here: the products and the attention as JAX ops (`matmul`, `attention`);
`settings.py`: which path runs (switches, product inputs, AMX);
`packing.py`: the weights' layouts; `library.py`: the compiled library.

Every output element is one float32 fused multiply-add chain over k in
order, whatever the number of rows, the tile or the instruction set, so a
row's result does not depend on the rows computed with it, and the AVX2,
AVX-512 and portable paths agree bit for bit.

AMX. Where the CPU has AMX-BF16 tiles (Intel Sapphire Rapids and later) and
a model's weights are bfloat16 values (the shipped models; any bfloat16
checkpoint), products run on the tiles instead ('avx512+amx'): each float32
activation goes in as three bfloat16 parts that add up to it exactly, so
every product is exact and only the float32 sums round. The results are
float32-accurate (closer to float64 than the FMA chain's, in our tests) and
batch-invariant, but not the FMA chain's bits: outputs on such a CPU can
differ from another CPU's in the last bits, as XLA's own dots do between
CPUs. Past ~2 rows the FMA path is bound by its arithmetic; the tiles keep
a product bound by streaming its weights up to ~5 rows (scripts/README.md).
`set_amx_enabled(False)` (or SPEC_DECODE_AMX=off) keeps the FMA chain.

Product inputs. By default a product's activations enter as float32
(exact, what XLA:CPU computes). `set_product_inputs('bfloat16')` (or
SPEC_DECODE_KERNEL_INPUTS=bfloat16) rounds them to bfloat16 at every
product, as XLA does for float32 dots on TPUs at default precision, with
float32 sums (`bf16_products.cc`): on CPUs with AVX512_BF16 one instruction
then does two multiply-adds per lane, which is what a K-token call needs
once it is bound by arithmetic rather than by streaming the weights. It
changes results (each input by up to 2^-9 relative), so it is off by
default; baseline and speculative decoding both use it when set.
"""

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import library
from spec_decode.kernels.packing import PANEL
from spec_decode.kernels.packing import PackedKernel
from spec_decode.kernels.packing import pack_kernel
from spec_decode.kernels.packing import packed_dtype
from spec_decode.kernels.packing import unpack_kernel
from spec_decode.kernels.settings import MAX_ROWS
from spec_decode.kernels.settings import PRODUCT_INPUTS
from spec_decode.kernels.settings import amx_enabled_as
from spec_decode.kernels.settings import available
from spec_decode.kernels.settings import enabled
from spec_decode.kernels.settings import enabled_as
from spec_decode.kernels.settings import pays_for
from spec_decode.kernels.settings import product_inputs
from spec_decode.kernels.settings import product_inputs_as
from spec_decode.kernels.settings import set_amx_enabled
from spec_decode.kernels.settings import set_enabled
from spec_decode.kernels.settings import set_product_inputs
from spec_decode.kernels.settings import uses_amx

Array = jax.Array


def matmul(x: Array, packed: PackedKernel, *, isa: int = library.ISA_BEST,
           threads: int = 0) -> Array:
  """x @ kernel in float32 by the few-row kernel, for any leading shape.

  Args:
    x: [..., K] floating activations (cast to float32, exactly for
      bfloat16; or rounded to bfloat16 where `packed.inputs` says so).
    packed: The kernel, from `pack_kernel`.
    isa: The code path: `library.ISA_BEST` (AMX tiles for kernels packed
      with `amx`, else the CPU's widest vector path), a key of
      `library.ISA_NAMES` (tests pin the portable reference), or
      `library.ISA_AMX` (kernels in pairs). Float32-input kernels packed
      with `amx` run on the tiles only (ISA_BEST or ISA_AMX).
    threads: Threads sharing the product; 0: XLA's intra-op pool.

  Returns:
    float32 [..., N].

  Raises:
    ValueError: The kernel library is missing, `x` is not floating, its
      last axis is not the kernel's K, or `isa` is unknown or not usable
      here (messages name the operand).
  """
  if library.load() is None:
    raise ValueError('The few-row kernel library is not built; use XLA\'s '
                     'dots (spec_decode.kernels.available() says which).')
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f'x must be floating, got dtype {x.dtype}.')
  if x.ndim < 1 or x.shape[-1] != packed.depth:
    raise ValueError(f'x has shape {x.shape}; its last axis must be the '
                     f"kernel's input width {packed.depth}.")
  on_tiles = packed.amx and packed.inputs == 'float32'
  if isa == library.ISA_AMX and not packed.pairs:
    raise ValueError(f'isa {library.ISA_AMX} (AMX tiles) takes kernels '
                     "packed with inputs='bfloat16' or amx=True only.")
  if on_tiles and isa not in (library.ISA_BEST, library.ISA_AMX):
    raise ValueError(f'isa {isa!r}: a float32-input kernel packed with '
                     f'amx=True runs on AMX tiles only (isa '
                     f'{library.ISA_BEST} or {library.ISA_AMX}).')
  if (isa == library.ISA_AMX or on_tiles) and not library.has_amx():
    raise ValueError(f'isa {library.ISA_AMX}: AMX tiles are not usable on '
                     'this CPU or OS (spec_decode.kernels.library.has_amx()).')
  if (isa not in (library.ISA_BEST, library.ISA_AMX)
      and isa not in library.ISA_NAMES):
    raise ValueError(f'isa must be {library.ISA_BEST}, {library.ISA_AMX} '
                     f'(AMX) or one of {sorted(library.ISA_NAMES)}, got '
                     f'{isa!r}.')
  if isa == library.ISA_BEST and packed.inputs == 'bfloat16':
    # The library's own best for these is AMX where usable: name the path.
    isa = library.ISA_AMX if packed.amx else library.best_isa()
  leading = x.shape[:-1]
  rows = int(np.prod(leading, dtype=np.int64))
  if packed.inputs == 'bfloat16':
    target, flat = (library.BF16_INPUT_MATMUL_TARGET,
                    x.reshape(rows, packed.depth).astype(jnp.bfloat16))
  else:
    target = (library.AMX_SPLIT_MATMUL_TARGET if on_tiles
              else library.MATMUL_TARGET)
    flat = x.reshape(rows, packed.depth).astype(jnp.float32)
  call = jax.ffi.ffi_call(
      target,
      jax.ShapeDtypeStruct((rows, packed.features), jnp.float32),
      vmap_method='sequential')
  y = call(flat, packed.panels, isa=np.int32(isa), threads=np.int32(threads))
  return y.reshape(leading + (packed.features,))


def attention(query: Array, key: Array, value: Array, bias: Array, *,
              isa: int = library.ISA_BEST, threads: int = 0) -> Array:
  """T5's softmax attention (no 1/sqrt(d) scaling) by `decode_attention.cc`.

  For a decoder call's few query positions: each (row, position, head) is
  computed whole, in the same order whatever the number of positions, so a
  position's output does not depend on the others in the call.

  Args:
    query: float32 [batch, q_len, heads, head_dim].
    key: float32 [batch, heads, head_dim, k_len] (the cache's layout).
    value: float32 [batch, heads, k_len, head_dim].
    bias: float32, broadcastable to [batch, heads, q_len, k_len] (masks as
      -1e10 and relative positions); its batch and key axes are full.
    isa: As for `matmul`.
    threads: As for `matmul`.

  Returns:
    float32 [batch, q_len, heads, head_dim].

  Raises:
    ValueError: The library is missing, or an operand's shape or dtype does
      not fit (the message names it).
  """
  if library.load() is None:
    raise ValueError('The CPU decoding kernels are not built; use XLA '
                     '(spec_decode.kernels.available() says which).')
  for name, array in (('query', query), ('key', key), ('value', value),
                      ('bias', bias)):
    if array.ndim != 4 or array.dtype != jnp.float32:
      raise ValueError(f'{name} must be float32 and 4-D, got {array.dtype} '
                       f'{array.shape}.')
  batch, q_len, heads, depth = query.shape
  k_len = key.shape[-1]
  if key.shape != (batch, heads, depth, k_len):
    raise ValueError(f'key has shape {key.shape}; expected [batch, heads, '
                     f'head_dim, k_len] = {(batch, heads, depth, k_len)}.')
  if value.shape != (batch, heads, k_len, depth):
    raise ValueError(f'value has shape {value.shape}; expected '
                     f'{(batch, heads, k_len, depth)}.')
  if (bias.shape[0] != batch or bias.shape[1] not in (1, heads)
      or bias.shape[2] not in (1, q_len) or bias.shape[3] != k_len):
    raise ValueError(f'bias has shape {bias.shape}; expected [{batch}, 1 or '
                     f'{heads}, 1 or {q_len}, {k_len}].')
  call = jax.ffi.ffi_call(
      library.ATTENTION_TARGET,
      jax.ShapeDtypeStruct(query.shape, jnp.float32),
      vmap_method='sequential')
  return call(query, key, value, bias, isa=np.int32(isa),
              threads=np.int32(threads))


__all__ = [
    'MAX_ROWS', 'PANEL', 'PRODUCT_INPUTS', 'PackedKernel', 'amx_enabled_as',
    'attention', 'available', 'enabled', 'enabled_as', 'matmul',
    'pack_kernel', 'packed_dtype', 'pays_for', 'product_inputs',
    'product_inputs_as', 'set_amx_enabled', 'set_enabled',
    'set_product_inputs', 'unpack_kernel', 'uses_amx',
]
