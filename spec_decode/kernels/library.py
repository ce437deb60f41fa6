"""Finding, loading and registering the compiled CPU decoding kernels.

`pip install .` compiles `few_rows.cc` (the few-row matrix product),
`bf16_products.cc` (its bfloat16-input form), `amx_products.cc` and
`amx_split.cc` (both on AMX tiles, float32 inputs as bfloat16 parts),
`decode_attention.cc` and `peak_rate.cc` (the CPU's multiply-add rate, for
the scripts) into one shared library next to this file
(`_few_rows*.so`; see setup.py). Where it was not built (no C++
compiler at install time, a platform without one) or cannot load, decoding
uses XLA's dots and this says so once in the log.
"""

import ctypes
import functools
import glob
import logging
import os
from typing import Optional

import jax

MATMUL_TARGET = 'spec_decode_few_row_matmul'
BF16_INPUT_MATMUL_TARGET = 'spec_decode_bf16_input_matmul'
AMX_SPLIT_MATMUL_TARGET = 'spec_decode_amx_split_matmul'
ATTENTION_TARGET = 'spec_decode_decode_attention'

# The `isa` attribute of the custom call: which code path computes.
ISA_BEST = 0
ISA_NAMES = {1: 'portable', 2: 'avx2', 3: 'avx512'}
# AMX tiles (`amx_products.cc`), which ISA_BEST runs for kernels packed in
# pairs where `has_amx()`; not the other paths' bits.
ISA_AMX = 4

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path() -> Optional[str]:
  """The built library's path, or None where it was not built."""
  # setuptools names it like an extension module: _few_rows.<abi tag>.so.
  paths = sorted(glob.glob(os.path.join(_HERE, '_few_rows*.so'))
                 + glob.glob(os.path.join(_HERE, '_few_rows*.pyd')))
  return paths[0] if paths else None


@functools.lru_cache(maxsize=None)
def load() -> Optional[ctypes.CDLL]:
  """Loads the library and registers its FFI target, once per process.

  Returns:
    The library, or None (logged once) where it is missing or unusable.
  """
  path = library_path()
  if path is None:
    logging.warning(
        'spec_decode: the CPU decoding kernels were not built in %s (no C++ '
        'compiler at install time? or spec_decode imported from a source '
        'tree that was installed with `pip install .` rather than `pip '
        'install -e .`, which builds them in place); decoding uses XLA\'s '
        'dots.', _HERE)
    return None
  try:
    library = ctypes.cdll.LoadLibrary(path)
    library.SdFewRowBestIsa.restype = ctypes.c_int32
    library.SdFewRowSupports.restype = ctypes.c_int32
    library.SdFewRowSupports.argtypes = [ctypes.c_int32]
    library.SdHasAvx512Bf16.restype = ctypes.c_int32
    library.SdPeakMacRate.restype = ctypes.c_double
    library.SdPeakMacRate.argtypes = [ctypes.c_int32, ctypes.c_int32,
                                      ctypes.c_double]
    for target, symbol in ((MATMUL_TARGET, library.SdFewRowMatmul),
                           (BF16_INPUT_MATMUL_TARGET,
                            library.SdBf16InputMatmul),
                           (AMX_SPLIT_MATMUL_TARGET,
                            library.SdAmxSplitMatmul),
                           (ATTENTION_TARGET, library.SdDecodeAttention)):
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol),
                                  platform='cpu')
  except (OSError, AttributeError, RuntimeError, ValueError) as error:
    logging.warning('spec_decode: the CPU decoding kernels at %s could not be '
                    'loaded (%s); decoding uses XLA\'s dots.', path, error)
    return None
  return library


def best_isa() -> Optional[int]:
  """The code path `ISA_BEST` runs on this CPU, or None without a library."""
  library = load()
  return None if library is None else int(library.SdFewRowBestIsa())


def supports(isa: int) -> bool:
  """Whether code path `isa` (a key of `ISA_NAMES`) can run on this CPU."""
  library = load()
  return library is not None and bool(library.SdFewRowSupports(isa))


def has_avx512_bf16() -> bool:
  """Whether bfloat16-input products run VDPBF16PS on this CPU (AVX512_BF16)."""
  library = load()
  return library is not None and bool(library.SdHasAvx512Bf16())


def has_amx() -> bool:
  """Whether bfloat16-input products run on AMX tiles here (AMX-BF16, and
  the OS lets the process use them)."""
  library = load()
  return library is not None and bool(library.SdHasAmxBf16())


def peak_mac_rate(kind: str = 'float32', threads: int = 1,
                  seconds: float = 0.2) -> Optional[float]:
  """The CPU's measured multiply-adds per second (`peak_rate.cc`).

  Args:
    kind: 'float32' (FMAs on the widest vector unit) or 'bfloat16'
      (VDPBF16PS, two multiply-adds per lane).
    threads: Threads running at once (their rates add up, unless they share
      a physical core's units).
    seconds: About how long to run.

  Returns:
    Multiply-adds per second, or None without the library or where this
    CPU lacks the instructions.
  """
  library = load()
  if library is None:
    return None
  rate = library.SdPeakMacRate({'float32': 0, 'bfloat16': 1}[kind], threads,
                               seconds)
  return rate or None
