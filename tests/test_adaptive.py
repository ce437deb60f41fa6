"""gamma='auto' inside the compiled loop: the rule, exactness, one program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import acceptance
from spec_decode import adaptive
from spec_decode import auto_generation
from spec_decode import cost_cache
from spec_decode import costs
from spec_decode import verification
from spec_decode.sampling import SamplingConfig

from conftest import cost_profile_from_curve
from conftest import decoder_compiles
from conftest import FALSE_ALARM_RATE
from conftest import perturbed
from conftest import random_inputs
from conftest import random_model
from test_speculative import _eos_inside_horizon
from test_speculative import _exact_distribution
from test_speculative import _pvalue
from test_speculative import _tiny_pair
from test_speculative import E2E_LEN
from test_speculative import MAX_LEN
from test_speculative import SAMPLES


# The K-curves below were drawn for this margin over baseline decoding (the
# default is set from measured CPUs; these tests are about the rule's
# machinery).
TEST_MIN_GAIN = 1.15


def _costs(verify, c=0.05, prior=0.6, gain=TEST_MIN_GAIN):
  """ProposalCosts from a K-curve and c, as `generate` builds them."""
  profile = cost_profile_from_curve(verify, c)
  return adaptive.ProposalCosts.create(
      [profile.iteration_cost(g) for g in range(len(verify))], prior, gain)


def test_chunk_widths_cover_every_count():
  assert adaptive.chunk_widths(7) == (1, 2, 4, 8)
  assert adaptive.chunk_widths(3) == (1, 2, 4)
  assert adaptive.chunk_widths(5) == (1, 2, 4, 6)
  assert adaptive.chunk_widths(1) == (1, 2)
  widths = (1, 2, 4, 8)
  np.testing.assert_array_equal(
      adaptive.width_index(jnp.arange(1, 9), widths),
      [0, 1, 2, 2, 3, 3, 3, 3])


def test_counts_maximise_tokens_per_step():
  costs_ = _costs([1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6], c=0.05)
  alpha = jnp.asarray([0.9, 0.6, 0.05, 0.9, 0.9])
  remaining = jnp.asarray([40, 40, 40, 3, 40])
  active = jnp.asarray([True, True, True, True, False])
  counts, expected, cost = adaptive.choose_counts(alpha, remaining, active,
                                                  costs_)
  counts = np.asarray(counts)
  table = np.asarray(costs_.iteration_cost)
  for row in range(3):
    rates = [(1 - alpha[row] ** (g + 1)) / (1 - alpha[row]) / table[g]
             for g in range(8)]
    # Inside a call, no margin: a row that proposes nothing still pays a
    # plain step of the speculative loop.
    assert counts[row] == int(np.argmax(rates))
  assert counts[0] == 7 and counts[2] == 0   # Sure draft; hopeless draft.
  assert counts[3] <= 2                      # 3 tokens left to emit.
  assert counts[4] == 0                      # Finished rows propose nothing.
  # A count of 2 runs at width 4: never better than 3 at the same price.
  assert 2 not in counts[:3]
  np.testing.assert_allclose(np.asarray(cost)[0], table[7])
  np.testing.assert_allclose(np.asarray(expected)[2], 1.0)


def test_dear_verification_means_plain_steps():
  costs_ = _costs([1.0, 2.0, 3.0, 4.0], c=0.3)
  counts, _, _ = adaptive.choose_counts(
      jnp.asarray([0.95, 0.5]), jnp.asarray([40, 40]),
      jnp.asarray([True, True]), costs_)
  np.testing.assert_array_equal(counts, [0, 0])


@pytest.mark.parametrize('count', [0, 1, 3, 7])
def test_forced_costs_make_every_row_propose_the_count(count):
  # What the cost profile times gamma='auto''s iterations at.
  forced = adaptive.forced_costs(count, 7)
  alpha = jnp.asarray([0.0, 0.3, 0.9, 1.0])
  for remaining, want in ((48, count), (count + 1, count), (count, 0)):
    counts, _, _ = adaptive.choose_counts(
        alpha, jnp.full((4,), remaining, jnp.int32), jnp.ones((4,), bool),
        forced)
    np.testing.assert_array_equal(counts, want)
  with pytest.raises(ValueError, match='count'):
    adaptive.forced_costs(8, 7)


def test_alpha_follows_betas_and_drifts_back_to_the_prior():
  alpha = jnp.asarray([0.5, 0.5, 0.9])
  updated = adaptive.update_alpha(alpha, jnp.asarray([3.0, 0.0, 0.0]),
                                  jnp.asarray([3, 0, 0]), jnp.asarray(0.6))
  keep = (1 - adaptive.ALPHA_RATE) ** 3
  np.testing.assert_allclose(updated[0], keep * 0.5 + (1 - keep) * 1.0,
                             rtol=1e-6)
  np.testing.assert_allclose(updated[1], 0.5 + adaptive.PRIOR_PULL * 0.1,
                             rtol=1e-6)
  np.testing.assert_allclose(updated[2], 0.9 - adaptive.PRIOR_PULL * 0.3,
                             rtol=1e-6)


def test_asking_whether_a_call_proposes_compiles_once():
  # `generate` asks before every gamma='auto' call, with a prior that moves
  # after each call that proposed: one compiled program, not a dozen eager
  # ops waited for one by one (~3 ms a call).
  adaptive.ever_proposes(_costs([1.0, 1.05], c=0.05, prior=0.3), 20)
  before = adaptive.ever_proposes._cache_size()
  for prior, max_len in ((0.4, 20), (0.9, 48), (0.1, 7)):
    adaptive.ever_proposes(_costs([1.0, 1.05], c=0.05, prior=prior), max_len)
  assert adaptive.ever_proposes._cache_size() == before


def test_a_call_speculates_when_its_predicted_speedup_clears_the_margin():
  # MIXED-like curve at alpha 0.7: one proposal, 1.7 tokens for 1.35
  # baseline steps. A baseline call of n tokens spends 4 steps once, a
  # speculating one a step more.
  costs_ = adaptive.ProposalCosts.create([1.05, 1.35, 2.6, 2.6], 0.7,
                                         min_gain=1.1, call_cost=4.0,
                                         call_extra_cost=1.0)
  for length in (4.0, 20.0, 200.0):
    want = (4.0 + length) / (5.0 + length * 1.35 / 1.7)
    assert float(adaptive.call_speedup(costs_, length)) == pytest.approx(
        want, rel=1e-5)
  # What a call spends once weighs on short outputs: at 4 tokens the call
  # is predicted 0.91x, at 200 1.24x.
  assert not bool(adaptive.ever_proposes(costs_, 4.0))
  assert bool(adaptive.ever_proposes(costs_, 200.0))
  # At a prior where a row's first choice is a plain step, nothing to gain.
  hopeless = costs_.replace(alpha_prior=np.float32(0.1))
  assert float(adaptive.call_speedup(hopeless, 200.0)) == 1.0
  assert not bool(adaptive.ever_proposes(
      hopeless.replace(min_gain=np.float32(1.0)), 200.0))


@pytest.mark.parametrize('verify, c, prior', [
    ([1.0, 1.05, 1.1, 1.2], 0.05, 0.1), ([1.0, 2.0, 3.0, 4.0], 0.3, 0.95),
    ([1.0, 1.3, 2.5, 2.5], 0.05, 0.2)])
def test_a_row_that_does_not_propose_at_first_never_does(verify, c, prior):
  costs_ = _costs(verify, c=c, prior=prior)
  max_len = 20
  # Nothing proposed, nothing observed: the estimate stays the prior while
  # fewer tokens remain, and the rule keeps choosing 0 (so such a call is
  # predicted no faster than baseline decoding, and runs as one).
  alpha = jnp.asarray([prior], jnp.float32)
  for remaining in range(max_len, 0, -1):
    counts, _, _ = adaptive.choose_counts(
        alpha, jnp.asarray([remaining]), jnp.asarray([True]), costs_)
    assert int(counts[0]) == 0
    alpha = adaptive.update_alpha(alpha, jnp.zeros(1), jnp.zeros(1, int),
                                  costs_.alpha_prior)
    assert float(alpha[0]) == float(costs_.alpha_prior)
  assert float(adaptive.call_speedup(costs_, float(max_len))) == 1.0


@pytest.fixture
def auto_costs(monkeypatch, tmp_path):
  """Measured costs replaced by given ones (no timing in tests); the kept
  acceptance goes to a fresh folder."""
  monkeypatch.setenv(cost_cache.CACHE_DIR_ENV, str(tmp_path))
  monkeypatch.setattr(adaptive, 'MIN_GAIN', TEST_MIN_GAIN)
  cost_cache.forget_acceptance()
  state = {}
  output_length = acceptance.output_length

  def use(verify, c=0.05, prior=None):
    state['profile'] = cost_profile_from_curve(verify, c)
    if prior is not None:
      monkeypatch.setattr(acceptance, 'acceptance_prior',
                          lambda *args, **kwargs: prior)
      monkeypatch.setattr(acceptance, 'kept_figures', lambda *args: (
          prior, output_length(*args)))
  monkeypatch.setattr(costs, 'cost_profile',
                      lambda *args, **kwargs: state['profile'])
  yield use
  cost_cache.forget_acceptance()


# K-curves that make the rule choose differently: speculation always pays,
# never pays, or pays at one token but not more (so rows mix 0 and 1 as
# their estimates move).
CHEAP = [1.0, 1.0, 1.02, 1.02, 1.05, 1.05, 1.05, 1.05]
DEAR = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
MIXED = [1.0, 1.3, 2.5, 2.5, 4.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize('verify, batch', [(CHEAP, 1), (MIXED, 4),
                                           (DEAR, 7), (MIXED, 7)])
def test_greedy_auto_equals_baseline(auto_costs, verify, batch):
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(batch, 7, 512, seed=batch)
  eos = _eos_inside_horizon(target, enc)
  auto_costs(verify, prior=0.6)
  baseline = sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos)
  result = sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos,
                       draft=draft, gamma='auto')
  np.testing.assert_array_equal(result.tokens, baseline.tokens)
  np.testing.assert_array_equal(result.lengths, baseline.lengths)
  np.testing.assert_allclose(result.token_logprobs, baseline.token_logprobs,
                             atol=1e-5)
  counts = np.asarray(result.proposal_counts)
  # By default the program is sized to the most its costs ever favour.
  assert result.gamma == auto_generation.default_max_gamma(
      costs.cost_profile(target, draft, batch), True)
  assert counts.shape == (batch, result.gamma + 1)
  np.testing.assert_array_equal(counts.sum(axis=1), result.target_calls)
  if verify is DEAR:  # The baseline's own loop ran: the same bits.
    assert counts[:, 1:].sum() == 0
    np.testing.assert_array_equal(result.target_calls, result.lengths)
    np.testing.assert_array_equal(result.token_logprobs,
                                  baseline.token_logprobs)
  else:
    assert counts[:, 1:].sum() > 0
  assert np.all(np.isfinite(result.predicted_speedup))
  np.testing.assert_allclose(
      result.mean_proposals,
      (counts * np.arange(counts.shape[1])).sum(1) / counts.sum(1),
      rtol=1e-6)


@pytest.mark.parametrize('verify, batch', [(MIXED, 4), (CHEAP, 3)])
def test_each_row_makes_the_choices_its_agreement_says(auto_costs, verify,
                                                       batch):
  """The loop's proposals per row are what the rule chooses from that
  row's own betas: replayed from where the draft's argmax agrees with the
  output, for every row of a batch whose rows go different ways."""
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(batch, 7, 512, seed=batch + 10)
  eos = _eos_inside_horizon(target, enc)
  auto_costs(verify, prior=0.6)
  result = sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos,
                       draft=draft, gamma='auto')
  rule_costs = auto_generation.proposal_costs(
      costs.cost_profile(target, draft, batch, costs.DEFAULT_MAX_GAMMA),
      True, auto_generation.auto_prior(target, draft))
  counts = np.asarray(result.proposal_counts)
  rows = adaptive.greedy_agreement(draft, enc, result)
  assert len(rows) == batch
  for row, agrees in enumerate(rows):
    assert len(agrees) == int(result.lengths[row])
    np.testing.assert_array_equal(
        adaptive.replay_greedy(agrees, rule_costs, MAX_LEN), counts[row])
  # The rule moved: some row used more than one count.
  assert any(np.count_nonzero(row) > 1 for row in counts)


def test_replayed_fixed_counts_are_what_forced_costs_make_the_loop_do():
  costs_ = adaptive.forced_costs(3, 7)
  agrees = np.asarray([True, True, True, False, True, False, True, True])
  # 3 proposals (3 accepted: 4 tokens), 3 (1 accepted: 2 tokens), then
  # plain steps: no more than 3 of the limit of 9 remain.
  for count in (None, 3):
    np.testing.assert_array_equal(
        adaptive.replay_greedy(agrees, costs_, 9, count),
        [2, 0, 0, 2, 0, 0, 0, 0])


@pytest.mark.parametrize('route', [
    'first_call', pytest.param('after_a_proposing_call',
                               marks=pytest.mark.slow)])
def test_auto_that_never_proposes_is_the_baseline(auto_costs, route):
  # The rule's first choice is 0 for every row: the call is a baseline
  # decode, and `generate` runs the baseline's own program: its bits for the
  # same rng, sampled too (greedy: `test_greedy_auto_equals_baseline` with
  # DEAR). After a call that proposed, that program is already compiled.
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(4, 7, 512, seed=4)
  eos = _eos_inside_horizon(target, enc)
  rng = jax.random.PRNGKey(7)
  auto = lambda: sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos,
                             rng=rng, temperature=1.0, draft=draft,
                             gamma='auto')
  if route == 'after_a_proposing_call':
    # Nothing this process compiled before may stand in for what the
    # proposing call compiles.
    jax.clear_caches()
    auto_generation._BASELINE_READY.clear()  # pylint: disable=protected-access
    auto_costs(MIXED, prior=0.9)
    assert np.asarray(auto().draft_tokens_proposed).sum() > 0
  # The same costs (a process measures them once), a prior at which no
  # row's first choice is a proposal.
  auto_costs(MIXED, prior=0.05)
  with decoder_compiles() as compiled:
    result = auto()
  if route == 'after_a_proposing_call':
    assert not compiled
  else:  # No speculative program is needed.
    assert 'jit(_speculative_generate)' not in compiled
  baseline = sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos,
                         rng=rng, temperature=1.0)
  for field in ('tokens', 'lengths', 'token_logprobs', 'target_calls'):
    np.testing.assert_array_equal(getattr(result, field),
                                  getattr(baseline, field), err_msg=field)
  counts = np.asarray(result.proposal_counts)
  np.testing.assert_array_equal(counts[:, 0], result.lengths)
  assert counts[:, 1:].sum() == 0
  np.testing.assert_array_equal(result.draft_tokens_proposed, 0)
  np.testing.assert_allclose(result.predicted_speedup, 1.0)
  assert result.gamma == auto_generation.default_max_gamma(
      costs.cost_profile(target, draft, 4), False)
  assert counts.shape == (4, result.gamma + 1)


def test_one_program_serves_every_choice(auto_costs):
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(2, 7, 512, seed=3)
  # A process's costs are measured once; its prior moves between calls.
  auto_costs(MIXED, prior=0.7)
  first = sd.generate(target, enc, max_decode_len=12, draft=draft,
                      gamma='auto')
  histograms = [np.asarray(first.proposal_counts)]
  # Neither program compiles again, whatever the rows choose (under MIXED
  # 1 proposal below 0.95, 7 above); at prior 0.05 no row would propose
  # (the baseline's program, compiled by the first call).
  with decoder_compiles() as compiled:
    for prior in (0.98, 0.9, 0.05):
      auto_costs(MIXED, prior=prior)
      result = sd.generate(target, enc, max_decode_len=12, draft=draft,
                           gamma='auto')
      histograms.append(np.asarray(result.proposal_counts))
  assert not compiled
  # The choices did differ between the calls, and the last proposed nothing.
  assert len({h.tobytes() for h in histograms}) > 2
  assert histograms[-1][:, 1:].sum() == 0


def test_a_prior_moved_within_its_grid_reuses_the_rule_inputs(auto_costs):
  # The kept acceptance moves after every call that proposed; the rule's
  # inputs (their device copies, whether rows would propose) are made again
  # only when it moves to another point of the prior's grid.
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(1, 7, 512, seed=3)
  cached = (auto_generation._would_propose, auto_generation._proposal_costs)
  misses = lambda: [fn.cache_info().misses for fn in cached]
  step = 1.0 / auto_generation.PRIOR_GRID
  auto_costs(CHEAP, prior=0.7001)
  sd.generate(target, enc, max_decode_len=6, draft=draft, gamma='auto')
  before = misses()
  auto_costs(CHEAP, prior=0.7001 + 0.2 * step)
  sd.generate(target, enc, max_decode_len=6, draft=draft, gamma='auto')
  assert misses() == before
  assert (auto_generation.auto_prior(target, draft)
          == round(0.7001 / step) * step)
  auto_costs(CHEAP, prior=0.7001 + step)
  sd.generate(target, enc, max_decode_len=6, draft=draft, gamma='auto')
  assert misses() == [m + 1 for m in before]


def test_the_pair_acceptance_is_kept_for_the_next_process(auto_costs,
                                                         tmp_path):
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  auto_costs(CHEAP)
  sampling = SamplingConfig(0.0)
  assert acceptance.acceptance_prior(target, draft, sampling) is None
  result = sd.generate(target, random_inputs(2, 7, 512, seed=4),
                       max_decode_len=12, draft=draft, gamma='auto')
  verified = np.asarray(result.verified_positions)
  want = float(np.sum(np.nan_to_num(np.asarray(result.mean_beta)) * verified)
               / np.sum(verified))
  assert acceptance.acceptance_prior(target, draft, sampling) == pytest.approx(
      want, rel=1e-5)
  # A fresh process reads it back from the file; other samplings do not.
  cost_cache.forget_acceptance()
  assert acceptance.acceptance_prior(target, draft, sampling) == pytest.approx(
      want, rel=1e-5)
  assert acceptance.acceptance_prior(target, draft, SamplingConfig(1.0)) is None
  assert cost_cache.read_cache(cost_cache.cache_path()) == {}  # Costs untouched.
  # Beside it, the rows' mean output length: what the next call's decision
  # to speculate weighs the call's one-off costs against.
  assert acceptance.output_length(target, draft, sampling) == pytest.approx(
      float(np.mean(result.lengths)))


def test_calls_add_their_figures_later_and_all_of_them(auto_costs,
                                                        monkeypatch):
  # A call does not wait for its own figures: they are read every
  # PENDING_CALLS calls, or when asked for, and none is lost.
  monkeypatch.setattr(acceptance, 'PENDING_CALLS', 2)
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  auto_costs(CHEAP)
  sampling = SamplingConfig(0.0)
  results = []
  for seed in range(3):
    results.append(sd.generate(target, random_inputs(2, 7, 512, seed=seed),
                               max_decode_len=12, draft=draft, gamma='auto'))
    kept, _ = acceptance.kept_figures(target, draft, sampling)
    # One call waiting is left waiting; two are added.
    assert (kept is None) == (seed == 0)
  verified = np.concatenate([np.asarray(r.verified_positions)
                             for r in results])
  betas = np.concatenate([np.nan_to_num(np.asarray(r.mean_beta))
                          for r in results])
  assert acceptance.acceptance_prior(target, draft, sampling) == pytest.approx(
      float(np.dot(betas, verified) / verified.sum()), rel=1e-5)
  assert acceptance.output_length(target, draft, sampling) == pytest.approx(
      float(np.mean([np.asarray(r.lengths) for r in results])))


@pytest.mark.parametrize('kwargs, message', [
    (dict(gamma='auto', max_gamma=0), 'max_gamma must be'),
    (dict(gamma='auto', max_gamma=2.5), 'max_gamma must be'),
    (dict(gamma='auto', max_gamma='3'), 'max_gamma must be'),
    (dict(gamma=3, max_gamma=3), "max_gamma is only for gamma='auto'"),
    (dict(gamma='auto', min_gain=0.9), 'min_gain must be >= 1'),
    (dict(gamma='auto', min_gain='high'), 'min_gain must be a number'),
    (dict(gamma='auto', min_gain=float('nan')), 'min_gain must be finite'),
    (dict(gamma=3, min_gain=1.2), "min_gain is only for gamma='auto'"),
])
def test_bad_auto_arguments_name_themselves(kwargs, message):
  target = random_model(0)
  with pytest.raises((TypeError, ValueError), match=message):
    sd.generate(target, random_inputs(1, 4, 512, seed=0), max_decode_len=4,
                draft=perturbed(target, 0.3, seed=1), **kwargs)


def test_min_gain_sets_the_margin_over_baseline_decoding(auto_costs):
  # At this curve and prior a call of 12 tokens is predicted ~1.17x
  # baseline decoding: rows propose under a margin of 1 and never under one
  # of 2, and either way greedy outputs are the baseline's.
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(2, 7, 512, seed=5)
  auto_costs(MIXED, prior=0.6)
  baseline = sd.generate(target, enc, max_decode_len=12)
  proposals = {}
  for min_gain in (1.0, 2.0):
    result = sd.generate(target, enc, max_decode_len=12, draft=draft,
                         gamma='auto', min_gain=min_gain)
    np.testing.assert_array_equal(result.tokens, baseline.tokens)
    proposals[min_gain] = int(np.asarray(result.proposal_counts)[:, 1:].sum())
  assert proposals[1.0] > 0
  assert proposals[2.0] == 0


# A 2-core CPU's curve (the shipped pair, 2026-12-07): scoring 8 tokens
# costs twice scoring 4, so 4 .. 7 proposals never pay below ALPHA_CEILING.
CPU = [1.0, 1.16, 1.5, 1.5, 3.0, 3.0, 3.0, 3.0]


@pytest.mark.parametrize('verify, want', [(CHEAP, 7), (DEAR, 1), (MIXED, 7),
                                          (CPU, 3)])
def test_the_default_max_gamma_is_the_most_the_rule_chooses(verify, want):
  profile = cost_profile_from_curve(verify)
  greedy = True
  assert auto_generation.default_max_gamma(profile, greedy) == want
  full = auto_generation.proposal_costs(profile, greedy, 0.5,
                                        max_gamma=len(verify) - 1)
  alphas = np.linspace(0.0, auto_generation.ALPHA_CEILING, 50,
                       dtype=np.float32)
  counts, _, _ = adaptive.choose_counts(
      alphas, np.full(alphas.shape, 40), np.ones(alphas.shape, bool), full)
  assert max(1, int(np.max(counts))) == want
  # What `generate` passes the loop by default: costs of 0 .. want.
  assert auto_generation.proposal_costs(
      profile, greedy, 0.5).iteration_cost.shape == (want + 1,)


def test_the_default_max_gamma_sizes_the_program(auto_costs):
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(2, 7, 512, seed=5)
  auto_costs(CPU, prior=0.99)
  result = sd.generate(target, enc, max_decode_len=12, draft=draft,
                       gamma='auto')
  # Rows at an estimate above ALPHA_CEILING would choose 7 with every count
  # compiled; the default program stops at 3.
  assert result.gamma == 3
  assert np.asarray(result.proposal_counts).shape == (2, 4)
  assert np.asarray(result.proposal_counts)[:, 3].sum() > 0
  wide = sd.generate(target, enc, max_decode_len=12, draft=draft,
                     gamma='auto', max_gamma=7)
  assert wide.gamma == 7
  np.testing.assert_array_equal(wide.tokens, result.tokens)


def test_max_gamma_bounds_the_proposals(auto_costs):
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  auto_costs(CHEAP, prior=0.95)
  result = sd.generate(target, random_inputs(2, 7, 512, seed=5),
                       max_decode_len=12, draft=draft, gamma='auto',
                       max_gamma=2)
  assert result.gamma == 2
  assert np.asarray(result.proposal_counts).shape == (2, 3)
  assert np.asarray(result.proposal_counts)[:, 1:].sum() > 0


# Exactness at temperature: every count the rule may choose is a valid
# speculative step, so the samples follow the target's distribution.

def _auto_samples(sampling, seed=0, max_gamma=3):
  target, draft = _tiny_pair()
  enc = np.array([[3, 4, 2]], np.int32)
  result = sd.generate(target, np.tile(enc, (SAMPLES, 1)),
                       max_decode_len=E2E_LEN, draft=draft, gamma='auto',
                       max_gamma=max_gamma,
                       temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p, rng=jax.random.PRNGKey(seed))
  outputs, counts = np.unique(np.asarray(result.tokens), axis=0,
                              return_counts=True)
  return {tuple(o): int(c) for o, c in zip(outputs, counts)}, result


@pytest.mark.slow
@pytest.mark.parametrize('sampling', [SamplingConfig(1.0),
                                      SamplingConfig(0.7, top_k=3)])
def test_auto_samples_follow_the_target_distribution(auto_costs, sampling):
  target, _ = _tiny_pair()
  probs = _exact_distribution(target, np.array([[3, 4, 2]], np.int32),
                              sampling, eos_id=1)
  # Near the pair's acceptance, one proposal pays and more do not: rows
  # switch between plain steps and speculation as their estimates move.
  auto_costs([1.0, 1.1, 2.2, 2.2], c=0.05, prior=0.5)
  counts, result = _auto_samples(sampling)
  histogram = np.asarray(result.proposal_counts).sum(axis=0)
  # The rule must mix its choices for the test to mean much.
  assert histogram[0] > 0.1 * histogram.sum()
  assert histogram[1:].sum() > 0.1 * histogram.sum()
  assert _pvalue(counts, probs) > FALSE_ALARM_RATE


@pytest.mark.slow
def test_negative_control_biased_correction_is_detected_with_auto(
    auto_costs, monkeypatch):
  target, _ = _tiny_pair()
  sampling = SamplingConfig(1.0)
  probs = _exact_distribution(target, np.array([[3, 4, 2]], np.int32),
                              sampling, eos_id=1)
  auto_costs([1.0, 1.1, 2.2, 2.2], c=0.05, prior=0.5)
  jax.clear_caches()
  monkeypatch.setattr(verification, 'residual_distribution',
                      lambda p, q, lenience=1.0: p)
  try:
    counts, _ = _auto_samples(sampling)
  finally:
    jax.clear_caches()
  assert _pvalue(counts, probs) < FALSE_ALARM_RATE


@pytest.mark.slow
@pytest.mark.parametrize('verify', [CHEAP, MIXED])
@pytest.mark.parametrize('batch', [1, 4, 7])
@pytest.mark.parametrize('verification_rule', ['token', 'block'])
def test_greedy_auto_equals_baseline_full_grid(auto_costs, verify, batch,
                                               verification_rule):
  target = random_model(0)
  draft = perturbed(target, 0.3, seed=1)
  enc = random_inputs(batch, 7, 512, seed=10 + batch)
  eos = _eos_inside_horizon(target, enc)
  for prior in (0.2, 0.9):
    auto_costs(verify, prior=prior)
    baseline = sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos)
    result = sd.generate(target, enc, max_decode_len=MAX_LEN, eos_id=eos,
                         draft=draft, gamma='auto',
                         verification=verification_rule)
    np.testing.assert_array_equal(result.tokens, baseline.tokens)
    np.testing.assert_array_equal(result.lengths, baseline.lengths)
