"""An iteration's target call and verification (`target_verification`)."""

import jax
import jax.numpy as jnp
import numpy as np

import spec_decode as sd
from spec_decode import target_verification
from spec_decode.model import init_cache
from spec_decode.model.model import prepare_decoding
from spec_decode.sampling import SamplingConfig
from tests.conftest import random_inputs
from tests.conftest import random_model

GAMMA = 3


def _verify(model, enc, width, draft_tokens, proposed):
  """score_and_verify from position 0 (BOS) with greedy one-hot q."""
  config = model.config
  batch = enc.shape[0]
  vocab = config.vocab_size
  probs = jax.nn.one_hot(draft_tokens, vocab, dtype=jnp.float32)
  return target_verification.score_and_verify(
      width, GAMMA, config, model.params, None,
      prepare_decoding(config, model.params, enc),
      init_cache(config, batch, 16), jnp.zeros((batch, 1), jnp.int32),
      jnp.zeros((batch,), jnp.int32), draft_tokens, probs,
      jnp.zeros((batch, GAMMA), jnp.float32), proposed,
      jnp.ones((batch,), jnp.bool_),
      jax.random.split(jax.random.PRNGKey(0), batch), SamplingConfig(0.0),
      'token', 1.0)


def test_greedy_accepts_the_targets_own_continuation_and_adds_the_bonus():
  model = random_model(0)
  enc = jnp.asarray(random_inputs(3, 6, 512, 0))
  greedy = np.asarray(sd.generate(model, enc, max_decode_len=GAMMA + 1,
                                  eos_id=-1 % 512).tokens)
  proposals = jnp.asarray(greedy[:, :GAMMA])
  verified = _verify(model, enc, GAMMA + 1, proposals,
                     jnp.full((3,), GAMMA, jnp.int32))
  np.testing.assert_array_equal(verified.accepted, [GAMMA] * 3)
  np.testing.assert_array_equal(verified.new_tokens, greedy)
  np.testing.assert_array_equal(verified.examined, [GAMMA] * 3)
  # beta is 1 at each agreeing one-hot position.
  np.testing.assert_allclose(verified.beta_sum, [GAMMA] * 3)


def test_a_wrong_proposal_is_replaced_by_the_targets_token():
  model = random_model(0)
  enc = jnp.asarray(random_inputs(3, 6, 512, 0))
  greedy = np.asarray(sd.generate(model, enc, max_decode_len=GAMMA + 1,
                                  eos_id=-1 % 512).tokens)
  wrong = greedy[:, :GAMMA].copy()
  wrong[:, 1] = (wrong[:, 1] + 1) % 512
  verified = _verify(model, enc, GAMMA + 1, jnp.asarray(wrong),
                     jnp.full((3,), GAMMA, jnp.int32))
  np.testing.assert_array_equal(verified.accepted, [1] * 3)
  np.testing.assert_array_equal(np.asarray(verified.new_tokens)[:, :2],
                                greedy[:, :2])
  np.testing.assert_array_equal(verified.examined, [2] * 3)


def test_width_one_is_a_plain_target_step():
  model = random_model(0)
  enc = jnp.asarray(random_inputs(3, 6, 512, 0))
  baseline = sd.generate(model, enc, max_decode_len=1, eos_id=-1 % 512)
  verified = _verify(model, enc, 1, jnp.zeros((3, GAMMA), jnp.int32),
                     jnp.zeros((3,), jnp.int32))
  np.testing.assert_array_equal(verified.accepted, [0] * 3)
  np.testing.assert_array_equal(np.asarray(verified.new_tokens)[:, 0],
                                np.asarray(baseline.tokens)[:, 0])
  np.testing.assert_allclose(np.asarray(verified.new_logprobs)[:, 0],
                             np.asarray(baseline.token_logprobs)[:, 0],
                             atol=1e-5)
  assert verified.new_tokens.shape == (3, GAMMA + 1)
  np.testing.assert_array_equal(verified.examined, [0] * 3)
