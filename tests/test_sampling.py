"""Logit processing keeps exactly the right tokens; sampling follows it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.sampling import process_logits
from spec_decode.sampling import SamplingConfig

from conftest import chi_square_pvalue
from conftest import FALSE_ALARM_RATE
from conftest import random_model

LOGITS = np.array([[2.0, 1.0, 0.5, 3.0, -1.0, 0.5]], np.float32)


def _kept(logprobs):
  return set(np.flatnonzero(np.isfinite(np.asarray(logprobs)[0])).tolist())


def test_temperature_scales_logits():
  logprobs = process_logits(jnp.asarray(LOGITS), SamplingConfig(0.5))
  np.testing.assert_allclose(np.asarray(logprobs),
                             jax.nn.log_softmax(LOGITS / 0.5), rtol=1e-6)


def test_greedy_is_one_hot_at_first_argmax():
  logits = jnp.asarray([[1.0, 3.0, 3.0, 0.0]])
  logprobs = np.asarray(process_logits(logits, SamplingConfig(0.0)))
  np.testing.assert_array_equal(logprobs, [[-np.inf, 0.0, -np.inf, -np.inf]])


@pytest.mark.parametrize('top_k, expected', [
    (1, {3}), (2, {0, 3}), (3, {0, 1, 3}),
    (4, {0, 1, 2, 3, 5}),  # ties with the 4th largest are kept, as T5X
    (6, {0, 1, 2, 3, 4, 5}), (0, {0, 1, 2, 3, 4, 5}), (100, {0, 1, 2, 3, 4, 5})
])
def test_top_k_keeps_the_k_largest(top_k, expected):
  logprobs = process_logits(jnp.asarray(LOGITS),
                            SamplingConfig(1.0, top_k=top_k))
  assert _kept(logprobs) == expected
  assert np.isclose(np.exp(np.asarray(logprobs)).sum(), 1.0)


def test_top_p_keeps_the_smallest_nucleus():
  probs = np.array([0.5, 0.2, 0.15, 0.1, 0.05], np.float32)
  logits = jnp.asarray(np.log(probs)[None])
  for top_p, expected in [(0.3, {0}), (0.5, {0}), (0.55, {0, 1}),
                          (0.7, {0, 1}), (0.71, {0, 1, 2}),
                          (0.9, {0, 1, 2, 3}), (0.96, {0, 1, 2, 3, 4}),
                          (1.0, {0, 1, 2, 3, 4})]:
    logprobs = process_logits(logits, SamplingConfig(1.0, top_p=top_p))
    assert _kept(logprobs) == expected, top_p
    kept = sorted(expected)
    np.testing.assert_allclose(np.exp(np.asarray(logprobs)[0, kept]),
                               probs[kept] / probs[kept].sum(), rtol=1e-5)


def test_top_p_applies_after_temperature_and_top_k():
  # At temperature 2 the distribution flattens, so the 0.6 nucleus grows.
  logits = jnp.asarray(np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]])))
  assert _kept(process_logits(logits, SamplingConfig(1.0, top_p=0.6))) == {
      0, 1}
  assert _kept(process_logits(logits, SamplingConfig(2.0, top_p=0.6))) == {
      0, 1, 2}
  # After top-2 the renormalised mass of token 0 is 0.61 >= 0.6.
  assert _kept(process_logits(logits, SamplingConfig(2.0, top_k=2,
                                                     top_p=0.6))) == {0}
  assert _kept(process_logits(logits, SamplingConfig(2.0, top_k=2,
                                                     top_p=0.62))) == {0, 1}


def test_ties_at_the_top_p_threshold_are_kept():
  logits = jnp.log(jnp.asarray([[0.4, 0.2, 0.2, 0.2]]))
  assert _kept(process_logits(logits, SamplingConfig(1.0, top_p=0.5))) == {
      0, 1, 2, 3}


@pytest.mark.parametrize('kwargs, message', [
    (dict(temperature=-0.1), 'temperature must be >= 0'),
    (dict(temperature=float('nan')), 'temperature must be finite'),
    (dict(top_p=0.0), r'top_p must be in \(0, 1\]'),
    (dict(top_p=1.5), r'top_p must be in \(0, 1\]'),
    (dict(top_k=-1), 'top_k must be an integer >= 0'),
])
def test_bad_options_name_the_argument(kwargs, message):
  with pytest.raises(ValueError, match=message):
    SamplingConfig(**{'temperature': 1.0, **kwargs})
  with pytest.raises(ValueError, match=message):
    sd.generate(random_model(0), np.ones((1, 3), np.int32), max_decode_len=2,
                **{'temperature': 1.0, **kwargs})


def test_top_k_must_be_an_integer():
  with pytest.raises(TypeError, match='top_k must be an integer'):
    SamplingConfig(1.0, top_k=2.5)


@pytest.mark.slow
@pytest.mark.parametrize('temperature, top_k, top_p', [
    (1.0, 0, 1.0), (0.6, 0, 1.0), (1.5, 3, 1.0), (1.0, 0, 0.8)])
def test_generate_samples_follow_the_processed_distribution(
    temperature, top_k, top_p):
  # One input repeated over many rows: each row draws from its own stream,
  # so the first tokens are independent samples of one distribution.
  model = random_model(4, vocab_size=8, emb_dim=16, mlp_dim=32)
  num_samples = 20000
  enc = np.tile(np.array([[5, 3, 7, 2]], np.int32), (num_samples, 1))
  result = sd.generate(model, enc, max_decode_len=1, temperature=temperature,
                       top_k=top_k, top_p=top_p,
                       rng=jax.random.PRNGKey(11))
  first = np.asarray(result.tokens[:, 0])
  logits = model.logits(enc[:1], np.zeros((1, 1), np.int32))[0, 0]
  probs = np.exp(np.asarray(process_logits(
      logits, SamplingConfig(temperature, top_k, top_p))))
  counts = np.bincount(first, minlength=8)
  assert chi_square_pvalue(counts, probs) > FALSE_ALARM_RATE
  # And it really is temperature-scaled: the unscaled softmax is rejected
  # whenever the processing changes the distribution noticeably.
  raw = np.asarray(jax.nn.softmax(logits))
  if np.abs(raw - probs).sum() > 0.05:
    assert chi_square_pvalue(counts, raw) < FALSE_ALARM_RATE
