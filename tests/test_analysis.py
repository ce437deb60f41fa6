"""The paper's formulas reproduce its tables; measurements are sane."""

import numpy as np
import pytest

from spec_decode import analysis

# Leviathan et al. 2023, Table 1 (c = c_hat = 0): alpha, gamma, ops, speed.
PAPER_TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize('alpha, gamma, ops, speed', PAPER_TABLE_1)
def test_table_1(alpha, gamma, ops, speed):
  assert round(float(analysis.walltime_improvement(alpha, gamma, 0.0)),
               2) == speed
  assert round(float(analysis.ops_factor(alpha, gamma, 0.0)), 2) == ops


# Leviathan et al. 2023, Table 2 (alpha, gamma, draft) in its order: EnDe
# T=0, EnDe T=1, CNNDM T=0, CNNDM T=1, each small/base/large; c from the
# paper (small .02, base .04, large .11); Table 4's expected walltime
# improvement for the same rows.
PAPER_COST = {'small': 0.02, 'base': 0.04, 'large': 0.11}
PAPER_TABLE_4 = [
    (0.75, 7, 'small', 3.2), (0.80, 7, 'base', 3.3), (0.82, 7, 'large', 2.5),
    (0.62, 7, 'small', 2.3), (0.68, 5, 'base', 2.4), (0.71, 3, 'large', 2.0),
    (0.65, 5, 'small', 2.4), (0.73, 5, 'base', 2.6), (0.74, 3, 'large', 2.0),
    (0.53, 5, 'small', 1.9), (0.55, 3, 'base', 1.8), (0.56, 3, 'large', 1.6),
]


@pytest.mark.parametrize('alpha, gamma, draft, expected', PAPER_TABLE_4)
def test_table_4_expected_walltime_improvement(alpha, gamma, draft,
                                               expected):
  # The paper prints alpha and c rounded, so recomputing from the printed
  # values lands within ~0.07 of the printed expectation, not exactly.
  value = float(analysis.walltime_improvement(alpha, gamma,
                                              PAPER_COST[draft]))
  assert abs(value - expected) < 0.07


def test_expected_tokens():
  assert analysis.expected_tokens(0.0, 5) == 1.0
  assert analysis.expected_tokens(1.0, 5) == 6.0
  np.testing.assert_allclose(analysis.expected_tokens(0.5, 1), 1.5)
  np.testing.assert_allclose(
      analysis.expected_tokens(np.array([0.5, 0.8]), 3),
      [(1 - 0.5**4) / 0.5, (1 - 0.8**4) / 0.2])


def test_walltime_improvement_theorem_3_8():
  # EnDe, T5-small draft, greedy (Table 2): alpha .75, gamma 7, c .02.
  value = analysis.walltime_improvement(0.75, 7, 0.02)
  assert value == pytest.approx((1 - 0.75**8) / (0.25 * 1.14))
  # A verification that costs as much as two steps halves the gain.
  assert analysis.walltime_improvement(0.75, 7, 0.0, verify_cost=2.0) == \
      pytest.approx(analysis.expected_tokens(0.75, 7) / 2)


def test_expected_target_calls_for_outputs_that_end():
  # Extremes: nothing accepted is one call per token; everything accepted
  # is ceil(n / (gamma + 1)) calls.
  assert analysis.expected_target_calls(0.0, 3, 7) == pytest.approx(7.0)
  assert analysis.expected_target_calls(1.0, 3, 9) == pytest.approx(3.0)
  assert analysis.expected_target_calls(0.6, 3, 0) == 0.0
  # A long output approaches Eq. 1: n / E[tokens per call].
  long = analysis.expected_target_calls(0.6, 3, 2000)
  assert long * analysis.expected_tokens(0.6, 3) / 2000 == pytest.approx(
      1.0, abs=2e-3)
  # A short one needs more calls than Eq. 1 says (its last call is cut).
  assert analysis.expected_target_calls(0.6, 3, 14) > \
      14 / analysis.expected_tokens(0.6, 3)


def test_expected_target_calls_matches_simulation():
  rng = np.random.default_rng(0)
  alpha, gamma, length, trials = 0.7, 4, 13, 20000
  calls = np.zeros(trials)
  for trial in range(trials):
    emitted = 0
    while emitted < length:
      accepted = 0
      while accepted < gamma and rng.random() < alpha:
        accepted += 1
      emitted += accepted + 1
      calls[trial] += 1
  expected = analysis.expected_target_calls(alpha, gamma, length)
  assert abs(calls.mean() - expected) < 4 * calls.std() / np.sqrt(trials)


def test_walltime_improvement_at_lengths():
  endless = analysis.walltime_improvement(0.6, 3, 0.05, 1.2)
  short = analysis.walltime_improvement_at_lengths(0.6, 3, 0.05, [10, 14],
                                                   1.2)
  long = analysis.walltime_improvement_at_lengths(0.6, 3, 0.05, [5000], 1.2)
  assert short < long
  assert long == pytest.approx(endless, rel=2e-3)
  # Pooled: total tokens over total expected calls.
  calls = sum(analysis.expected_target_calls(0.6, 3, n) for n in (10, 14))
  assert short == pytest.approx(24 / (calls * (3 * 0.05 + 1.2)))
  with pytest.raises(ValueError, match='lengths'):
    analysis.walltime_improvement_at_lengths(0.6, 3, 0.05, [])


def test_optimal_gamma():
  # Larger alpha or cheaper drafts favour longer drafts.
  assert analysis.optimal_gamma(0.9, 0.01) > analysis.optimal_gamma(0.6, 0.01)
  assert analysis.optimal_gamma(0.8, 0.01) > analysis.optimal_gamma(0.8, 0.2)
  for alpha, c in [(0.7, 0.05), (0.8, 0.02), (0.5, 0.1)]:
    best = analysis.optimal_gamma(alpha, c)
    values = [analysis.walltime_improvement(alpha, g, c) for g in range(1, 33)]
    assert best == int(np.argmax(values)) + 1
  assert analysis.optimal_gamma(0.99, 0.0, max_gamma=32) == 32
  # An expensive verification favours longer drafts still.
  assert analysis.optimal_gamma(0.8, 0.02, verify_cost=lambda g: 1 + g) >= 1


def test_bad_arguments():
  with pytest.raises(ValueError, match='alpha must be in'):
    analysis.expected_tokens(1.5, 3)
  with pytest.raises(ValueError, match='gamma must be a non-negative integer'):
    analysis.expected_tokens(0.5, 2.5)


def _result(accepted, examined, beta, lengths, calls):
  from spec_decode.decoding import DecodeResult  # pylint: disable=g-import-not-at-top
  rows = len(accepted)
  return DecodeResult(
      tokens=np.zeros((rows, 4), np.int32), lengths=np.array(lengths),
      token_logprobs=np.zeros((rows, 4), np.float32),
      target_calls=np.array(calls), draft_tokens_proposed=3 * np.array(calls),
      draft_tokens_accepted=np.array(accepted),
      acceptance_rate=np.array(accepted) / np.array(examined),
      mean_beta=np.array(beta, np.float32),
      verified_positions=np.array(examined), num_iterations=np.array(0),
      # Every call proposed gamma = 3 tokens.
      proposal_counts=np.eye(4, dtype=np.int32)[np.full(rows, 3)]
      * np.array(calls)[:, None],
      predicted_speedup=np.zeros(rows, np.float32))


def test_alpha_counts_examined_tokens_and_pools_results():
  # Row 0: 3 calls, 4 accepted of 6 examined; row 1: 2 calls, 1 of 3.
  first = _result([4, 1], [6, 3], [0.5, 0.25], [7, 3], [3, 2])
  second = _result([3], [3], [1.0], [4], [1])
  summary = analysis.summarize_result([first, second])
  assert summary['alpha'] == pytest.approx(8 / 12)  # not 8 / 18 proposed
  assert summary['alpha_beta'] == pytest.approx((3 + 0.75 + 3) / 12)
  assert summary['tokens_per_target_call'] == pytest.approx(14 / 6)
  assert analysis.empirical_alpha(first) == pytest.approx(5 / 9)
