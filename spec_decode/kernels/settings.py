"""Which path decoder products take: the kernels switched on or off, AMX
tiles on or off, and what a product's activations enter as (see the
package's docstring)."""

import contextlib
import os
from typing import Iterator

import jax

from spec_decode.kernels import library

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


def check_inputs(inputs: str) -> str:
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
  _product_inputs = check_inputs(inputs)


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
  return check_inputs(_product_inputs)


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


def pays_for(rows: int) -> bool:
  """Whether a product of `rows` rows should run on the kernel."""
  return 1 <= rows <= MAX_ROWS
