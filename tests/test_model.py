"""The model mirrors T5X numerically, by parameter tree, and in its decoder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode.model import init_cache
from spec_decode.model import param_shapes
from spec_decode.model import parameter_count
from spec_decode.model import shift_right
from spec_decode.model.attention import relative_position_bucket
from spec_decode.model.attention import relative_position_bucket_jnp
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding
from spec_decode.model.network import Transformer

from conftest import golden
from conftest import random_inputs
from conftest import random_model
from conftest import requires_fixtures
from conftest import t5x_model

FIXTURE_NAMES = ['t5x_tiny', 't5x_tiny_perturbed']


@requires_fixtures
@pytest.mark.parametrize('name', FIXTURE_NAMES)
def test_teacher_forced_logits_match_t5x(name):
  g = golden(name)
  logits = np.asarray(t5x_model(name).logits(g['encoder_input_tokens'],
                                             g['decoder_input_tokens']))
  valid = g['tf_logits_valid_mask']
  np.testing.assert_allclose(logits[valid], g['tf_logits'][valid],
                             atol=1e-4, rtol=1e-4)


@requires_fixtures
@pytest.mark.parametrize('name', FIXTURE_NAMES)
def test_encoder_output_matches_t5x(name):
  g = golden(name)
  encoded = np.asarray(t5x_model(name).encode(g['encoder_input_tokens']))
  np.testing.assert_allclose(encoded, g['encoder_output'], atol=1e-4,
                             rtol=1e-4)


@requires_fixtures
@pytest.mark.parametrize('name', FIXTURE_NAMES)
def test_score_matches_t5x_scorer(name):
  g = golden(name)
  scores = np.asarray(t5x_model(name).score(g['encoder_input_tokens'],
                                            g['decoder_target_tokens']))
  np.testing.assert_allclose(scores, g['tf_target_token_logprobs'], atol=1e-4)
  np.testing.assert_allclose(scores.sum(-1), g['tf_target_sequence_logprob'],
                             atol=1e-3)


@requires_fixtures
@pytest.mark.parametrize('name', FIXTURE_NAMES)
def test_incremental_decoding_matches_t5x_step_logits(name):
  g = golden(name)
  model = t5x_model(name)
  config = model.config
  enc = jnp.asarray(g['encoder_input_tokens'])
  steps = g['greedy_step_input_tokens']
  batch, num_steps = steps.shape
  encoded = prepare_decoding(config, model.params, enc)
  cache = init_cache(config, batch, num_steps)
  step = jax.jit(lambda t, s, c: decode_chunk(config, model.params, t, s, c,
                                              encoded))
  alive = g['greedy_step_alive_mask']
  for i in range(num_steps):
    logits, cache = step(jnp.asarray(steps[:, i:i + 1]),
                         jnp.full((batch,), i, jnp.int32), cache)
    np.testing.assert_allclose(
        np.asarray(logits[:, 0])[alive[:, i]],
        g['greedy_step_logits'][:, i][alive[:, i]], atol=1e-4, rtol=1e-4)


@requires_fixtures
def test_relative_position_buckets_match_t5x():
  g = golden('t5x_tiny')
  probe = g['relpos_bucket_probe_relative_position']
  for bidirectional, key in [(True, 'relpos_bucket_probe_bidirectional'),
                             (False, 'relpos_bucket_probe_causal')]:
    np.testing.assert_array_equal(
        relative_position_bucket(probe, bidirectional, 32, 128), g[key])
    np.testing.assert_array_equal(
        np.asarray(relative_position_bucket_jnp(jnp.asarray(probe),
                                                bidirectional, 32, 128)),
        g[key])
  # The same buckets further out than the probe: everything is the end bucket.
  far = np.array([-100000, -5000, 5000, 100000])
  np.testing.assert_array_equal(
      np.asarray(relative_position_bucket_jnp(jnp.asarray(far), True, 32,
                                              128)),
      relative_position_bucket(far, True, 32, 128))
  for length, key in [(12, 'relpos_buckets_encoder'),
                      (16, 'relpos_buckets_decoder')]:
    positions = np.arange(length)
    relative = positions[None, :] - positions[:, None]
    np.testing.assert_array_equal(
        relative_position_bucket(relative, key.endswith('encoder'), 32, 128),
        g[key])


@requires_fixtures
def test_norm_scales_change_the_output():
  # The perturbed fixture has non-unit norm scales: resetting them must move
  # the logits, so a model that ignored them could not match its goldens.
  g = golden('t5x_tiny_perturbed')
  model = t5x_model('t5x_tiny_perturbed')
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: np.ones_like(x) if 'norm' in jax.tree_util.keystr(path)
      else x, model.params)
  plain = sd.Model(model.config, params)
  logits = np.asarray(plain.logits(g['encoder_input_tokens'],
                                   g['decoder_input_tokens']))
  valid = g['tf_logits_valid_mask']
  assert np.abs(logits[valid] - g['tf_logits'][valid]).max() > 1e-2


@jax.jit
def _decode_chunk(params, tokens, start, cache, encoded):
  return decode_chunk(random_model(0).config, params, tokens, start, cache,
                      encoded)


def _decode_in_random_chunks(model, enc, dec, seed):
  """Decodes `dec` in chunks of random size; rows keep random prefixes."""
  config = model.config
  batch, length = dec.shape
  max_chunk = 5
  padded = np.pad(dec, ((0, 0), (0, max_chunk)))
  encoded = prepare_decoding(config, model.params, jnp.asarray(enc))
  cache = init_cache(config, batch, length + max_chunk)
  step = lambda t, s, c: _decode_chunk(model.params, t, s, c, encoded)
  rng = np.random.RandomState(seed)
  position = np.zeros(batch, np.int32)
  out = np.zeros((batch, length, config.vocab_size), np.float32)
  while (position < length).any():
    k = rng.randint(1, max_chunk + 1)
    chunk = np.stack([padded[b, position[b]:position[b] + k]
                      for b in range(batch)])
    logits, cache = step(jnp.asarray(chunk), jnp.asarray(position), cache)
    logits = np.asarray(logits)
    # Each row keeps a random prefix of the chunk, as after a rejection; the
    # rest of its cache entries are stale and must not leak into later calls.
    keep = rng.randint(1, k + 1, size=batch)
    for b in range(batch):
      n = min(keep[b], length - position[b])
      if n > 0:
        out[b, position[b]:position[b] + n] = logits[b, :n]
        position[b] += n
  return out


@pytest.mark.parametrize('seed', [0, 1])
def test_chunked_decoding_equals_stepwise_equals_teacher_forcing(seed):
  model = random_model(seed)
  vocab = model.config.vocab_size
  enc = random_inputs(3, 9, vocab, seed)
  dec = np.random.RandomState(seed).randint(1, vocab, size=(3, 14))
  dec[:, 0] = 0
  teacher_forced = np.asarray(model.logits(enc, dec))
  chunked = _decode_in_random_chunks(model, enc, dec, seed)

  config = model.config
  encoded = prepare_decoding(config, model.params, jnp.asarray(enc))
  cache = init_cache(config, 3, dec.shape[1] + 5)
  stepwise = []
  for i in range(dec.shape[1]):
    logits, cache = _decode_chunk(model.params, jnp.asarray(dec[:, i:i + 1]),
                                  jnp.full((3,), i, jnp.int32), cache, encoded)
    stepwise.append(np.asarray(logits[:, 0]))
  stepwise = np.stack(stepwise, axis=1)
  np.testing.assert_allclose(chunked, teacher_forced, atol=1e-5, rtol=0)
  np.testing.assert_allclose(stepwise, teacher_forced, atol=1e-5, rtol=0)


def test_parameter_tree_matches_t5x_names_and_shapes():
  config = sd.t5_config('t5_1_1_small')
  shapes = param_shapes(config)
  assert sorted(shapes) == ['decoder', 'encoder', 'token_embedder']
  assert shapes['token_embedder']['embedding'].shape == (32128, 512)
  assert shapes['decoder']['logits_dense']['kernel'].shape == (512, 32128)
  assert shapes['encoder']['relpos_bias']['rel_embedding'].shape == (6, 32)
  assert len([k for k in shapes['encoder'] if k.startswith('layers_')]) == 8
  layer = shapes['decoder']['layers_7']
  assert sorted(layer) == [
      'encoder_decoder_attention', 'mlp', 'pre_cross_attention_layer_norm',
      'pre_mlp_layer_norm', 'pre_self_attention_layer_norm', 'self_attention']
  assert layer['self_attention']['query']['kernel'].shape == (512, 384)
  assert layer['self_attention']['out']['kernel'].shape == (384, 512)
  assert layer['mlp']['wi_0']['kernel'].shape == (512, 1024)
  assert layer['mlp']['wo']['kernel'].shape == (1024, 512)
  # T5 v1.1 small, as T5X counts it.
  assert parameter_count(shapes) == 76_961_152


def test_xxl_preset_shapes():
  shapes = param_shapes(sd.t5_config('t5_1_1_xxl'))
  attention = shapes['encoder']['layers_23']['attention']
  assert attention['query']['kernel'].shape == (4096, 4096)
  assert shapes['decoder']['layers_0']['mlp']['wi_1']['kernel'].shape == (
      4096, 10240)


def test_logical_axis_names_are_kept():
  axes = sd.logical_axes(sd.t5_config('t5_1_1_tiny'))
  assert tuple(axes['token_embedder']['embedding']) == ('vocab', 'embed')
  assert tuple(axes['decoder']['logits_dense']['kernel']) == ('embed', 'vocab')
  attention = axes['encoder']['layers_0']['attention']
  assert tuple(attention['query']['kernel']) == ('embed', 'joined_kv')
  assert tuple(attention['out']['kernel']) == ('joined_kv', 'embed')
  mlp = axes['decoder']['layers_1']['mlp']
  assert tuple(mlp['wi_0']['kernel']) == ('embed', 'mlp')
  assert tuple(mlp['wo']['kernel']) == ('mlp', 'embed')
  assert tuple(axes['decoder']['relpos_bias']['rel_embedding']) == (
      'heads', 'relpos_buckets')
  assert tuple(axes['encoder']['encoder_norm']['scale']) == ('embed',)


def test_init_params_is_t5x_style():
  model = random_model(0, vocab_size=1000, emb_dim=64, num_heads=4,
                       head_dim=16, mlp_dim=128)
  params = model.params
  assert all(np.asarray(x).dtype == np.float32
             for x in jax.tree_util.tree_leaves(params))
  np.testing.assert_array_equal(params['encoder']['encoder_norm']['scale'], 1)
  assert abs(np.std(params['token_embedder']['embedding']) - 1.0) < 0.05
  # Queries are scaled down by sqrt(head_dim) (T5 has no 1/sqrt(d) in
  # attention), keys are not.
  query = params['encoder']['layers_0']['attention']['query']['kernel']
  key = params['encoder']['layers_0']['attention']['key']['kernel']
  assert abs(np.std(key) / np.std(query) - 4.0) < 0.5


def test_activations_default_to_bfloat16_and_float32_on_request():
  assert sd.t5_config('t5_1_1_small').dtype == 'bfloat16'
  model32 = random_model(0)
  model16 = sd.Model(model32.config.replace(dtype='bfloat16'), model32.params)
  enc = random_inputs(2, 6, 512, 0)
  dec = np.zeros((2, 4), np.int32)
  logits32 = np.asarray(model32.logits(enc, dec))
  logits16 = np.asarray(model16.logits(enc, dec))
  assert logits16.dtype == np.float32  # Logits are float32 in both.
  assert 0 < np.abs(logits16 - logits32).max() < 0.1
  encoded = model16.encode(enc)
  assert encoded.dtype == jnp.bfloat16


def test_zero_layer_decoder_is_a_bigram_model():
  model = random_model(3, num_encoder_layers=0, num_decoder_layers=0)
  enc_a = random_inputs(1, 5, 512, 0)
  enc_b = random_inputs(1, 5, 512, 1)
  dec = np.array([[0, 7, 9, 7]])
  logits_a = np.asarray(model.logits(enc_a, dec))
  logits_b = np.asarray(model.logits(enc_b, dec))
  np.testing.assert_allclose(logits_a, logits_b)  # No dependence on input.
  np.testing.assert_allclose(logits_a[0, 1], logits_a[0, 3])  # Same token.


def test_presets_and_overrides():
  config = sd.t5_config('t5_1_1_base', dtype='float32', num_decoder_layers=2)
  assert (config.emb_dim, config.num_heads, config.num_encoder_layers,
          config.num_decoder_layers, config.mlp_dim) == (768, 12, 12, 2, 2048)
  assert hash(config) == hash(sd.t5_config('t5_1_1_base', dtype='float32',
                                           num_decoder_layers=2))
  with pytest.raises(ValueError, match='name must be one of'):
    sd.t5_config('t5_1_1_huge')
  with pytest.raises(ValueError, match='Unknown T5Config field'):
    sd.t5_config('t5_1_1_small', num_layers=3)
  with pytest.raises(ValueError, match='dtype must be one of'):
    sd.t5_config('t5_1_1_small', dtype='float16')


def test_model_rejects_params_of_another_config():
  small = random_model(0)
  with pytest.raises(ValueError,
                     match=r"'decoder/logits_dense/kernel' has shape \(32, "):
    sd.Model(small.config.replace(vocab_size=100), small.params)
  with pytest.raises(ValueError, match="missing parameter 'decoder/layers_2"):
    sd.Model(small.config.replace(num_decoder_layers=3), small.params)


def test_logits_reject_bad_token_arrays():
  model = random_model(0)
  ok = np.zeros((2, 3), np.int32)
  with pytest.raises(ValueError, match='encoder_input_tokens must be 2-D'):
    model.logits(np.zeros(3, np.int32), ok)
  with pytest.raises(TypeError, match='decoder_input_tokens must be an '
                     'integer array'):
    model.logits(ok, ok.astype(np.float32))
  with pytest.raises(ValueError, match='outside \\[0, vocab_size=512\\)'):
    model.logits(ok + 512, ok)
  with pytest.raises(ValueError, match='batch'):
    model.logits(ok, np.zeros((3, 3), np.int32))


def test_dropout_acts_in_training_only():
  model = random_model(0, dropout_rate=0.3)
  enc, dec = random_inputs(2, 6, 512, seed=1), random_inputs(2, 5, 512, seed=2)
  without = random_model(0)  # Same params, dropout_rate 0.
  # Scoring and decoding never drop out: the rate changes nothing there.
  np.testing.assert_array_equal(model.logits(enc, dec),
                                without.logits(enc, dec))
  np.testing.assert_array_equal(
      sd.generate(model, enc, max_decode_len=6).tokens,
      sd.generate(without, enc, max_decode_len=6).tokens)
  network = Transformer(model.config)
  train = lambda seed: network.apply(
      {'params': model.params}, enc, dec, enable_dropout=True,
      rngs={'dropout': jax.random.PRNGKey(seed)})
  np.testing.assert_array_equal(train(0), train(0))
  assert np.abs(np.asarray(train(0)) - np.asarray(train(1))).max() > 1e-3
  assert np.abs(np.asarray(train(0)) -
                np.asarray(model.logits(enc, dec))).max() > 1e-3
  with pytest.raises(ValueError, match=r'dropout_rate must be in \[0, 1\)'):
    sd.T5Config(dropout_rate=1.0)


def test_config_takes_dtype_objects_as_t5x_python_configs_pass_them():
  assert sd.T5Config(dtype=jnp.bfloat16).dtype == 'bfloat16'
  assert sd.T5Config(dtype=np.float32) == sd.T5Config(dtype='float32')
  with pytest.raises(ValueError, match="dtype must be one of"):
    sd.T5Config(dtype=np.int32)


def test_notebook_users_reach_subpackages_from_the_package():
  assert 't5_local_target' in sd.pretrained.available()
  assert sd.analysis.expected_tokens(0.5, 3) == pytest.approx(1.875)
  assert callable(sd.costs.cost_profile)


def test_shift_right_keeps_the_array_kind():
  targets = np.array([[5, 6, 1], [7, 1, 0]], np.int32)
  expected = [[0, 5, 6], [0, 7, 1]]
  shifted = shift_right(targets)
  assert isinstance(shifted, np.ndarray)
  np.testing.assert_array_equal(shifted, expected)
  np.testing.assert_array_equal(jax.jit(shift_right)(jnp.asarray(targets)),
                                expected)
