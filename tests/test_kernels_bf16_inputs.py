"""The kernel's bfloat16-input products (`kernels.set_product_inputs`):
values, batch invariance, code paths, the decoder on them, exactness of
speculative decoding on them, the setting and bad input."""

import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode.kernels import library
from spec_decode.model import decode_kernels
from tests.conftest import random_inputs
from tests.conftest import random_model
from tests import test_speculative
from tests.test_kernels import _call
from tests.test_kernels import _chunk_logits
from tests.test_kernels import built
from tests.test_kernels import ISAS

BAD_INPUTS = (r'product inputs \(set_product_inputs, or '
              r'SPEC_DECODE_KERNEL_INPUTS\) must be one of')


def _bf16(values: np.ndarray) -> np.ndarray:
  return np.asarray(jnp.asarray(values, jnp.bfloat16).astype(jnp.float32))


def _assert_within_float32_rounding(got, x, w):
  """got is the float64 product of x and w rounded to bfloat16, up to one
  float32 rounding per step of each output's chain."""
  # Products of bfloat16 values are exact in float32: only the sums round.
  want = _bf16(x).astype(np.float64) @ _bf16(w).astype(np.float64)
  bound = (2 * w.shape[0] * np.finfo(np.float32).eps
           * (np.abs(_bf16(x)) @ np.abs(_bf16(w))))
  np.testing.assert_array_less(np.abs(got - want), bound + 1e-30)


@built
@pytest.mark.parametrize('depth,features', [(2, 1), (14, 13), (130, 129),
                                            (128, 7), (64, 96)])
def test_matches_float64_product_of_rounded_inputs(depth, features):
  w = np.random.RandomState(0).randn(depth, features).astype(np.float32)
  packed = kernels.pack_kernel(w, inputs='bfloat16')
  assert packed.panels.dtype == jnp.bfloat16 and packed.depth == depth
  rng = np.random.RandomState(1)
  for rows in range(1, 18):
    x = rng.randn(rows, depth).astype(np.float32)
    got = _call(x, packed)
    assert got.shape == (rows, features) and got.dtype == np.float32
    _assert_within_float32_rounding(got, x, w)


@built
@pytest.mark.parametrize('isa', ISAS)
def test_rows_do_not_depend_on_their_neighbours(isa):
  w = np.random.RandomState(2).randn(130, 100).astype(np.float32)
  packed = kernels.pack_kernel(w, inputs='bfloat16')
  x = np.random.RandomState(3).randn(16, 130).astype(np.float32)
  together = _call(x, packed, isa)
  for row in range(16):
    np.testing.assert_array_equal(_call(x[row:row + 1], packed, isa)[0],
                                  together[row])
  np.testing.assert_array_equal(
      np.concatenate([_call(x[:5], packed, isa), _call(x[5:], packed, isa)]),
      together)


@built
def test_every_code_path_gives_the_portable_bits():
  # The portable path is the reference: fma(odd pair member) then fma(even)
  # per pair, as VDPBF16PS computes (the AVX-512 path where the CPU has
  # AVX512_BF16, else AVX2).
  w = np.random.RandomState(4).randn(200, 77).astype(np.float32)
  packed = kernels.pack_kernel(w, inputs='bfloat16')
  x = np.random.RandomState(5).randn(13, 200).astype(np.float32)
  reference = _call(x, packed, isa=1)
  for isa in ISAS:
    np.testing.assert_array_equal(_call(x, packed, isa), reference)
    np.testing.assert_array_equal(_call(x, packed, isa, threads=1),
                                  reference)
  # Not the float32-input kernel's bits: the inputs really are rounded.
  exact = kernels.pack_kernel(_bf16(w), jnp.bfloat16)
  assert not np.array_equal(_call(x, exact), reference)


amx = pytest.mark.skipif(library.load() is None or not library.has_amx(),
                         reason='no AMX tiles on this CPU or OS')


@built
@amx
@pytest.mark.parametrize('depth,features', [(2, 1), (14, 13), (32, 32),
                                            (130, 129), (512, 96)])
def test_amx_tiles_match_float64_and_keep_rows_apart(depth, features):
  # AMX sums its own way (not the portable bits): within float32 rounding
  # of the float64 product, and a row's bits do not depend on the rows
  # beside it, within a tile of 16 or across tiles, nor on the threads.
  w = np.random.RandomState(7).randn(depth, features).astype(np.float32)
  packed = kernels.pack_kernel(w, inputs='bfloat16')
  x = np.random.RandomState(8).randn(40, depth).astype(np.float32)
  together = _call(x, packed, library.ISA_AMX)
  _assert_within_float32_rounding(together, x, w)
  np.testing.assert_array_equal(_call(x, packed), together)  # The default.
  with kernels.amx_enabled_as(False):  # Switched off: VDPBF16PS's bits.
    np.testing.assert_array_equal(
        _call(x, kernels.pack_kernel(w, inputs='bfloat16')),
        _call(x, packed, isa=1))
  np.testing.assert_array_equal(
      _call(x, packed, library.ISA_AMX, threads=1), together)
  for rows in (1, 3, 16, 17):
    np.testing.assert_array_equal(
        _call(x[:rows], packed, library.ISA_AMX), together[:rows])
  np.testing.assert_array_equal(
      _call(x[21:22], packed, library.ISA_AMX)[0], together[21])


@built
def test_amx_is_asked_for_where_it_applies():
  packed = kernels.pack_kernel(np.ones((4, 3), np.float32))
  with pytest.raises(ValueError, match=r"isa 4 \(AMX tiles\) takes kernels "
                     r"packed with inputs='bfloat16' or amx=True only"):
    kernels.matmul(jnp.ones((2, 4)), packed, isa=library.ISA_AMX)
  if not library.has_amx():
    with pytest.raises(ValueError, match='AMX tiles are not usable'):
      kernels.matmul(jnp.ones((2, 4)),
                     kernels.pack_kernel(np.ones((4, 3), np.float32),
                                         inputs='bfloat16'),
                     isa=library.ISA_AMX)


def test_pack_round_trip_and_errors():
  w = np.random.RandomState(6).randn(6, 70).astype(np.float32)
  packed = kernels.pack_kernel(w, inputs='bfloat16')
  assert packed.panels.shape == (3, 3, 64) and packed.inputs == 'bfloat16'
  np.testing.assert_array_equal(kernels.unpack_kernel(packed), _bf16(w))
  with pytest.raises(ValueError, match='even input width'):
    kernels.pack_kernel(np.ones((5, 3), np.float32), inputs='bfloat16')
  with pytest.raises(ValueError, match='needs dtype bfloat16'):
    kernels.pack_kernel(w, jnp.float32, inputs='bfloat16')
  with pytest.raises(ValueError, match=BAD_INPUTS):
    kernels.pack_kernel(w, inputs='float16')
  with pytest.raises(ValueError, match=BAD_INPUTS):
    kernels.set_product_inputs('int8')


@built
def test_bad_input_names_the_operand():
  packed = kernels.pack_kernel(np.ones((4, 3), np.float32), inputs='bfloat16')
  with pytest.raises(ValueError, match=r"x has shape \(2, 6\).*input width 4"):
    kernels.matmul(jnp.ones((2, 6)), packed)
  assert kernels.matmul(jnp.ones((0, 4)), packed).shape == (0, 3)


@built
def test_setting_prepares_the_model_once_per_setting():
  model = random_model(0)
  with kernels.product_inputs_as('bfloat16'):
    assert kernels.available().endswith(('(amx)', '(vdpbf16ps)', '(fma)'))
    assert kernels.available().endswith('(amx)') == library.has_amx()
    prepared = model.decode_kernels
    assert prepared is model.decode_kernels
  assert kernels.product_inputs() == 'float32'
  assert model.decode_kernels is not prepared
  leaf = prepared['decoder']['layers_0']['mlp']['wo']['kernel']
  assert leaf.inputs == 'bfloat16'
  # Every product, the logits layer's included, takes bfloat16 inputs.
  assert prepared['decoder']['logits_dense']['kernel'].inputs == 'bfloat16'
  np.testing.assert_array_equal(
      kernels.unpack_kernel(prepared['decoder']['layers_0']['mlp'][
          decode_kernels.JOINED_WI]),
      _bf16(np.concatenate([model.params['decoder']['layers_0']['mlp'][
          f'wi_{i}']['kernel'] for i in range(2)], axis=1)))


@built
def test_decoder_call_is_close_to_xla_and_position_invariant():
  model = random_model(0)
  with kernels.product_inputs_as('bfloat16'):
    prepared = model.decode_kernels
  single = _chunk_logits(model, prepared, 1)
  xla = _chunk_logits(model, None, 1)
  # Inputs rounded to bfloat16 at each product: close to float32, not equal.
  assert 0 < np.max(np.abs(single - xla)) < 0.02 * np.max(np.abs(xla))
  for chunk in (2, 3, 6):
    np.testing.assert_array_equal(_chunk_logits(model, prepared, chunk),
                                  single)


@built
@pytest.mark.parametrize('batch', [
    pytest.param(1, marks=pytest.mark.slow),
    pytest.param(4, marks=pytest.mark.slow), 7])
def test_greedy_speculative_equals_baseline(batch):
  # Both decoders take the same rounded products, so greedy identity holds
  # on them as on float32 inputs: every row, ragged lengths (EOS inside the
  # horizon), every gamma.
  target, draft = test_speculative._target(), test_speculative._draft()
  enc = random_inputs(7, 9, 512, seed=0)
  with kernels.product_inputs_as('bfloat16'):
    eos_id = test_speculative._eos_inside_horizon(target, enc)
    for gamma in (1, 3, 5):
      baseline, _ = test_speculative._assert_greedy_equal(
          target, draft, enc[:batch], gamma, eos_id)
  assert np.asarray(baseline.lengths).min() < test_speculative.MAX_LEN
