"""Baseline decoding reproduces T5X's temperature_sample."""

import jax
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import decoding

from conftest import golden
from conftest import random_inputs
from conftest import random_model
from conftest import requires_fixtures
from conftest import t5x_model

FIXTURE_NAMES = ['t5x_tiny', 't5x_tiny_perturbed']


def _first_eos_lengths(tokens, eos_id):
  tokens = np.asarray(tokens)
  is_eos = tokens == eos_id
  return np.where(is_eos.any(1), is_eos.argmax(1) + 1, tokens.shape[1])


@requires_fixtures
@pytest.mark.parametrize('name', FIXTURE_NAMES)
@pytest.mark.parametrize('eos', ['eos_id', 'alt_eos_id'])
def test_greedy_matches_t5x_tokens_and_scores(name, eos):
  g = golden(name)
  eos_id = int(g[eos])
  prefix = 'alt_eos_' if eos == 'alt_eos_id' else ''
  result = sd.generate(t5x_model(name), g['encoder_input_tokens'],
                       max_decode_len=int(g['decode_max_len']), eos_id=eos_id)
  expected = g[prefix + 'greedy_tokens']
  np.testing.assert_array_equal(np.asarray(result.tokens), expected)
  np.testing.assert_array_equal(np.asarray(result.lengths),
                                _first_eos_lengths(expected, eos_id))
  np.testing.assert_allclose(np.asarray(result.sequence_logprobs),
                             g[prefix + 'greedy_sequence_logprob'], atol=1e-3)
  if not prefix:
    np.testing.assert_allclose(np.asarray(result.token_logprobs),
                               g['greedy_token_logprobs'], atol=1e-4)
  assert int(result.num_iterations) == int(g[prefix + 'greedy_num_steps'])


@requires_fixtures
def test_rows_stop_at_eos_and_are_zero_padded():
  g = golden('t5x_tiny_perturbed')
  result = sd.generate(t5x_model('t5x_tiny_perturbed'),
                       g['encoder_input_tokens'], max_decode_len=16)
  tokens = np.asarray(result.tokens)
  lengths = np.asarray(result.lengths)
  np.testing.assert_array_equal(lengths, [5, 10, 16])
  for row, length in enumerate(lengths):
    if length < 16:
      assert tokens[row, length - 1] == 1
      assert not tokens[row, length:].any()
      assert not np.asarray(result.token_logprobs)[row, length:].any()
  np.testing.assert_array_equal(np.asarray(result.target_calls), lengths)


def test_rows_do_not_depend_on_the_rest_of_the_batch():
  model = random_model(0)
  enc = random_inputs(5, 7, 512, 0)
  for temperature in (0.0, 1.0):
    rng = jax.random.PRNGKey(3)
    full = sd.generate(model, enc, max_decode_len=10, temperature=temperature,
                       rng=rng)
    prefix = sd.generate(model, enc[:2], max_decode_len=10,
                         temperature=temperature, rng=rng)
    np.testing.assert_array_equal(np.asarray(full.tokens)[:2],
                                  np.asarray(prefix.tokens))
    again = sd.generate(model, enc, max_decode_len=10,
                        temperature=temperature, rng=rng)
    np.testing.assert_array_equal(np.asarray(full.tokens),
                                  np.asarray(again.tokens))


def test_sampling_depends_on_rng_and_rows_differ():
  model = random_model(0)
  enc = np.tile(random_inputs(1, 7, 512, 0), (4, 1))
  a = np.asarray(sd.generate(model, enc, max_decode_len=12, temperature=1.0,
                             rng=jax.random.PRNGKey(0)).tokens)
  b = np.asarray(sd.generate(model, enc, max_decode_len=12, temperature=1.0,
                             rng=jax.random.PRNGKey(1)).tokens)
  assert (a != b).any()
  assert len({tuple(row) for row in a}) > 1  # Same input, own streams.


def test_compiles_once_per_shape_and_options():
  model = random_model(1)
  enc = random_inputs(2, 6, 512, 1)
  sd.generate(model, enc, max_decode_len=5)
  before = decoding.baseline_generate._cache_size()
  for seed in range(3):
    sd.generate(model, random_inputs(2, 6, 512, seed), max_decode_len=5)
  assert decoding.baseline_generate._cache_size() == before


def test_bfloat16_model_decodes():
  model32 = random_model(0)
  model16 = sd.Model(model32.config.replace(dtype='bfloat16'),
                     model32.params)
  result = sd.generate(model16, random_inputs(2, 6, 512, 0),
                       max_decode_len=6)
  assert np.asarray(result.tokens).shape == (2, 6)
  assert np.asarray(result.token_logprobs).dtype == np.float32
