"""Speculative decoding is exact: greedy equals baseline, samples follow p."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import block_verification
from spec_decode import speculative
from spec_decode import verification
from spec_decode.sampling import process_logits
from spec_decode.sampling import SamplingConfig

from conftest import chi_square_pvalue
from conftest import FALSE_ALARM_RATE
from conftest import golden
from conftest import perturbed
from conftest import random_inputs
from conftest import random_model
from conftest import requires_fixtures
from conftest import t5x_model

MAX_LEN = 24


def _target():
  return random_model(0)


def _draft():
  # Noisy copy of the target: it agrees often but not always, so every
  # iteration mixes acceptances, rejections and bonus tokens.
  return perturbed(_target(), 0.3, seed=1)


def _frequent_token(tokens):
  values, counts = np.unique(np.asarray(tokens)[:, 2:], return_counts=True)
  return int(values[np.argmax(counts)])


def _assert_greedy_equal(target, draft, enc, gamma, eos_id, max_len=MAX_LEN,
                         verification='token', **kwargs):
  baseline = sd.generate(target, enc, max_decode_len=max_len, eos_id=eos_id)
  spec = sd.generate(target, enc, max_decode_len=max_len, eos_id=eos_id,
                     draft=draft, gamma=gamma, verification=verification,
                     **kwargs)
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                np.asarray(baseline.tokens))
  np.testing.assert_array_equal(np.asarray(spec.lengths),
                                np.asarray(baseline.lengths))
  np.testing.assert_allclose(np.asarray(spec.token_logprobs),
                             np.asarray(baseline.token_logprobs), atol=1e-5)
  return baseline, spec


def _eos_inside_horizon(target, enc):
  """An EOS id that some rows emit early and others never do."""
  tokens = np.asarray(sd.generate(target, enc, max_decode_len=MAX_LEN).tokens)
  return _frequent_token(tokens)


@pytest.mark.parametrize('gamma', [1, 2, 3, 5, 8])
def test_greedy_equals_baseline_for_every_gamma(gamma):
  enc = random_inputs(7, 9, 512, seed=0)
  eos_id = _eos_inside_horizon(_target(), enc)
  baseline, spec = _assert_greedy_equal(_target(), _draft(), enc, gamma,
                                        eos_id)
  lengths = np.asarray(baseline.lengths)
  assert lengths.min() < MAX_LEN and lengths.max() == MAX_LEN  # Ragged.
  accepted = np.asarray(spec.draft_tokens_accepted)
  proposed = np.asarray(spec.draft_tokens_proposed)
  assert (accepted < proposed).any() and accepted.sum() > 0
  assert (np.asarray(spec.target_calls) <= lengths).all()


@pytest.mark.parametrize('gamma', [1, 4])
def test_greedy_block_verification_equals_baseline(gamma):
  # One-hot p and q reduce block verification to "accept while the
  # argmaxes agree": the output is the baseline's, ragged rows and all.
  enc = random_inputs(7, 9, 512, seed=0)
  eos_id = _eos_inside_horizon(_target(), enc)
  baseline, spec = _assert_greedy_equal(_target(), _draft(), enc, gamma,
                                        eos_id, verification='block')
  lengths = np.asarray(baseline.lengths)
  assert lengths.min() < MAX_LEN and lengths.max() == MAX_LEN  # Ragged.
  accepted = np.asarray(spec.draft_tokens_accepted)
  assert (accepted < np.asarray(spec.draft_tokens_proposed)).any()
  assert accepted.sum() > 0
  # The same iterations as token verification: greedy gains nothing.
  token = sd.generate(_target(), enc, max_decode_len=MAX_LEN, eos_id=eos_id,
                      draft=_draft(), gamma=gamma)
  np.testing.assert_array_equal(np.asarray(spec.target_calls),
                                np.asarray(token.target_calls))


# Thresholds near the median of the _draft()'s own confidence (max prob) and
# entropy on these inputs, so rows stop after different numbers of tokens.
STOP_RULES = [('confidence', 0.0275), ('entropy', 5.68)]


@pytest.mark.parametrize('rule, threshold', STOP_RULES)
@pytest.mark.parametrize('verification', ['token', 'block'])
def test_greedy_with_draft_stop_equals_baseline(rule, threshold,
                                                verification):
  enc = random_inputs(7, 9, 512, seed=0)
  eos_id = _eos_inside_horizon(_target(), enc)
  _, spec = _assert_greedy_equal(_target(), _draft(), enc, 5, eos_id,
                                 verification=verification, draft_stop=rule,
                                 draft_threshold=threshold)
  calls = np.asarray(spec.target_calls)
  proposed = np.asarray(spec.draft_tokens_proposed)
  accepted = np.asarray(spec.draft_tokens_accepted)
  # Rows stopped early (fewer than gamma proposals per call) but always
  # proposed at least one token; nothing past a stop was accepted.
  assert (proposed >= calls).all() and (proposed < 5 * calls).any()
  assert (accepted <= proposed).all()
  examined = np.asarray(spec.verified_positions)
  assert (accepted <= examined).all() and (examined <= proposed).all()


@pytest.mark.parametrize('batch', [1, 4])
def test_greedy_equals_baseline_for_batch_sizes_without_eos(batch):
  enc = random_inputs(batch, 9, 512, seed=batch)
  _assert_greedy_equal(_target(), _draft(), enc, gamma=3, eos_id=1)


def test_greedy_equals_baseline_with_an_unrelated_draft():
  # A smaller, independently initialised draft is almost always rejected:
  # every token then comes from the correction step.
  draft = random_model(7, emb_dim=16, num_heads=2, mlp_dim=32,
                       num_encoder_layers=1, num_decoder_layers=1)
  enc = random_inputs(4, 9, 512, seed=3)
  _, spec = _assert_greedy_equal(_target(), draft, enc, gamma=4, eos_id=1)
  assert np.asarray(spec.acceptance_rate).max() < 0.5


def test_greedy_equals_baseline_with_bigram_draft():
  draft = random_model(8, num_encoder_layers=0, num_decoder_layers=0)
  _assert_greedy_equal(_target(), draft, random_inputs(3, 9, 512, 5),
                       gamma=2, eos_id=1)


def test_greedy_equals_baseline_in_bfloat16():
  target = sd.Model(_target().config.replace(dtype='bfloat16'),
                    _target().params)
  draft = sd.Model(_draft().config.replace(dtype='bfloat16'), _draft().params)
  _assert_greedy_equal(target, draft, random_inputs(4, 9, 512, 6), gamma=3,
                       eos_id=1)


@requires_fixtures
@pytest.mark.parametrize('target_name, draft_name, eos', [
    ('t5x_tiny_perturbed', 't5x_tiny', 'eos_id'),
    ('t5x_tiny', 't5x_tiny_perturbed', 'alt_eos_id'),
])
def test_greedy_equals_t5x_with_fixture_targets(target_name, draft_name, eos):
  g = golden(target_name)
  eos_id = int(g[eos])
  target = t5x_model(target_name)
  draft = sd.Model(t5x_model(draft_name).config,
                   t5x_model(draft_name).params, eos_id=target.eos_id)
  spec = sd.generate(target, g['encoder_input_tokens'], max_decode_len=16,
                     eos_id=eos_id, draft=draft, gamma=3)
  prefix = 'alt_eos_' if eos == 'alt_eos_id' else ''
  np.testing.assert_array_equal(np.asarray(spec.tokens),
                                g[prefix + 'greedy_tokens'])


@pytest.mark.parametrize('gamma, verification', [(2, 'token'), (5, 'token'),
                                                 (3, 'block')])
def test_draft_equal_to_target_accepts_everything(gamma, verification):
  enc = random_inputs(4, 9, 512, seed=2)
  eos_id = _eos_inside_horizon(_target(), enc)
  for temperature in (0.0, 1.0):
    spec = sd.generate(_target(), enc, max_decode_len=MAX_LEN, eos_id=eos_id,
                       draft=_target(), gamma=gamma, temperature=temperature,
                       verification=verification)
    lengths = np.asarray(spec.lengths)
    np.testing.assert_array_equal(np.asarray(spec.target_calls),
                                  np.ceil(lengths / (gamma + 1)))
    np.testing.assert_array_equal(np.asarray(spec.acceptance_rate), 1.0)
    np.testing.assert_allclose(np.asarray(spec.mean_beta), 1.0, atol=1e-5)


@pytest.mark.parametrize('verification', ['token', 'block'])
def test_statistics_are_consistent(verification):
  enc = random_inputs(7, 9, 512, seed=0)
  spec = sd.generate(_target(), enc, max_decode_len=MAX_LEN, draft=_draft(),
                     gamma=3, temperature=1.0, rng=jax.random.PRNGKey(2),
                     verification=verification)
  calls = np.asarray(spec.target_calls)
  np.testing.assert_array_equal(np.asarray(spec.draft_tokens_proposed),
                                3 * calls)
  accepted = np.asarray(spec.draft_tokens_accepted)
  examined = np.asarray(spec.verified_positions)
  # An iteration examines its accepted tokens and the first rejected one.
  assert (accepted <= examined).all() and (examined <= 3 * calls).all()
  assert (examined <= accepted + calls).all()
  np.testing.assert_allclose(np.asarray(spec.acceptance_rate),
                             accepted / examined)
  # Each call emits its accepted tokens plus one, until the length limit.
  assert (np.asarray(spec.lengths) <= accepted + calls).all()
  beta = np.asarray(spec.mean_beta)
  assert ((beta > 0) & (beta < 1)).all()
  assert int(spec.num_iterations) == calls.max()


def test_same_rng_same_outputs_across_calls_and_batch_sizes():
  enc = random_inputs(5, 9, 512, seed=4)
  kwargs = dict(max_decode_len=MAX_LEN, draft=_draft(), gamma=3,
                temperature=1.0, top_k=20, rng=jax.random.PRNGKey(9))
  first = sd.generate(_target(), enc, **kwargs)
  again = sd.generate(_target(), enc, **kwargs)
  fewer = sd.generate(_target(), enc[:2], **kwargs)
  np.testing.assert_array_equal(np.asarray(first.tokens),
                                np.asarray(again.tokens))
  np.testing.assert_array_equal(np.asarray(first.tokens)[:2],
                                np.asarray(fewer.tokens))
  other = sd.generate(_target(), enc, **{**kwargs,
                                         'rng': jax.random.PRNGKey(10)})
  assert (np.asarray(other.tokens) != np.asarray(first.tokens)).any()


def test_compiles_once_per_static_configuration():
  enc = random_inputs(2, 9, 512, seed=4)
  sd.generate(_target(), enc, max_decode_len=8, draft=_draft(), gamma=2)
  before = speculative._speculative_generate._cache_size()
  for seed in range(3):
    sd.generate(_target(), random_inputs(2, 9, 512, seed), max_decode_len=8,
                draft=_draft(), gamma=2)
  assert speculative._speculative_generate._cache_size() == before


@pytest.mark.parametrize('kwargs, error, message', [
    (dict(gamma=0), ValueError, 'gamma must be an integer >= 1'),
    (dict(gamma=2.0), TypeError, 'gamma must be an integer'),
    (dict(lenience=0.0), ValueError, r'lenience must be in \(0, 1\]'),
    (dict(lenience=1.5), ValueError, r'lenience must be in \(0, 1\]'),
    (dict(draft='small'), TypeError, 'draft must be a spec_decode.Model'),
    (dict(verification='tree'), ValueError,
     "verification must be one of 'token', 'block', got 'tree'"),
    (dict(verification=None), ValueError,
     "verification must be one of 'token', 'block', got None"),
    (dict(verification='Block'), ValueError, 'verification must be one of'),
    (dict(verification='block', lenience=0.5), ValueError,
     "lenience must be 1 with verification='block'"),
    (dict(verification='block', gamma='auto', lenience=0.5), ValueError,
     "lenience must be 1 with verification='block'"),
    (dict(draft_stop='margin', draft_threshold=0.5), ValueError,
     "draft_stop must be None, 'confidence' or 'entropy', got 'margin'"),
    (dict(draft_stop='confidence'), ValueError,
     "draft_threshold must be given with draft_stop='confidence'"),
    (dict(draft_threshold=0.5), ValueError, 'draft_threshold needs '
     'draft_stop'),
    (dict(draft_stop='confidence', draft_threshold=1.5), ValueError,
     r"draft_threshold must be in \(0, 1\] with draft_stop='confidence'"),
    (dict(draft_stop='confidence', draft_threshold=0.0), ValueError,
     r'draft_threshold must be in \(0, 1\]'),
    (dict(draft_stop='entropy', draft_threshold=-0.1), ValueError,
     "draft_threshold must be >= 0 with draft_stop='entropy'"),
    (dict(draft_stop='entropy', draft_threshold='high'), TypeError,
     'draft_threshold must be a number'),
    (dict(draft_stop='entropy', draft_threshold=float('nan')), ValueError,
     'draft_threshold must be finite'),
])
def test_bad_arguments(kwargs, error, message):
  arguments = dict(draft=_draft(), gamma=2)
  arguments.update(kwargs)
  with pytest.raises(error, match=message):
    sd.generate(_target(), np.ones((1, 3), np.int32), max_decode_len=4,
                **arguments)


def test_vocabulary_and_eos_mismatch():
  other_vocab = random_model(0, vocab_size=300)
  with pytest.raises(ValueError, match='draft has vocab_size 300 but the '
                     'target has 512'):
    sd.generate(_target(), np.ones((1, 3), np.int32), max_decode_len=4,
                draft=other_vocab)
  other_eos = sd.Model(_draft().config, _draft().params, eos_id=2)
  with pytest.raises(ValueError, match='draft has eos_id 2 but the target '
                     'has 1'):
    sd.generate(_target(), np.ones((1, 3), np.int32), max_decode_len=4,
                draft=other_eos)


# The rejection step alone, computed exactly.

# End to end against an exactly enumerated distribution.

VOCAB = 5
E2E_LEN = 3
SAMPLES = 30000


def _tiny_pair():
  target = random_model(21, vocab_size=VOCAB, emb_dim=16, mlp_dim=32)
  draft = random_model(22, vocab_size=VOCAB, emb_dim=8, num_heads=2,
                       mlp_dim=16, num_encoder_layers=1, num_decoder_layers=1)
  return target, draft


def _exact_distribution(target, enc, sampling, eos_id):
  """P(output) for every output, from teacher-forced target logits."""
  sequences = np.array(list(itertools.product(range(VOCAB),
                                              repeat=E2E_LEN)), np.int32)
  inputs = np.concatenate([np.zeros((len(sequences), 1), np.int32),
                           sequences[:, :-1]], axis=1)
  logits = target.logits(np.tile(enc, (len(sequences), 1)), inputs)
  logprobs = np.asarray(process_logits(logits, sampling), np.float64)
  step = np.take_along_axis(logprobs, sequences[..., None], axis=-1)[..., 0]
  probs = {}
  for sequence, step_logprobs in zip(sequences, step):
    is_eos = sequence == eos_id
    end = int(np.argmax(is_eos)) + 1 if is_eos.any() else E2E_LEN
    output = tuple(sequence[:end]) + (0,) * (E2E_LEN - end)
    probs[output] = float(np.exp(step_logprobs[:end].sum()))
  return probs


def _sample_counts(target, draft, enc, sampling, gamma, seed,
                   verification='token'):
  result = sd.generate(target, np.tile(enc, (SAMPLES, 1)),
                       max_decode_len=E2E_LEN, draft=draft, gamma=gamma,
                       temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p, rng=jax.random.PRNGKey(seed),
                       verification=verification)
  outputs, counts = np.unique(np.asarray(result.tokens), axis=0,
                              return_counts=True)
  return {tuple(o): int(c) for o, c in zip(outputs, counts)}, result


def _pvalue(counts, probs):
  assert set(counts) <= set(probs), 'sampled an impossible output'
  keys = sorted(probs)
  assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-4)
  return chi_square_pvalue(np.array([counts.get(k, 0) for k in keys]),
                           np.array([probs[k] for k in keys]))


SAMPLING_CASES = [
    (SamplingConfig(1.0), 3),
    (SamplingConfig(0.7, top_k=3), 2),
    (SamplingConfig(1.0, top_p=0.8), 4),
]


@functools.lru_cache(maxsize=None)
def _correct_samples(case, verification):
  """Counts, alpha and per-row tokens per target call of one exact run
  (shared by tests)."""
  sampling, gamma = SAMPLING_CASES[case]
  target, draft = _tiny_pair()
  counts, result = _sample_counts(target, draft, np.array([[3, 4, 2]],
                                                          np.int32),
                                  sampling, gamma, seed=0,
                                  verification=verification)
  per_call = (np.asarray(result.lengths)
              / np.maximum(np.asarray(result.target_calls), 1))
  return counts, float(np.mean(np.asarray(result.acceptance_rate))), per_call


@pytest.mark.slow
@pytest.mark.parametrize('verification', ['token', 'block'])
@pytest.mark.parametrize('case', range(len(SAMPLING_CASES)))
def test_samples_follow_the_target_distribution(case, verification):
  sampling, _ = SAMPLING_CASES[case]
  target, _ = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  probs = _exact_distribution(target, enc, sampling, eos_id=1)
  counts, acceptance, _ = _correct_samples(case, verification)
  # The pair must disagree enough for the test to mean something.
  assert 0.2 < acceptance < 0.95
  assert _pvalue(counts, probs) > FALSE_ALARM_RATE


@pytest.mark.slow
@pytest.mark.parametrize('rule, threshold, verification', [
    # Near the tiny draft's median confidence / entropy: mixed stops.
    ('confidence', 0.45, 'token'),
    ('entropy', 1.32, 'block'),
])
def test_samples_with_draft_stop_follow_the_target_distribution(
    rule, threshold, verification):
  sampling, gamma = SAMPLING_CASES[0]
  target, draft = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  probs = _exact_distribution(target, enc, sampling, eos_id=1)
  result = sd.generate(target, np.tile(enc, (SAMPLES, 1)),
                       max_decode_len=E2E_LEN, draft=draft, gamma=gamma,
                       temperature=sampling.temperature,
                       rng=jax.random.PRNGKey(0), verification=verification,
                       draft_stop=rule, draft_threshold=threshold)
  calls = np.asarray(result.target_calls)
  proposed = np.asarray(result.draft_tokens_proposed)
  # The rule must bite often, and not always, for the test to mean much.
  assert 0.2 < np.mean(proposed < gamma * calls) < 0.95
  outputs, counts = np.unique(np.asarray(result.tokens), axis=0,
                              return_counts=True)
  counts = {tuple(o): int(c) for o, c in zip(outputs, counts)}
  assert _pvalue(counts, probs) > FALSE_ALARM_RATE


@pytest.mark.slow
@pytest.mark.parametrize('case', range(len(SAMPLING_CASES)))
def test_block_verification_emits_no_fewer_tokens_per_call(case):
  # Same rows, same draft and target: block verification's expected tokens
  # per target call is never lower than token verification's (Sun et al.;
  # checked exactly by enumeration in test_block_verification.py). Here, on
  # 30000 sampled rows each, it may not fall short by more than sampling
  # noise (3 standard errors of the difference: a false alarm in ~1 of 700
  # runs), and where the gap is large (case 0) it must show.
  _, _, token = _correct_samples(case, 'token')
  _, _, block = _correct_samples(case, 'block')
  noise = np.sqrt(np.var(token) / token.size + np.var(block) / block.size)
  assert np.mean(block) > np.mean(token) - 3 * noise
  if case == 0:
    assert np.mean(block) > np.mean(token) + 3 * noise


def _block_correction_from_p(draft_probs, target_probs, weights,
                             num_accepted):
  """Mistake: the correction drawn from p_{tau+1} instead of the residual."""
  del draft_probs, weights
  return jnp.take_along_axis(target_probs, num_accepted[:, None, None],
                             axis=1)[:, 0]


def _block_stops_at_first_failure(draft_tokens, draft_probs, target_probs,
                                  uniforms):
  """Mistake: block keep probabilities used token-style (first failure)."""
  weights, h = block_verification.keep_probabilities(
      draft_tokens, draft_probs, target_probs)
  num_accepted = jnp.sum(jnp.cumprod((uniforms < h).astype(jnp.int32),
                                     axis=1), axis=1).astype(jnp.int32)
  return num_accepted, block_verification.block_residual(
      draft_probs, target_probs, weights, num_accepted)


@pytest.mark.slow
@pytest.mark.parametrize('name, mistake', [
    ('block_residual', _block_correction_from_p),
    ('verify_block', _block_stops_at_first_failure),
])
def test_negative_control_biased_block_verification_is_detected(
    monkeypatch, name, mistake):
  # Plausible mistakes in block verification are biases the statistical
  # test must catch with the same samples. (Subtler ones, e.g. a residual
  # without the weight w_tau, are caught by the exact enumeration in
  # test_block_verification.py.)
  target, draft = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  sampling = SamplingConfig(1.0)
  probs = _exact_distribution(target, enc, sampling, eos_id=1)
  jax.clear_caches()
  monkeypatch.setattr(block_verification, name, mistake)
  try:
    counts, _ = _sample_counts(target, draft, enc, sampling, gamma=3, seed=0,
                               verification='block')
  finally:
    jax.clear_caches()
  assert _pvalue(counts, probs) < FALSE_ALARM_RATE


@pytest.mark.slow
def test_negative_control_biased_correction_is_detected(monkeypatch):
  # Drawing the correction from p instead of norm(max(0, p - q)) is a small
  # bias that the statistical test above must catch.
  target, draft = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  sampling = SamplingConfig(1.0)
  probs = _exact_distribution(target, enc, sampling, eos_id=1)
  jax.clear_caches()
  monkeypatch.setattr(verification, 'residual_distribution',
                      lambda p, q, lenience=1.0: p)
  try:
    counts, _ = _sample_counts(target, draft, enc, sampling, gamma=3, seed=0)
  finally:
    jax.clear_caches()
  assert _pvalue(counts, probs) < FALSE_ALARM_RATE


@pytest.mark.slow
def test_negative_control_lenience_is_lossy():
  target, draft = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  sampling = SamplingConfig(1.0)
  probs = _exact_distribution(target, enc, sampling, eos_id=1)
  result = sd.generate(target, np.tile(enc, (SAMPLES, 1)),
                       max_decode_len=E2E_LEN, draft=draft, gamma=3,
                       temperature=1.0, lenience=0.3,
                       rng=jax.random.PRNGKey(0))
  outputs, counts = np.unique(np.asarray(result.tokens), axis=0,
                              return_counts=True)
  counts = {tuple(o): int(c) for o, c in zip(outputs, counts)}
  assert _pvalue(counts, probs) < FALSE_ALARM_RATE


@pytest.mark.slow
@pytest.mark.parametrize('gamma', [1, 2, 3, 5, 8])
@pytest.mark.parametrize('batch', [1, 4, 7])
def test_greedy_equals_baseline_full_grid(gamma, batch):
  enc = random_inputs(batch, 9, 512, seed=10 + batch)
  for eos_id in (_eos_inside_horizon(_target(), enc), 1):
    _assert_greedy_equal(_target(), _draft(), enc, gamma, eos_id)


@pytest.mark.slow
@pytest.mark.parametrize('gamma', [1, 3, 5, 8])
@pytest.mark.parametrize('batch', [1, 4, 7])
def test_greedy_block_verification_equals_baseline_full_grid(gamma, batch):
  enc = random_inputs(batch, 9, 512, seed=10 + batch)
  for eos_id in (_eos_inside_horizon(_target(), enc), 1):
    _assert_greedy_equal(_target(), _draft(), enc, gamma, eos_id,
                         verification='block')


@pytest.mark.slow
@pytest.mark.parametrize('gamma', [1, 3, 5, 8])
@pytest.mark.parametrize('batch', [1, 4, 7])
def test_greedy_with_draft_stop_equals_baseline_full_grid(gamma, batch):
  """Both stop rules over the grid, as a checkerboard: each rule meets every
  gamma and every batch size, under both verification rules (all four
  pairings at one point: test_greedy_with_draft_stop_equals_baseline)."""
  enc = random_inputs(batch, 9, 512, seed=10 + batch)
  cell = [1, 3, 5, 8].index(gamma) + [1, 4, 7].index(batch)
  rule, threshold = STOP_RULES[cell % 2]
  verification = ('token', 'block')[[1, 3, 5, 8].index(gamma) % 2]
  _assert_greedy_equal(_target(), _draft(), enc, gamma,
                       _eos_inside_horizon(_target(), enc),
                       verification=verification, draft_stop=rule,
                       draft_threshold=threshold)


@requires_fixtures
@pytest.mark.slow
@pytest.mark.parametrize('gamma', [1, 2, 3, 5, 8])
def test_greedy_equals_t5x_full_grid(gamma):
  for name, eos in [('t5x_tiny', 'alt_eos_id'),
                    ('t5x_tiny_perturbed', 'eos_id')]:
    g = golden(name)
    target = t5x_model(name)
    draft = perturbed(target, 0.3, seed=gamma)
    for batch in (1, 3):
      spec = sd.generate(target, g['encoder_input_tokens'][:batch],
                         max_decode_len=16, eos_id=int(g[eos]), draft=draft,
                         gamma=gamma)
      prefix = 'alt_eos_' if eos == 'alt_eos_id' else ''
      np.testing.assert_array_equal(np.asarray(spec.tokens),
                                    g[prefix + 'greedy_tokens'][:batch])
