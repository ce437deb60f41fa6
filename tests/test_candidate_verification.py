"""k candidates per row: the rule keeps the target's distribution exactly."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from spec_decode import analysis
from spec_decode import candidate_analysis
from spec_decode import candidate_verification as cv


def _random_distribution(rng, vocab, zero_chance=0.25):
  weights = rng.random(vocab) * (rng.random(vocab) > zero_chance)
  if weights.sum() == 0:
    weights[rng.integers(vocab)] = 1.0
  return weights / weights.sum()


def _tree(rng, vocab, depth, zero_chance=0.25):
  """[vocab] * (i + 1) arrays: a distribution after every prefix of i."""
  tree = []
  for i in range(depth):
    shape = (vocab,) * i
    table = np.zeros(shape + (vocab,))
    for prefix in itertools.product(range(vocab), repeat=i):
      table[prefix] = _random_distribution(rng, vocab, zero_chance)
    tree.append(table)
  return tree


@pytest.mark.parametrize('vocab,k,nonzero', [(3, 2, 3), (4, 2, 4), (4, 3, 4),
                                             (5, 3, 2), (5, 4, 3)])
@pytest.mark.parametrize('seed', range(6))
def test_first_token_rounds_emit_exactly_p(vocab, k, nonzero, seed):
  """Over every ordered draw without replacement (q with fewer tokens than
  candidates too), the first token is distributed exactly as p."""
  rng = np.random.default_rng(seed)
  p = _random_distribution(rng, vocab)
  q = np.zeros(vocab)
  q[rng.permutation(vocab)[:nonzero]] = rng.random(nonzero) + 0.05
  q /= q.sum()
  draws = list(candidate_analysis.ordered_draws(q, k))
  assert sum(w for _, w in draws) == pytest.approx(1.0)
  tokens = np.zeros((len(draws), k), np.int32)
  valid = np.zeros((len(draws), k), bool)
  for row, (drawn, _) in enumerate(draws):
    tokens[row, :len(drawn)] = drawn
    valid[row, :len(drawn)] = True
  batch = len(draws)
  q_b = jnp.asarray(np.broadcast_to(q, (batch, vocab)), jnp.float32)
  p_b = jnp.asarray(np.broadcast_to(p, (batch, vocab)), jnp.float32)
  rounds = cv.round_distributions(jnp.asarray(tokens), jnp.asarray(valid),
                                  q_b, greedy=False)
  accept, after_all = cv.first_token_rounds(jnp.asarray(tokens),
                                            jnp.asarray(valid), rounds, p_b)
  accept, after_all = np.asarray(accept, np.float64), np.asarray(after_all)
  output = np.zeros(vocab)
  for row, (drawn, weight) in enumerate(draws):
    reach = weight
    for j, x in enumerate(drawn):
      output[x] += reach * accept[row, j]
      reach *= 1.0 - accept[row, j]
    assert np.all(accept[row, len(drawn):] == 0.0)
    output += reach * after_all[row]
    # The float64 reference agrees round by round.
    expected, _ = candidate_analysis.first_token_rounds(p, q, drawn)
    np.testing.assert_allclose(accept[row, :len(drawn)], expected, atol=2e-6)
  np.testing.assert_allclose(output, p, atol=3e-6)


def _enumerate_iterations(p_tree, q_tree, k, gamma, vocab, rng):
  """Every way one iteration can go, as rows of `verify_candidates` inputs.

  Enumerates ordered first-token draws, which round accepts (or none), the
  chosen chain's tokens and how many of them are accepted; uniforms force
  that outcome (0: accepted whenever possible, 1: rejected) and the
  outcome's probability, computed in float64 by the reference, is its
  weight. Other candidates' chains are random tokens: the rule must not
  read them.
  """
  rows = []
  for drawn, draw_weight in candidate_analysis.ordered_draws(q_tree[0], k):
    accept, _ = candidate_analysis.first_token_rounds(p_tree[0], q_tree[0],
                                                      drawn)
    chains = rng.integers(0, vocab, (k, gamma - 1))
    reach = draw_weight
    for chosen in list(range(len(drawn))) + [None]:
      weight = reach * (accept[chosen] if chosen is not None else 1.0)
      if chosen is not None:
        reach *= 1.0 - accept[chosen]
      first_uniforms = np.ones(k)
      if chosen is None:
        if weight > 0:
          rows.append((drawn, chains, first_uniforms, np.ones(gamma - 1),
                       weight))
        continue
      first_uniforms[chosen] = 0.0
      for chain in itertools.product(range(vocab), repeat=gamma - 1):
        path = (drawn[chosen],) + chain
        chain_weight = weight
        for i, y in enumerate(chain):
          chain_weight *= q_tree[i + 1][path[:i + 1]][y]
        if chain_weight == 0.0:
          continue
        chains_here = chains.copy()
        chains_here[chosen] = chain
        ratios = [min(1.0, p_tree[i + 1][path[:i + 1]][y]
                      / q_tree[i + 1][path[:i + 1]][y])
                  for i, y in enumerate(chain)]
        for kept in range(gamma):  # chain tokens accepted
          w = chain_weight * np.prod(ratios[:kept])
          if kept < gamma - 1:
            w *= 1.0 - ratios[kept]
          if w <= 0.0:
            continue
          chain_uniforms = np.ones(gamma - 1)
          chain_uniforms[:kept] = 0.0
          rows.append((drawn, chains_here, first_uniforms, chain_uniforms, w))
  return rows


def _inputs(rows, p_tree, q_tree, k, gamma, vocab):
  batch = len(rows)
  tokens = np.zeros((batch, k, gamma), np.int32)
  valid = np.zeros((batch, k), bool)
  first_q = np.broadcast_to(q_tree[0], (batch, vocab)).astype(np.float32)
  chain_q = np.zeros((batch, k, gamma - 1, vocab), np.float32)
  target = np.zeros((batch, k, gamma + 1, vocab), np.float32)
  first_u = np.zeros((batch, k), np.float32)
  chain_u = np.zeros((batch, gamma - 1), np.float32)
  for row, (drawn, chains, fu, cu, _) in enumerate(rows):
    first_u[row], chain_u[row] = fu, cu
    for j in range(k):
      x = drawn[j] if j < len(drawn) else 0
      valid[row, j] = j < len(drawn)
      path = (x,) + tuple(chains[j])
      tokens[row, j] = path
      for i in range(gamma - 1):
        chain_q[row, j, i] = q_tree[i + 1][path[:i + 1]]
      for i in range(gamma + 1):
        target[row, j, i] = p_tree[i][path[:i]]
  return (jnp.asarray(tokens), jnp.asarray(valid), jnp.asarray(first_q),
          jnp.asarray(chain_q), jnp.asarray(target), jnp.asarray(first_u),
          jnp.asarray(chain_u))


@pytest.mark.parametrize('vocab,k,gamma', [(3, 2, 2), (4, 2, 2), (4, 3, 2),
                                           (3, 2, 3), (3, 3, 3)])
@pytest.mark.parametrize('seed', range(3))
def test_an_iteration_then_the_target_gives_the_target_distribution(
    vocab, k, gamma, seed):
  """Exact: the emitted tokens, continued by the target to gamma + 1 tokens,
  are distributed as the target's own gamma + 1 tokens; and the expected
  accepted count is the float64 reference's."""
  rng = np.random.default_rng(100 + seed)
  p_tree = _tree(rng, vocab, gamma + 1)
  q_tree = _tree(rng, vocab, gamma)
  rows = _enumerate_iterations(p_tree, q_tree, k, gamma, vocab, rng)
  verdict = cv.verify_candidates(*_inputs(rows, p_tree, q_tree, k, gamma,
                                          vocab), greedy=False)
  chosen = np.asarray(verdict.chosen)
  accepted = np.asarray(verdict.accepted)
  correction = np.asarray(verdict.correction_probs, np.float64)
  horizon = gamma + 1
  output = np.zeros((vocab,) * horizon)
  expected_accepted = 0.0
  for row, (drawn, chains, first_u, chain_u, weight) in enumerate(rows):
    hit = np.flatnonzero(first_u == 0.0)
    want_chosen = int(hit[0]) if len(hit) else 0
    want_accepted = 1 + int(np.sum(chain_u == 0.0)) if len(hit) else 0
    assert chosen[row] == want_chosen and accepted[row] == want_accepted
    expected_accepted += weight * accepted[row]
    path = ((drawn[chosen[row]],) + tuple(chains[chosen[row]]))[
        :accepted[row]]
    # The emitted prefix, the correction token, then the target alone.
    partial = {path: weight}
    for length in range(len(path), horizon):
      grown = {}
      for prefix, w in partial.items():
        probs = (correction[row] if length == len(path)
                 else p_tree[length][prefix])
        for y in np.flatnonzero(probs > 0):
          grown[prefix + (int(y),)] = w * probs[y]
      partial = grown
    for sequence, w in partial.items():
      output[sequence] += w
  target = np.ones((vocab,) * horizon)
  for i in range(horizon):
    for sequence in itertools.product(range(vocab), repeat=horizon):
      target[sequence] *= p_tree[i][sequence[:i]][sequence[i]]
  np.testing.assert_allclose(output, target, atol=1e-5)
  reference = candidate_analysis.expected_accepted_tokens_candidates(
      p_tree, q_tree, k)
  assert expected_accepted == pytest.approx(reference, abs=1e-5)


@pytest.mark.parametrize('seed', range(8))
def test_more_candidates_never_accept_less(seed):
  """On every enumerated draw: P_k and the expected accepted count grow
  with k, and k = 1 is the paper's rule (`analysis`)."""
  rng = np.random.default_rng(200 + seed)
  vocab, gamma = 4, 2
  p_tree = _tree(rng, vocab, gamma + 1, zero_chance=0.1)
  q_tree = _tree(rng, vocab, gamma, zero_chance=0.1)
  accepted = [candidate_analysis.expected_accepted_tokens_candidates(
      p_tree, q_tree, k) for k in (1, 2, 3, 4)]
  assert accepted[0] == pytest.approx(
      analysis.expected_accepted_tokens_token(p_tree, q_tree), abs=1e-12)
  assert all(b >= a - 1e-12 for a, b in zip(accepted, accepted[1:]))
  first = [candidate_analysis.first_token_acceptance(p_tree[0], q_tree[0], k)
           for k in (1, 2, 3, 4)]
  assert first[0] == pytest.approx(np.minimum(p_tree[0], q_tree[0]).sum())
  assert all(b >= a - 1e-12 for a, b in zip(first, first[1:]))
  # Every token offered: one of them is accepted.
  full = _random_distribution(rng, vocab, zero_chance=0.0)
  assert candidate_analysis.first_token_acceptance(
      p_tree[0], full, vocab) == pytest.approx(1.0)
  # Context-free distributions: the closed form is exact.
  p, q = p_tree[0], q_tree[0]
  for k in (1, 2, 3):
    exact = 1.0 + candidate_analysis.expected_accepted_tokens_candidates(
        [p] * (gamma + 1), [q] * gamma, k)
    closed = candidate_analysis.expected_tokens_per_call(
        candidate_analysis.first_token_acceptance(p, q, k),
        np.minimum(p, q).sum(), gamma)
    assert exact == pytest.approx(float(closed), abs=1e-12)


def test_greedy_takes_the_candidate_on_the_argmax_path():
  vocab, k, gamma = 6, 3, 3
  logits = jnp.asarray([[0.1, 2.0, 1.5, 3.0, -1.0, 1.5]])
  tokens, valid = cv.draw_first_tokens(None, logits, logits, k, greedy=True)
  assert tokens.tolist() == [[3, 1, 2]] and bool(jnp.all(valid))
  one_hot = lambda t: jax.nn.one_hot(jnp.asarray(t), vocab)
  # The target's argmax path is 1, 4, 4, 0: the second candidate, whose
  # chain agrees for one more token.
  chains = jnp.asarray([[[3, 4, 4], [1, 4, 5], [2, 4, 4]]])
  target_path = [1, 4, 4, 0]
  target = jnp.stack([jnp.stack([one_hot(t) for t in target_path])] * k)[None]
  chain_q = jax.nn.one_hot(chains[:, :, 1:], vocab)
  verdict = cv.verify_candidates(
      chains, valid, one_hot([3]), chain_q, target,
      jnp.zeros((1, k)), jnp.zeros((1, gamma - 1)), greedy=True)
  assert int(verdict.chosen[0]) == 1 and int(verdict.accepted[0]) == 2
  assert int(jnp.argmax(verdict.correction_probs[0])) == 4
  # No candidate on the path: the target's own argmax.
  target = jnp.stack([jnp.stack([one_hot(t) for t in [5, 4, 4, 0]])] * k)[None]
  verdict = cv.verify_candidates(
      chains, valid, one_hot([3]), chain_q, target,
      jnp.zeros((1, k)), jnp.zeros((1, gamma - 1)), greedy=True)
  assert int(verdict.accepted[0]) == 0
  assert int(jnp.argmax(verdict.correction_probs[0])) == 5


def _sampled_pairs(p, q, k, draws, without_replacement=True, seed=0):
  """First two emitted tokens of `draws` sampled iterations (gamma 2,
  context-free p and q), decided by the implementation."""
  vocab = len(p)
  key = jax.random.PRNGKey(seed)
  keys = jax.random.split(key, 5)
  logq = jnp.log(jnp.broadcast_to(jnp.asarray(q, jnp.float32), (draws, vocab)))
  if without_replacement:
    first, valid = cv.draw_first_tokens(jax.random.split(keys[0], draws),
                                        logq, logq, k, greedy=False)
  else:  # Negative control: i.i.d. draws, as if the rule's q_j were wrong.
    first = jax.random.categorical(keys[0], logq[:, None, :], axis=-1,
                                   shape=(draws, k)).astype(jnp.int32)
    valid = jnp.ones((draws, k), bool)
  second = jax.random.categorical(keys[1], logq[:, None, :], axis=-1,
                                  shape=(draws, k)).astype(jnp.int32)
  tokens = jnp.stack([first, second], axis=-1)
  p_b = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (draws, k, 3, vocab))
  q_b = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (draws, vocab))
  verdict = cv.verify_candidates(
      tokens, valid, q_b, jnp.broadcast_to(q_b[:, None, None], (draws, k, 1,
                                                                 vocab)),
      p_b, jax.random.uniform(keys[2], (draws, k)),
      jax.random.uniform(keys[3], (draws, 1)), greedy=False)
  correction = jax.random.categorical(keys[4],
                                      jnp.log(verdict.correction_probs))
  chosen = jnp.take_along_axis(tokens, verdict.chosen[:, None, None],
                               axis=1)[:, 0]
  accepted = verdict.accepted
  first_emitted = jnp.where(accepted >= 1, chosen[:, 0], correction)
  second_emitted = jnp.where(accepted >= 2, chosen[:, 1],
                             jnp.where(accepted == 1, correction, -1))
  return np.asarray(first_emitted), np.asarray(second_emitted)


@pytest.mark.parametrize('k', [2, 3])
def test_sampled_first_tokens_follow_p(k):
  """Chi-square: Gumbel-top-k draws with the rule emit p; the same rule fed
  draws with replacement does not (negative control)."""
  p = np.asarray([0.5, 0.05, 0.05, 0.3, 0.1])
  q = np.asarray([0.05, 0.5, 0.3, 0.1, 0.05])
  draws = 40000
  first, second = _sampled_pairs(p, q, k, draws)
  counts = np.bincount(first, minlength=len(p))
  assert stats.chisquare(counts, p * draws).pvalue > 1e-3
  # The second token, where the iteration emitted one, is p as well.
  seconds = second[second >= 0]
  assert stats.chisquare(np.bincount(seconds, minlength=len(p)),
                         p * len(seconds)).pvalue > 1e-3
  first, _ = _sampled_pairs(p, q, k, draws, without_replacement=False)
  counts = np.bincount(first, minlength=len(p))
  assert stats.chisquare(counts, p * draws).pvalue < 1e-6
