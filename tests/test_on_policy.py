"""On-policy distillation: the divergences, the draft's samples, the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import on_policy
from spec_decode import verification

from conftest import random_inputs
from conftest import random_model


def test_tvd_is_one_minus_the_acceptance_probability():
  rng = np.random.RandomState(0)
  teacher = jnp.asarray(rng.randn(2, 3, 11), jnp.float32)
  student = jnp.asarray(rng.randn(2, 3, 11), jnp.float32)
  tvd = on_policy.token_divergence(teacher, student, 'tvd')
  beta = verification.overlap_mass(jax.nn.softmax(teacher),
                                  jax.nn.softmax(student))
  np.testing.assert_allclose(np.asarray(tvd), 1.0 - np.asarray(beta),
                             atol=1e-6)
  assert np.allclose(on_policy.token_divergence(teacher, teacher, 'tvd'), 0,
                     atol=1e-6)


def test_forward_kl_matches_its_definition():
  rng = np.random.RandomState(1)
  teacher = rng.randn(4, 7).astype(np.float32)
  student = rng.randn(4, 7).astype(np.float32)
  p = np.exp(teacher) / np.exp(teacher).sum(-1, keepdims=True)
  q = np.exp(student) / np.exp(student).sum(-1, keepdims=True)
  expected = np.sum(p * (np.log(p) - np.log(q)), -1)
  got = on_policy.token_divergence(jnp.asarray(teacher), jnp.asarray(student),
                                   'forward_kl')
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)


def test_unknown_divergence_is_named():
  with pytest.raises(ValueError, match='on_policy_divergence'):
    on_policy.check_divergence('reverse_kl')


def test_samples_are_the_drafts_own_greedy_output():
  model = random_model(0, vocab_size=64, emb_dim=16, mlp_dim=32)
  inputs = random_inputs(3, 6, 64, seed=0)
  tokens, weights = on_policy.sample_continuations(
      model.config, model.params, inputs, jax.random.PRNGKey(0), 8, 0.0)
  expected = sd.generate(model, inputs, max_decode_len=8)
  np.testing.assert_array_equal(np.asarray(tokens),
                                np.asarray(expected.tokens))
  np.testing.assert_array_equal(np.asarray(weights).sum(1),
                                np.asarray(expected.lengths))


def test_loss_is_zero_for_a_draft_equal_to_its_teacher():
  model = random_model(1, vocab_size=64, emb_dim=16, mlp_dim=32)
  inputs = random_inputs(2, 5, 64, seed=1)
  loss, metrics = on_policy.on_policy_loss(
      model.config, model.config, model.params, model.params, inputs,
      jax.random.PRNGKey(3), 6, 1.0, 'tvd')
  assert float(loss) < 1e-5
  assert float(metrics['correct']) == float(metrics['token_count']) > 0
