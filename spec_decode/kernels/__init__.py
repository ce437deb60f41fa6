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

import contextlib
import os
from typing import Iterator, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import library

Array = jax.Array

PANEL = 32  # Output columns per panel (few_rows.cc's kPanel).

# The kernel runs products of up to this many rows (batch x chunk tokens);
# larger ones are compute-bound and go to XLA's dots, which were as fast
# from about 96 rows on (scripts/k_token_dots.py measures the crossover).
MAX_ROWS = 96

_OFF = ('0', 'off', 'false', 'no')
_SWITCH_VARIABLE = 'SPEC_DECODE_KERNELS'
_enabled = os.environ.get(_SWITCH_VARIABLE, 'on').strip().lower() not in _OFF
_AMX_VARIABLE = 'SPEC_DECODE_AMX'
_amx_enabled = os.environ.get(_AMX_VARIABLE, 'on').strip().lower() not in _OFF

# What a product's activations enter the kernel as: 'float32' (exact) or
# 'bfloat16' (rounded, twice the arithmetic rate on AVX512_BF16 CPUs).
PRODUCT_INPUTS = ('float32', 'bfloat16')
_INPUTS_VARIABLE = 'SPEC_DECODE_KERNEL_INPUTS'
_product_inputs = os.environ.get(_INPUTS_VARIABLE, 'float32').strip().lower()


def set_enabled(enabled: bool) -> None:
  """Turns the kernel on or off for models prepared from now on.

  Models whose decode kernels were already prepared keep them; `Model`
  prepares them on first use and remembers the switch it saw.
  Environment: SPEC_DECODE_KERNELS=off starts a process with it off.
  """
  global _enabled
  _enabled = bool(enabled)


@contextlib.contextmanager
def enabled_as(enabled: bool) -> Iterator[None]:
  """`set_enabled(enabled)` inside a `with` block, restored after it."""
  before = _enabled
  set_enabled(enabled)
  try:
    yield
  finally:
    set_enabled(before)


def set_amx_enabled(enabled: bool) -> None:
  """Whether products may run on AMX tiles, for models prepared from now on.

  Off, float32-input products keep the FMA chain (the same bits as on any
  other CPU) and bfloat16-input products VDPBF16PS. Models keep the kernels
  they prepared under each setting. Environment: SPEC_DECODE_AMX=off.
  """
  global _amx_enabled
  _amx_enabled = bool(enabled)


@contextlib.contextmanager
def amx_enabled_as(enabled: bool) -> Iterator[None]:
  """`set_amx_enabled(enabled)` inside a `with` block, restored after it."""
  before = _amx_enabled
  set_amx_enabled(enabled)
  try:
    yield
  finally:
    set_amx_enabled(before)


def uses_amx() -> bool:
  """Whether products run on AMX tiles now: switched on, and the CPU and
  OS allow it (`library.has_amx()`)."""
  return _amx_enabled and library.has_amx()


def _check_inputs(inputs: str) -> str:
  if inputs not in PRODUCT_INPUTS:
    raise ValueError(f'product inputs (set_product_inputs, or '
                     f'{_INPUTS_VARIABLE}) must be one of {PRODUCT_INPUTS}, '
                     f'got {inputs!r}.')
  return inputs


def set_product_inputs(inputs: str) -> None:
  """What decoder products' activations enter the kernel as, from now on.

  Args:
    inputs: 'float32' (exact; the default) or 'bfloat16' (rounded at each
      product, float32 sums: TPU default-precision semantics). Models
      prepare their kernels once per setting (`Model.decode_kernels`).
      Environment: SPEC_DECODE_KERNEL_INPUTS=bfloat16.

  Raises:
    ValueError: `inputs` is neither.
  """
  global _product_inputs
  _product_inputs = _check_inputs(inputs)


@contextlib.contextmanager
def product_inputs_as(inputs: str) -> Iterator[None]:
  """`set_product_inputs(inputs)` inside a `with` block, restored after it."""
  before = _product_inputs
  set_product_inputs(inputs)
  try:
    yield
  finally:
    set_product_inputs(before)


def product_inputs() -> str:
  """'float32' or 'bfloat16': what decoder products' activations enter as."""
  return _check_inputs(_product_inputs)


def enabled() -> bool:
  """Whether decoding uses the kernel now: switched on, built, on a CPU."""
  return (_enabled and jax.default_backend() == 'cpu'
          and library.load() is not None)


def available() -> str:
  """Which path computes decoder products at decode time in this process.

  Returns:
    'avx512', 'avx2' or 'portable' (the kernel's code path on this CPU),
    'avx512+amx' (float32 inputs in bfloat16 parts on AMX tiles, for
    bfloat16-valued weights), or 'xla' (switched off, not built, or not on
    a CPU); with bfloat16 product inputs, '+bf16 inputs (amx)',
    '+bf16 inputs (vdpbf16ps)' or '+bf16 inputs (fma)' follows the code
    path: AMX tiles, the AVX512_BF16 instruction or float32 FMAs compute
    them.
  """
  if not enabled():
    return 'xla'
  path = library.ISA_NAMES[library.best_isa()]
  if product_inputs() == 'bfloat16':
    how = ('amx' if uses_amx() else
           'vdpbf16ps' if library.has_avx512_bf16() else 'fma')
    return path + f'+bf16 inputs ({how})'
  return path + '+amx' if uses_amx() else path


@flax.struct.dataclass
class PackedKernel:
  """A [K, N] kernel in the few-row kernel's layout, prepared once.

  Attributes:
    panels: [ceil(N / 32), K, 32] float32 or bfloat16: column panels, each
      a contiguous stream, zero past N. bfloat16 panels interleave each
      16-column half (slot 2i: column i, slot 2i + 1: column 8 + i).
      With bfloat16 inputs: [ceil(N / 32), K / 2, 64] bfloat16, panel row
      r holding (W[2r][c], W[2r + 1][c]) for c = 0..31.
      The same pair layout with float32 inputs on AMX tiles.
    features: N, the product's output width.
    inputs: 'float32' or 'bfloat16': what the activations enter as.
    amx: Products run on AMX tiles (float32 inputs in three bfloat16
      parts, or bfloat16 inputs as they are).
  """
  panels: Array
  features: int = flax.struct.field(pytree_node=False)
  inputs: str = flax.struct.field(pytree_node=False, default='float32')
  amx: bool = flax.struct.field(pytree_node=False, default=False)

  @property
  def pairs(self) -> bool:
    """Whether the panels hold weight pairs ([P, K / 2, 64])."""
    return self.inputs == 'bfloat16' or self.amx

  @property
  def depth(self) -> int:
    """K, the contracted width."""
    if self.pairs:
      return 2 * self.panels.shape[1]
    return self.panels.shape[1]


def _bf16_slots() -> np.ndarray:
  column = np.arange(PANEL)
  return (column // 16) * 16 + 2 * (column % 8) + (column % 16) // 8


def packed_dtype(kernel: np.ndarray, activation_dtype=jnp.float32):
  """The panel dtype that changes no result, preferring half the bytes.

  bfloat16 when the model computes in bfloat16 (its dots round the kernel
  to bfloat16 anyway) or when every weight is a bfloat16 value already (the
  shipped models are stored so); float32 otherwise.
  """
  if jnp.dtype(activation_dtype) == jnp.bfloat16:
    return jnp.bfloat16
  as_float = np.asarray(kernel, np.float32)
  rounded = np.asarray(jnp.asarray(as_float, jnp.bfloat16).astype(jnp.float32))
  return jnp.bfloat16 if np.array_equal(as_float, rounded) else jnp.float32


def pack_kernel(kernel, dtype=None, inputs: str = 'float32',
                amx: Optional[bool] = None) -> PackedKernel:
  """Lays out a T5X [in, out] kernel for the few-row kernel.

  Args:
    kernel: [K, N] array (numpy or jax), T5X's layout.
    dtype: jnp.float32 or jnp.bfloat16; None picks `packed_dtype`.
    inputs: 'float32', or 'bfloat16' (activations rounded at the product;
      the weights are then rounded to bfloat16 too, and K must be even).
    amx: Run the products on AMX tiles. None: with bfloat16 inputs where
      `uses_amx()`, never with float32 inputs (their weights are then laid
      out for the tiles: they must be bfloat16 values, K even).

  Returns:
    A `PackedKernel` on the default device.

  Raises:
    ValueError: `kernel` is not 2-D, `dtype` is neither, `inputs` is
      'bfloat16' with float32 `dtype` or an odd K, or `amx` is asked for
      where the tiles are not usable, or with float32 inputs for weights
      that are not bfloat16 values or an odd K.
  """
  kernel = np.asarray(kernel, np.float32)
  if kernel.ndim != 2:
    raise ValueError(f'kernel must be 2-D [in, out], got shape '
                     f'{kernel.shape}.')
  _check_inputs(inputs)
  if inputs == 'bfloat16':
    dtype = jnp.bfloat16 if dtype is None else jnp.dtype(dtype)
  dtype = packed_dtype(kernel) if dtype is None else jnp.dtype(dtype)
  if dtype not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f'dtype must be float32 or bfloat16, got {dtype}.')
  depth, features = kernel.shape
  if inputs == 'bfloat16' and (dtype != jnp.bfloat16 or depth % 2):
    raise ValueError(f"inputs='bfloat16' needs dtype bfloat16 and an even "
                     f'input width; got {dtype} and kernel shape '
                     f'{kernel.shape}.')
  if amx is None:
    amx = inputs == 'bfloat16' and uses_amx()
  if amx and not library.has_amx():
    raise ValueError('amx=True: AMX tiles are not usable on this CPU or OS '
                     '(spec_decode.kernels.library.has_amx()).')
  if amx and inputs == 'float32' and (
      packed_dtype(kernel) != jnp.bfloat16 or dtype != jnp.bfloat16
      or depth % 2):
    raise ValueError(f'amx=True with float32 inputs needs weights that are '
                     f'bfloat16 values, dtype bfloat16 and an even input '
                     f'width; got dtype {jnp.dtype(dtype).name} and kernel shape '
                     f'{kernel.shape}.')
  count = -(-features // PANEL)
  padded = np.zeros((depth, count * PANEL), np.float32)
  padded[:, :features] = kernel
  if inputs == 'bfloat16' or amx:
    # [K, P * 32] -> [K / 2, 2, P, 32] -> [P, K / 2, 32, 2] -> [P, K / 2, 64]
    paired = padded.reshape(depth // 2, 2, count, PANEL).transpose(2, 0, 3, 1)
    return PackedKernel(
        panels=jnp.asarray(paired.reshape(count, depth // 2, 2 * PANEL),
                           jnp.bfloat16),
        features=features, inputs=inputs, amx=bool(amx))
  # [K, P * 32] -> [P, K, 32]
  panels = padded.reshape(depth, count, PANEL).transpose(1, 0, 2)
  if dtype == jnp.bfloat16:
    interleaved = np.empty_like(panels)
    interleaved[..., _bf16_slots()] = panels
    panels = interleaved
  return PackedKernel(panels=jnp.asarray(panels, dtype), features=features)


def unpack_kernel(packed: PackedKernel) -> np.ndarray:
  """The [K, N] float32 kernel a `PackedKernel` holds (for checks)."""
  panels = np.asarray(packed.panels.astype(jnp.float32))
  if packed.pairs:
    count, pairs, _ = panels.shape
    # [P, K / 2, 32, 2] -> [K / 2, 2, P, 32]
    return panels.reshape(count, pairs, PANEL, 2).transpose(1, 3, 0, 2).reshape(
        2 * pairs, count * PANEL)[:, :packed.features]
  if packed.panels.dtype == jnp.bfloat16:
    panels = panels[..., _bf16_slots()]
  count, depth, _ = panels.shape
  return panels.transpose(1, 0, 2).reshape(depth, count * PANEL)[
      :, :packed.features]


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


def pays_for(rows: int) -> bool:
  """Whether a product of `rows` rows should run on the kernel."""
  return 1 <= rows <= MAX_ROWS


__all__ = [
    'MAX_ROWS', 'PRODUCT_INPUTS', 'PackedKernel', 'amx_enabled_as',
    'attention', 'available', 'enabled', 'enabled_as', 'matmul',
    'pack_kernel', 'packed_dtype', 'pays_for', 'product_inputs',
    'product_inputs_as', 'set_amx_enabled', 'set_enabled',
    'set_product_inputs', 'unpack_kernel', 'uses_amx',
]
