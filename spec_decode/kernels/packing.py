"""Weights laid out once per model for the few-row kernels (panels of 32
output columns, or of weight pairs for bfloat16 inputs and AMX tiles)."""

from typing import Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.kernels import library
from spec_decode.kernels.settings import check_inputs
from spec_decode.kernels.settings import uses_amx

Array = jax.Array

PANEL = 32  # Output columns per panel (few_rows.cc's kPanel).


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
  check_inputs(inputs)
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
