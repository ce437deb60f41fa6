"""A decoding call's encoder pass over the input's used columns only.

T5X pads every input to the task's feature length, and the encoder then
computes every padded position, though padding is masked everywhere it is
read. On a CPU that pass is a large share of a short output's latency
(scripts/encoder_widths.py measures it).

So on one CPU device `prepare_decoding` runs the encoder on the first
`width` columns, the smallest of a few compiled widths (`widths`) that
covers the last column holding a token in any row, chosen with
`lax.switch` inside the compiled call: no compile per input, one
conditional per call. The cross-attention keys and values are padded back
to the full length with zeros, beside the full mask, so everything after
the encoder sees the shapes it always saw.

Why outputs do not change: a real position's encoder output depends on the
other positions only through self-attention, whose padded keys get weight 0
(masked before the softmax); layer norms, MLPs and the products act on each
position alone (the few-row kernel gives a row the same bits whatever the
number of rows). What may differ is the summation order of the softmax and
of attention's probability-weighted sums over more or fewer exact zeros:
float32 rounding, the same for baseline and speculative decoding, which
share this code.
"""

import contextlib
from typing import Callable, Iterator, Tuple

import jax
import jax.numpy as jnp

from spec_decode import partitioning as partitioning_lib
from spec_decode.model.network import EncodedInputs

Array = jax.Array

# Widths are the full length and its halvings down to this many columns, at
# most MAX_WIDTHS of them (each is one more compiled encoder).
MIN_WIDTH = 8
MAX_WIDTHS = 4


def widths(length: int) -> Tuple[int, ...]:
  """The compiled encoder widths for inputs of `length` columns: length,
  then halvings (rounded up to a multiple of MIN_WIDTH) while they stay at
  or above MIN_WIDTH, at most MAX_WIDTHS in all; ascending."""
  found = {length}
  width = length
  while len(found) < MAX_WIDTHS:
    width = -(-(width // 2) // MIN_WIDTH) * MIN_WIDTH
    if width < MIN_WIDTH or width >= length or width in found:
      break
    found.add(width)
  return tuple(sorted(found))


def used_columns(encoder_input_tokens: Array) -> Array:
  """int32 []: 1 + the last column holding a token (non-zero) in any row;
  0 for an all-padding input."""
  columns = jnp.arange(1, encoder_input_tokens.shape[1] + 1, dtype=jnp.int32)
  return jnp.max(jnp.where(encoder_input_tokens != 0, columns[None, :], 0))


_trim = True


def enabled() -> bool:
  """Whether decoding programs traced now trim the encoder where it applies
  (`trimming`)."""
  return _trim


@contextlib.contextmanager
def trimming(trim: bool) -> Iterator[None]:
  """Decoding programs traced inside run the encoder on every column
  (False) or on the used ones where `applies` (True, the default).

  The setting is read while a program is traced; the decoders keep one
  compiled program per setting (`compile.decoder_jit`), so
  `with trimming(False): generate(...)` measures or checks the untrimmed
  pass (scripts/encoder_widths.py, the tests).
  """
  global _trim
  previous, _trim = _trim, bool(trim)
  try:
    yield
  finally:
    _trim = previous


def applies() -> bool:
  """Whether the encoder pass being traced is trimmed: set so (`trimming`),
  on the CPU backend, with no mesh active (a sharded model keeps one
  program shape per mesh; accelerators compute padded columns in
  parallel)."""
  return (_trim and jax.default_backend() == 'cpu'
          and partitioning_lib.current() is None)


def _pad_columns(encoded: EncodedInputs, length: int,
                 mask: Array) -> EncodedInputs:
  """`encoded` computed on fewer columns, padded with zeros to `length`."""
  def pad(array: Array, axis: int) -> Array:
    padding = [(0, 0)] * array.ndim
    padding[axis] = (0, length - array.shape[axis])
    return jnp.pad(array, padding)
  return EncodedInputs(
      # [batch, heads, head_dim, enc_len] and [batch, heads, enc_len, dim].
      cross_keys=tuple(pad(k, 3) for k in encoded.cross_keys),
      cross_values=tuple(pad(v, 2) for v in encoded.cross_values),
      encoder_mask=mask)


def encode_used_columns(encode: Callable[[Array], EncodedInputs],
                        encoder_input_tokens: Array) -> EncodedInputs:
  """`encode(encoder_input_tokens)`, computed on the used columns only.

  Args:
    encode: The encoder pass and cross-attention projections of a batch
      of tokens (`Transformer.prepare_decoding`).
    encoder_input_tokens: int [batch, enc_len], 0 at padding.

  Returns:
    The `EncodedInputs` for all enc_len columns.
  """
  length = encoder_input_tokens.shape[1]
  choices = widths(length)
  if len(choices) == 1:
    return encode(encoder_input_tokens)
  mask = encoder_input_tokens > 0

  def branch(width: int) -> Callable[[Array], EncodedInputs]:
    def run(tokens: Array) -> EncodedInputs:
      return _pad_columns(encode(tokens[:, :width]), length, mask)
    return run

  index = jnp.sum(jnp.asarray(choices[:-1]) < used_columns(
      encoder_input_tokens)).astype(jnp.int32)
  return jax.lax.switch(index, [branch(w) for w in choices],
                        encoder_input_tokens)
