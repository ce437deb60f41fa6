"""generate(..., num_candidates=k): k candidates per row in one target call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import candidate_verification
from spec_decode.model import init_cache
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding
from spec_decode.model.network import move_chunk
from spec_decode.sampling import SamplingConfig

from conftest import FALSE_ALARM_RATE
from conftest import random_inputs
from test_speculative import _assert_greedy_equal
from test_speculative import _draft
from test_speculative import _eos_inside_horizon
from test_speculative import _exact_distribution
from test_speculative import _pvalue
from test_speculative import _target
from test_speculative import _tiny_pair
from test_speculative import E2E_LEN
from test_speculative import MAX_LEN


# XLA's attention and dots in the slow suite (the fast suite keeps the
# kernels, the path decoding on one CPU device takes).
@pytest.mark.parametrize('use_kernel', [
    True, pytest.param(False, marks=pytest.mark.slow)])
def test_a_tree_call_scores_each_candidate_as_if_it_alone_followed(
    use_kernel):
  """Each candidate's logits in the tree call are those of a plain chunk of
  [last token, that candidate]; after `move_chunk` the kept candidate's
  keys/values serve the next call as if it had been decoded alone."""
  model = _target()
  k, gamma, n = 3, 4, 5
  enc = random_inputs(2, 7, 512, seed=3)
  prepared = model.decode_kernels if use_kernel else None
  if use_kernel and prepared is None:
    pytest.skip('the few-row CPU kernel is not built here')
  encoded = prepare_decoding(model.config, model.params, enc, prepared)
  rng = np.random.default_rng(0)
  prefix = jnp.asarray(rng.integers(2, 512, (2, n)), jnp.int32)
  cache = init_cache(model.config, 2, 32)
  _, cache = decode_chunk(model.config, model.params, prefix,
                          jnp.zeros((2,), jnp.int32), cache, encoded,
                          prepared)
  last = jnp.asarray(rng.integers(2, 512, (2, 1)), jnp.int32)
  candidates = jnp.asarray(rng.integers(2, 512, (2, k, gamma)), jnp.int32)
  start = jnp.full((2,), n, jnp.int32)
  tree_logits, tree_cache = decode_chunk(
      model.config, model.params,
      jnp.concatenate([last, candidates.reshape(2, -1)], axis=1), start,
      cache, encoded, prepared, tree=(k, gamma))
  for j in range(k):
    chunk = jnp.concatenate([last, candidates[:, j]], axis=1)
    alone, alone_cache = decode_chunk(model.config, model.params, chunk,
                                      start, cache, encoded, prepared)
    got = jnp.concatenate([tree_logits[:, :1],
                           tree_logits[:, 1 + j * gamma:1 + (j + 1) * gamma]],
                          axis=1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(alone),
                               atol=2e-5, rtol=1e-5)
    moved = move_chunk(tree_cache, start + 1 + j * gamma, start + 1, gamma)
    token = jnp.asarray([[7], [9]], jnp.int32)
    after_tree, _ = decode_chunk(model.config, model.params, token,
                                 start + 1 + gamma, moved, encoded, prepared)
    after_alone, _ = decode_chunk(model.config, model.params, token,
                                  start + 1 + gamma, alone_cache, encoded,
                                  prepared)
    np.testing.assert_allclose(np.asarray(after_tree),
                               np.asarray(after_alone), atol=2e-5, rtol=1e-5)


GREEDY_GRID = [(k, gamma, batch) for k in (2, 4) for gamma in (1, 3, 5)
               for batch in (1, 4, 7)]
FAST_GREEDY = [(2, 3, 7), (4, 1, 4), (4, 5, 1)]


@pytest.mark.parametrize('k, gamma, batch', [
    case if case in FAST_GREEDY else pytest.param(*case, marks=pytest.mark.slow)
    for case in GREEDY_GRID])
def test_greedy_equals_baseline(k, gamma, batch):
  enc = random_inputs(batch, 9, 512, seed=batch)
  eos_id = _eos_inside_horizon(_target(), random_inputs(7, 9, 512, seed=7))
  baseline, spec = _assert_greedy_equal(_target(), _draft(), enc, gamma,
                                        eos_id, num_candidates=k)
  assert spec.num_candidates == k
  lengths = np.asarray(baseline.lengths)
  assert (np.asarray(spec.target_calls) <= lengths).all()
  rate = np.asarray(spec.first_token_acceptance)
  assert np.all((rate >= 0) & (rate <= 1))


@pytest.mark.slow
def test_more_candidates_accept_more_first_tokens_greedy():
  """Greedy: a row accepts its first token whenever any of the draft's k
  most likely tokens is the target's, so tokens per call never drop."""
  enc = random_inputs(7, 9, 512, seed=11)
  per_call = []
  for k in (1, 2, 4):
    result = sd.generate(_target(), enc, max_decode_len=MAX_LEN,
                         draft=_draft(), gamma=2, num_candidates=k)
    per_call.append(float(np.mean(np.asarray(result.tokens_per_target_call))))
  assert per_call[0] <= per_call[1] <= per_call[2]
  assert per_call[2] > per_call[0]


SAMPLES = 30000
CANDIDATE_CASES = [(SamplingConfig(1.0), 2, 2), (SamplingConfig(1.0), 3, 3),
                   (SamplingConfig(0.7, top_k=3), 2, 4)]


def _samples(case, seed=0):
  sampling, gamma, k = CANDIDATE_CASES[case]
  target, draft = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  result = sd.generate(target, np.tile(enc, (SAMPLES, 1)),
                       max_decode_len=E2E_LEN, draft=draft, gamma=gamma,
                       temperature=sampling.temperature, top_k=sampling.top_k,
                       rng=jax.random.PRNGKey(seed), num_candidates=k)
  outputs, counts = np.unique(np.asarray(result.tokens), axis=0,
                              return_counts=True)
  return {tuple(o): int(c) for o, c in zip(outputs, counts)}, result


@pytest.mark.slow
@pytest.mark.parametrize('case', range(len(CANDIDATE_CASES)))
def test_samples_follow_the_target_distribution(case):
  """Chi-square against the exactly enumerated target distribution (T=1,
  and T=0.7 with top-k 3 where k=4 candidates exceed the tokens q keeps)."""
  sampling, _, _ = CANDIDATE_CASES[case]
  target, _ = _tiny_pair()
  probs = _exact_distribution(target, np.array([[3, 4, 2]], np.int32),
                              sampling, eos_id=1)
  counts, result = _samples(case)
  rate = float(np.mean(np.asarray(result.acceptance_rate)))
  assert 0.2 < rate < 0.95  # The pair disagrees enough to mean something.
  assert _pvalue(counts, probs) > FALSE_ALARM_RATE


@pytest.mark.slow
def test_negative_control_first_tokens_drawn_with_replacement(monkeypatch):
  """The same loop with first tokens drawn i.i.d. (the rule's q_j then
  wrong) is caught by the same test."""
  def with_replacement(key, logprobs, logits, num_candidates, greedy):
    del logits, greedy
    tokens = jax.vmap(lambda k: jax.random.categorical(
        k, logprobs[0], shape=(num_candidates,)))(key)
    return tokens.astype(jnp.int32), jnp.ones(tokens.shape, jnp.bool_)
  monkeypatch.setattr(candidate_verification, 'draw_first_tokens',
                      with_replacement)
  jax.clear_caches()
  sampling, _, _ = CANDIDATE_CASES[0]
  target, _ = _tiny_pair()
  probs = _exact_distribution(target, np.array([[3, 4, 2]], np.int32),
                              sampling, eos_id=1)
  counts, _ = _samples(0, seed=1)
  jax.clear_caches()
  assert _pvalue(counts, probs) < 1e-6


@pytest.mark.slow
def test_two_candidates_emit_more_tokens_per_call_at_temperature_1():
  _, k1 = _samples_tokens_per_call(1)
  _, k2 = _samples_tokens_per_call(2)
  assert k2 > k1 + 0.05


def _samples_tokens_per_call(k):
  target, draft = _tiny_pair()
  enc = np.tile(np.array([[3, 4, 2]], np.int32), (4000, 1))
  result = sd.generate(target, enc, max_decode_len=12, draft=draft, gamma=2,
                       temperature=1.0, num_candidates=k)
  return result, float(np.sum(np.asarray(result.lengths))
                       / np.sum(np.asarray(result.target_calls)))


@pytest.mark.parametrize('kwargs, error, message', [
    (dict(num_candidates=0), ValueError, 'num_candidates must be an integer'),
    (dict(num_candidates=2.0), TypeError, 'num_candidates must be an integer'),
    (dict(num_candidates=True), TypeError, 'num_candidates'),
    (dict(num_candidates=2, gamma='auto'), ValueError, 'fixed integer gamma'),
    (dict(num_candidates=2, verification='block'), ValueError,
     "verification='token'"),
    (dict(num_candidates=2, lenience=0.5), ValueError, 'lenience=1.0'),
    (dict(num_candidates=2, draft_stop='entropy', draft_threshold=1.0),
     ValueError, 'draft_stop=None'),
    (dict(num_candidates=513), ValueError, 'vocab_size=512'),
    (dict(num_candidates=2, draft=None), ValueError, 'a draft model'),
])
def test_bad_arguments(kwargs, error, message):
  arguments = dict(max_decode_len=4, draft=_draft(), gamma=2)
  arguments.update(kwargs)
  with pytest.raises(error, match=message):
    sd.generate(_target(), random_inputs(1, 5, 512, seed=0), **arguments)
