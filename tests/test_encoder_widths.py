"""A decoding call's encoder runs on the input's used columns only, and
nothing a user sees changes but the time."""

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode.model import encoder_widths
from spec_decode.model.model import prepare_decoding

from conftest import decoder_compiles
from conftest import random_inputs
from conftest import random_model


def test_widths_are_the_length_and_its_halvings():
  assert encoder_widths.widths(64) == (8, 16, 32, 64)
  assert encoder_widths.widths(512) == (64, 128, 256, 512)
  assert encoder_widths.widths(100) == (16, 32, 56, 100)
  assert encoder_widths.widths(17) == (8, 17)
  # Nothing narrower than the smallest width to choose from.
  assert encoder_widths.widths(8) == (8,)
  assert encoder_widths.widths(5) == (5,)


def test_used_columns_reach_the_last_token_of_any_row():
  tokens = jnp.asarray([[5, 3, 1, 0, 0, 0],
                        [2, 0, 0, 0, 0, 0],
                        [4, 0, 7, 0, 0, 0]], jnp.int32)
  assert int(encoder_widths.used_columns(tokens)) == 3
  assert int(encoder_widths.used_columns(tokens[1:2])) == 1
  assert int(encoder_widths.used_columns(jnp.zeros((2, 6), jnp.int32))) == 0


def _encode(model, tokens, trim: bool):
  with encoder_widths.trimming(trim):
    # A new function per setting: the setting is read while tracing.
    return jax.jit(lambda p, t, k: prepare_decoding(model.config, p, t, k))(
        model.device_params, tokens, model.decode_kernels)


def test_trimmed_pass_equals_the_full_pass_at_every_token():
  model = random_model(3)
  tokens = random_inputs(3, 32, model.config.vocab_size, seed=1)
  tokens[:, 11:] = 0  # Used columns 1..11: the 16-column encoder runs.
  trimmed = _encode(model, jnp.asarray(tokens), True)
  full = _encode(model, jnp.asarray(tokens), False)
  np.testing.assert_array_equal(trimmed.encoder_mask, full.encoder_mask)
  real = tokens != 0  # [batch, enc_len]; padding is masked wherever read.
  for got, want in zip(trimmed.cross_keys, full.cross_keys):
    # [batch, heads, head_dim, enc_len] -> [batch, enc_len, heads, head_dim]
    got, want = (np.moveaxis(np.asarray(a), 3, 1) for a in (got, want))
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
    # The 16-column pass ran: nothing past it was computed.
    assert not np.any(got[:, 16:])
  for got, want in zip(trimmed.cross_values, full.cross_values):
    got, want = (np.moveaxis(np.asarray(a), 2, 1) for a in (got, want))
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert not np.any(got[:, 16:])


def test_decoded_outputs_do_not_change():
  model = random_model(4)
  draft = random_model(5)
  tokens = random_inputs(4, 40, model.config.vocab_size, seed=2)
  tokens[:, 13:] = 0
  options = dict(max_decode_len=10, eos_id=1)
  with encoder_widths.trimming(False):
    want = sd.generate(model, tokens, **options)
  got = sd.generate(model, tokens, **options)
  speculative = sd.generate(model, tokens, draft=draft, gamma=3, **options)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(speculative.tokens, want.tokens)
  np.testing.assert_allclose(got.token_logprobs, want.token_logprobs,
                             atol=1e-5)


def test_inputs_of_other_lengths_reuse_the_compiled_call():
  model = random_model(4)
  tokens = random_inputs(2, 40, model.config.vocab_size, seed=3,
                         min_length=40)
  sd.generate(model, tokens, max_decode_len=6)
  short = tokens.copy()
  short[:, 5:] = 0
  with decoder_compiles() as compiled:
    sd.generate(model, short, max_decode_len=6)
    sd.generate(model, np.where(np.arange(40) < 20, tokens, 0),
                max_decode_len=6)
  assert not compiled
