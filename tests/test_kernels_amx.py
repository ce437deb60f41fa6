"""Float32 products on AMX tiles (`amx_split.cc`, `amx_products.cc`,
`kernels.uses_amx`): values against float64, batch invariance (one group
of tile rows, two sharing each weight tile, padded groups), which kernels
the decoder lays out for the tiles, the decoder on them, greedy exactness
of speculative decoding on them, the switch and bad input. The
bfloat16-input products on the tiles are tested with the other
bfloat16-input paths (test_kernels_bf16_inputs.py)."""

import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import kernels
from spec_decode.kernels import library
from spec_decode.model import decode_kernels
from tests import test_speculative
from tests.conftest import bfloat16_valued
from tests.conftest import perturbed
from tests.conftest import random_inputs
from tests.conftest import random_model
from tests.test_kernels import _call
from tests.test_kernels import _chunk_logits
from tests.test_kernels import built

amx = pytest.mark.skipif(library.load() is None or not library.has_amx(),
                         reason='no AMX tiles on this CPU or OS')


def _bf16_values(shape, seed) -> np.ndarray:
  w = np.random.RandomState(seed).randn(*shape).astype(np.float32)
  return np.asarray(jnp.asarray(w, jnp.bfloat16).astype(jnp.float32))


@built
@amx
@pytest.mark.parametrize('depth,features', [(2, 1), (14, 13), (32, 32),
                                            (130, 129), (512, 96)])
def test_tiles_match_float64_and_keep_rows_apart(depth, features):
  # Three bfloat16 parts per input make every product exact, so only the
  # float32 sums round: within float32 rounding of the float64 product, for
  # every row count (tiles of up to 16 part rows, and past them); and a
  # row's bits do not depend on the rows beside it nor on the threads.
  w = _bf16_values((depth, features), 0)
  packed = kernels.pack_kernel(w, amx=True)
  assert packed.amx and packed.pairs and packed.depth == depth
  np.testing.assert_array_equal(kernels.unpack_kernel(packed), w)
  rng = np.random.RandomState(1)
  x = (rng.randn(40, depth) * np.exp(rng.randn(40, depth))).astype(np.float32)
  together = _call(x, packed)
  want = x.astype(np.float64) @ w.astype(np.float64)
  bound = (depth * np.finfo(np.float32).eps
           * (np.abs(x).astype(np.float64) @ np.abs(w)))
  np.testing.assert_array_less(np.abs(together - want), bound + 1e-30)
  np.testing.assert_array_equal(_call(x, packed, library.ISA_AMX), together)
  np.testing.assert_array_equal(_call(x, packed, threads=1), together)
  for rows in list(range(1, 18)) + [33]:
    np.testing.assert_array_equal(_call(x[:rows], packed), together[:rows])
  np.testing.assert_array_equal(_call(x[21:22], packed)[0], together[21])


@built
@amx
def test_tiles_are_float32_accurate_not_bfloat16():
  # Inputs that bfloat16 cannot hold: the parts keep all 24 bits.
  w = _bf16_values((64, 8), 2)
  x = (1.0 + np.arange(64, dtype=np.float32) * 2.0 ** -20)[None]
  got = _call(x, kernels.pack_kernel(w, amx=True))
  rounded = np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-6)
  assert np.abs((rounded @ w) - x.astype(np.float64) @ w).max() > 1e-5


@built
@amx
def test_decoder_lays_out_for_tiles_only_weights_that_are_bfloat16_values():
  model = random_model(0)
  rounded = bfloat16_valued(model)
  assert kernels.uses_amx() and kernels.available().endswith('+amx')
  leaves = lambda prepared: [prepared['decoder']['layers_0']['mlp'][
      decode_kernels.JOINED_WI], prepared['decoder']['logits_dense']['kernel'],
                             prepared['encoder']['layers_0']['mlp']['wo'][
                                 'kernel']]
  assert all(leaf.amx for leaf in leaves(rounded.decode_kernels))
  # float32 weights keep the FMA chain: their products would not be exact.
  assert not any(leaf.amx for leaf in leaves(model.decode_kernels))
  with kernels.amx_enabled_as(False):
    assert kernels.available() == library.ISA_NAMES[library.best_isa()]
    off = rounded.decode_kernels
    assert not any(leaf.amx for leaf in leaves(off))
    with kernels.product_inputs_as('bfloat16'):
      assert kernels.available().endswith('(vdpbf16ps)')
      assert not rounded.decode_kernels['decoder']['logits_dense'][
          'kernel'].amx
  assert rounded.decode_kernels is not off  # One copy per path.
  assert rounded.decode_kernels is rounded.decode_kernels


@built
@amx
def test_decoder_call_on_tiles_is_close_to_xla_and_position_invariant():
  model = bfloat16_valued(random_model(0))
  single = _chunk_logits(model, model.decode_kernels, 1)
  xla = _chunk_logits(model, None, 1)
  np.testing.assert_allclose(single, xla, atol=2e-5, rtol=2e-5)
  for chunk in (2, 3, 6):
    np.testing.assert_array_equal(
        _chunk_logits(model, model.decode_kernels, chunk), single)


@built
@amx
@pytest.mark.parametrize('batch', [
    pytest.param(1, marks=pytest.mark.slow),
    pytest.param(4, marks=pytest.mark.slow), 7])
def test_greedy_speculative_equals_baseline(batch):
  # Both decoders run the same tiles: greedy identity for every row, ragged
  # lengths (EOS inside the horizon), every gamma.
  target = bfloat16_valued(test_speculative._target())
  draft = bfloat16_valued(perturbed(test_speculative._target(), 0.3, seed=1))
  assert target.decode_kernels['decoder']['logits_dense']['kernel'].amx
  enc = random_inputs(7, 9, 512, seed=0)
  eos_id = test_speculative._eos_inside_horizon(target, enc)
  for gamma in (1, 3, 5):
    baseline, _ = test_speculative._assert_greedy_equal(
        target, draft, enc[:batch], gamma, eos_id)
  assert np.asarray(baseline.lengths).min() < test_speculative.MAX_LEN


@built
def test_bad_input_names_the_argument():
  w = _bf16_values((4, 3), 3)
  if not library.has_amx():
    with pytest.raises(ValueError, match='amx=True: AMX tiles are not usable'):
      kernels.pack_kernel(w, amx=True)
    return
  with pytest.raises(ValueError, match='needs weights that are bfloat16 '
                     'values'):
    kernels.pack_kernel(w + 1e-3, amx=True)
  with pytest.raises(ValueError, match='even input width'):
    kernels.pack_kernel(_bf16_values((5, 3), 3), amx=True)
  packed = kernels.pack_kernel(w, amx=True)
  with pytest.raises(ValueError, match=r'isa 3: a float32-input kernel '
                     r'packed with amx=True runs on AMX tiles only'):
    kernels.matmul(jnp.ones((2, 4)), packed, isa=3)
  with pytest.raises(ValueError, match=r"x has shape \(2, 6\).*input width 4"):
    kernels.matmul(jnp.ones((2, 6)), packed)
  assert kernels.matmul(jnp.ones((0, 4)), packed).shape == (0, 3)
