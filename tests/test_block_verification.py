"""Block verification is exact and never accepts less than token verification.

Everything here is computed EXACTLY, by enumerating every draft block and the
uniforms' acceptance events, never by sampling: for context-dependent target
and draft distributions (a distribution after every prefix), the tokens one
iteration emits, continued by the target itself up to gamma + 1 tokens, must
follow the target's own distribution over gamma + 1 tokens. That is what
makes the whole decoding loop exact, iteration after iteration.
"""

import itertools

import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import analysis
from spec_decode import block_verification as bv
from spec_decode import draft_stop
from spec_decode import verification as token_rule

_keep_probabilities = jax.jit(bv.keep_probabilities)
_block_residual = jax.jit(bv.block_residual)
_verify_block = jax.jit(bv.verify_block)


def _random_tree(rng, vocab, depth, concentration, zero_fraction,
                 one_hot=False):
  """Distributions after every prefix: element i has shape [vocab]*(i+1)."""
  tree = []
  for i in range(depth):
    probs = rng.dirichlet(np.full(vocab, concentration),
                          size=(vocab,) * i).reshape((vocab,) * (i + 1))
    if one_hot:
      probs = np.eye(vocab)[np.argmax(probs, axis=-1)]
    mask = rng.rand(*probs.shape) < zero_fraction
    # Keep each distribution's most likely token so none is empty.
    mask &= probs < probs.max(axis=-1, keepdims=True)
    probs = np.where(mask, 0.0, probs)
    probs = (probs / probs.sum(-1, keepdims=True)).astype(np.float32)
    tree.append(probs / probs.sum(-1, keepdims=True))
  return tree


def _random_pair(seed, vocab, gamma, concentration, zero_fraction,
                 tie_fraction, one_hot=False):
  """Target tree (gamma + 1 levels) and draft tree (gamma levels)."""
  rng = np.random.RandomState(seed)
  p = _random_tree(rng, vocab, gamma + 1, concentration, zero_fraction,
                   one_hot)
  q = _random_tree(rng, vocab, gamma, concentration, zero_fraction, one_hot)
  for i in range(gamma):
    # Some prefixes where the draft matches the target exactly: the 0 / 0
    # keep probability and the empty residual.
    same = np.asarray(rng.random_sample((vocab,) * i)) < tie_fraction
    q[i] = np.where(same[..., None], p[i], q[i])
  return p, q


def _batched(p, q):
  """Every draft block, with the distributions along its path."""
  gamma, vocab = len(q), q[0].shape[-1]
  blocks = np.array(list(itertools.product(range(vocab), repeat=gamma)),
                    np.int32)  # [vocab^gamma, gamma], row-major order
  along = lambda tree, i: np.broadcast_to(  # [blocks, vocab]
      tree[i][tuple(blocks[:, :i].T)], (len(blocks), vocab))
  draft = np.stack([along(q, i) for i in range(gamma)], axis=1)
  target = np.stack([along(p, i) for i in range(gamma + 1)], axis=1)
  draw = np.prod(np.take_along_axis(draft, blocks[..., None], -1)[..., 0],
                 axis=1, dtype=np.float64)  # P(block) under the draft
  return blocks, draft, target, draw


def _stop_probabilities(h):
  """P(tau = i | block), i = 0..gamma, when tau = max{i : u_i < h_i}."""
  h = np.asarray(h, np.float64)
  gamma = h.shape[1]
  probs = np.zeros((h.shape[0], gamma + 1))
  none_longer = np.ones(h.shape[0])
  for i in range(gamma, 0, -1):
    probs[:, i] = h[:, i - 1] * none_longer
    none_longer = none_longer * (1.0 - h[:, i - 1])
  probs[:, 0] = none_longer
  return probs


def _token_stop_probabilities(blocks, draft, target):
  """P(tau = i | block) under token verification (first rejection)."""
  accept = np.asarray(token_rule.acceptance_probability(
      jnp.asarray(target[:, :-1]), jnp.asarray(draft)), np.float64)
  accept = np.take_along_axis(accept, blocks[..., None], -1)[..., 0]
  gamma = blocks.shape[1]
  reach = np.concatenate([np.ones((len(blocks), 1)),
                          np.cumprod(accept, axis=1)], axis=1)
  rejected = np.concatenate([1.0 - accept, np.ones((len(blocks), 1))], 1)
  assert reach.shape[1] == gamma + 1
  return reach * rejected


def _target_joint(p):
  """P_target(s) for every sequence s of gamma + 1 tokens, and the factors."""
  depth, vocab = len(p), p[0].shape[-1]
  # factors[j][s] = p_{j+1}(s_{j+1} | s_1..s_j), broadcast over later tokens.
  factors = [np.asarray(p[j], np.float64).reshape(
      (vocab,) * (j + 1) + (1,) * (depth - j - 1)) for j in range(depth)]
  return np.prod(np.broadcast_arrays(*factors), axis=0), factors


def _output_distribution(p, q, stop_probs, residuals, draw, blocks):
  """P(emitted tokens, continued by the target) over gamma + 1 tokens.

  Args:
    p: Target tree.
    q: Draft tree.
    stop_probs: [blocks, gamma + 1] P(tau = i | block).
    residuals: [gamma + 1, blocks, vocab] the correction distribution when
      tau = i.
    draw: [blocks] P(block).
    blocks: [blocks, gamma].

  Returns:
    float64 [vocab] * (gamma + 1).
  """
  gamma, vocab = len(q), q[0].shape[-1]
  del blocks  # Row-major enumeration: reshape recovers the block axes.
  _, factors = _target_joint(p)
  output = np.zeros((vocab,) * (gamma + 1))
  for tau in range(gamma + 1):
    # Mass of (first tau draft tokens, correction y), summed over the rest
    # of the block.
    mass = (draw * stop_probs[:, tau])[:, None] * np.asarray(
        residuals[tau], np.float64)  # [blocks, vocab]
    mass = mass.reshape((vocab,) * gamma + (vocab,))
    mass = mass.sum(axis=tuple(range(tau, gamma)))  # [vocab]*(tau+1)
    emitted = mass.reshape(mass.shape + (1,) * (gamma - tau))
    continuation = np.prod(np.broadcast_arrays(
        np.ones((vocab,) * (gamma + 1)), *factors[tau + 1:]), axis=0)
    output += emitted * continuation
  return output


def _block_exact(p, q):
  """Output distribution and E[accepted] of `bv` (the JAX code) exactly."""
  blocks, draft, target, draw = _batched(p, q)
  gamma = len(q)
  args = (jnp.asarray(blocks), jnp.asarray(draft), jnp.asarray(target))
  weights, h = _keep_probabilities(*args)
  stop = _stop_probabilities(h)
  residuals = [np.asarray(_block_residual(
      args[1], args[2], weights, jnp.full((len(blocks),), tau, jnp.int32)))
               for tau in range(gamma + 1)]
  output = _output_distribution(p, q, stop, residuals, draw, blocks)
  accepted = float(np.sum(draw[:, None] * stop * np.arange(gamma + 1)))
  return output, accepted, (blocks, draft, target, weights, h, residuals)


def _token_exact(p, q):
  """The same for token verification (verification.py's functions)."""
  blocks, draft, target, draw = _batched(p, q)
  gamma = len(q)
  stop = _token_stop_probabilities(blocks, draft, target)
  residuals = [np.asarray(token_rule.correction_distribution(
      jnp.asarray(draft), jnp.asarray(target),
      jnp.full((len(blocks),), tau, jnp.int32))) for tau in range(gamma + 1)]
  output = _output_distribution(p, q, stop, residuals, draw, blocks)
  accepted = float(np.sum(draw[:, None] * stop * np.arange(gamma + 1)))
  return output, accepted


PAIRS = dict(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(3, 4),
    gamma=st.integers(2, 3),
    concentration=st.sampled_from([0.1, 0.5, 1.0, 4.0]),
    zero_fraction=st.sampled_from([0.0, 0.3]),
    tie_fraction=st.sampled_from([0.0, 0.4]),
)


@hypothesis.settings(max_examples=120, deadline=None)
@hypothesis.given(**PAIRS)
def test_block_output_is_exactly_the_target_distribution(
    seed, vocab, gamma, concentration, zero_fraction, tie_fraction):
  p, q = _random_pair(seed, vocab, gamma, concentration, zero_fraction,
                      tie_fraction)
  target, _ = _target_joint(p)
  output, accepted, _ = _block_exact(p, q)
  np.testing.assert_allclose(output.sum(), 1.0, atol=1e-5)
  # float32 rounding stays near 1e-7; the negative controls below are
  # off by more than 1e-3.
  np.testing.assert_allclose(output, target, atol=1e-6)
  # The same harness on the token rule: exact too, and never longer.
  token_output, token_accepted = _token_exact(p, q)
  np.testing.assert_allclose(token_output, target, atol=1e-6)
  assert accepted >= token_accepted - 1e-6
  # The float64 enumeration in `analysis` agrees with the JAX code.
  np.testing.assert_allclose(analysis.expected_accepted_tokens_block(p, q),
                             accepted, atol=1e-6)
  np.testing.assert_allclose(analysis.expected_accepted_tokens_token(p, q),
                             token_accepted, atol=1e-6)
  # Equal in exact arithmetic on many draws: allow float64 rounding only.
  assert (analysis.expected_accepted_tokens_block(p, q)
          >= analysis.expected_accepted_tokens_token(p, q) - 1e-9)


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(**PAIRS)
def test_verify_block_keeps_the_longest_prefix_under_its_h(
    seed, vocab, gamma, concentration, zero_fraction, tie_fraction):
  """verify_block(u) is tau = max{i : u_i < h_i} and its residual, for u
  just under or just over every h_i (all 2^gamma patterns, every block)."""
  p, q = _random_pair(seed, vocab, gamma, concentration, zero_fraction,
                      tie_fraction)
  _, _, (blocks, draft, target, _, h, residuals) = _block_exact(p, q)
  h = np.asarray(h)
  patterns = np.array(list(itertools.product([False, True], repeat=gamma)))
  rows = np.repeat(np.arange(len(blocks)), len(patterns))
  under = np.tile(patterns, (len(blocks), 1))
  h_rows = h[rows]
  # u < h is possible only for h > 0; u >= h only for h < 1.
  under = (under & (h_rows > 0)) | (h_rows >= 1)
  uniforms = np.where(under, h_rows * (1 - 1e-4) - 1e-7,
                      np.minimum(h_rows * (1 + 1e-4) + 1e-7, 1 - 2**-24))
  uniforms = np.clip(uniforms, 0.0, 1 - 2**-24).astype(np.float32)
  num_accepted, correction = _verify_block(
      jnp.asarray(blocks[rows]), jnp.asarray(draft[rows]),
      jnp.asarray(target[rows]), jnp.asarray(uniforms))
  expected = np.max(np.where(under, np.arange(1, gamma + 1), 0), axis=1)
  np.testing.assert_array_equal(np.asarray(num_accepted), expected)
  stacked = np.stack(residuals)  # [gamma + 1, blocks, vocab]
  np.testing.assert_allclose(np.asarray(correction),
                             stacked[expected, rows], atol=1e-7)


def test_paper_motivating_example():
  # Sun et al., Section 1: vocabulary {a, b}, M_b = (1/3, 2/3),
  # M_s = (2/3, 1/3) at every position, gamma = 2: token verification
  # accepts 10/9 tokens in expectation, block verification 11/9.
  p = [np.array([1 / 3, 2 / 3], np.float32)] * 3
  q = [np.array([2 / 3, 1 / 3], np.float32)] * 2
  assert analysis.expected_accepted_tokens_token(p, q) == pytest.approx(
      10 / 9)
  assert analysis.expected_accepted_tokens_block(p, q) == pytest.approx(
      11 / 9)
  assert analysis.expected_tokens_per_iteration(p, q, 'block') == \
      pytest.approx(20 / 9)
  # Context-independent with beta at every position: Eq. 1 minus one.
  beta = 2 / 3
  assert analysis.expected_tokens_per_iteration(p, q) == pytest.approx(
      float(analysis.expected_tokens(beta, 2)))
  tree = lambda dists: [np.broadcast_to(d, (2,) * (i + 1))
                        for i, d in enumerate(dists)]
  output, accepted, _ = _block_exact(tree(p), tree(q))
  assert accepted == pytest.approx(11 / 9, abs=1e-6)
  np.testing.assert_allclose(output, _target_joint(tree(p))[0], atol=1e-6)


def test_negative_controls_are_detected_by_the_harness():
  # Plausible-looking mistakes must fail the exact comparison above, or
  # its passing would mean nothing.
  p, q = _random_pair(3, 3, 3, 1.0, 0.0, 0.0)
  target, _ = _target_joint(p)
  blocks, draft, target_probs, draw = _batched(p, q)
  args = (jnp.asarray(blocks), jnp.asarray(draft), jnp.asarray(target_probs))
  weights, h = bv.keep_probabilities(*args)
  stop = _stop_probabilities(h)

  def output_with(residual_weights, stop_probs):
    residuals = [np.asarray(bv.block_residual(
        args[1], args[2], residual_weights,
        jnp.full((len(blocks),), tau, jnp.int32))) for tau in range(4)]
    return _output_distribution(p, q, stop_probs, residuals, draw, blocks)

  np.testing.assert_allclose(output_with(weights, stop), target, atol=1e-6)
  # The residual without the weight w_tau: norm(max(p - q, 0)).
  wrong = output_with(jnp.ones_like(weights), stop)
  assert np.abs(wrong - target).max() > 1e-3
  # The keep probabilities applied as token verification does (stop at the
  # first failure instead of keeping the longest kept prefix).
  first_failure = np.asarray(h, np.float64)
  reach = np.concatenate([np.ones((len(blocks), 1)),
                          np.cumprod(first_failure, axis=1)], axis=1)
  rejected = np.concatenate([1.0 - first_failure,
                             np.ones((len(blocks), 1))], axis=1)
  wrong = output_with(weights, reach * rejected)
  assert np.abs(wrong - target).max() > 1e-3


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 5),
                  gamma=st.integers(1, 4))
def test_greedy_is_token_verification(seed, vocab, gamma):
  # One-hot p and q with zero uniforms: keep while the argmaxes agree, then
  # the target's argmax, exactly as the token rule.
  p, q = _random_pair(seed, vocab, gamma, 1.0, 0.0, 0.3, one_hot=True)
  blocks, draft, target, _ = _batched(p, q)
  # Greedy proposals are the draft's argmaxes: keep the blocks that are.
  proposed = np.all(np.take_along_axis(draft, blocks[..., None], -1) == 1,
                    axis=(1, 2))
  blocks, draft, target = blocks[proposed], draft[proposed], target[proposed]
  zeros = jnp.zeros(blocks.shape, jnp.float32)
  num_accepted, correction = bv.verify_block(
      jnp.asarray(blocks), jnp.asarray(draft), jnp.asarray(target), zeros)
  expected = token_rule.verify_draft(jnp.asarray(blocks), jnp.asarray(draft),
                                      jnp.asarray(target), zeros)
  np.testing.assert_array_equal(np.asarray(num_accepted),
                                np.asarray(expected))
  np.testing.assert_array_equal(
      np.asarray(correction),
      np.asarray(token_rule.correction_distribution(
          jnp.asarray(draft), jnp.asarray(target), expected)))
  agree = np.argmax(draft, -1) == np.argmax(target[:, :-1], -1)
  np.testing.assert_array_equal(np.asarray(num_accepted),
                                np.sum(np.cumprod(agree, axis=1), axis=1))


def test_gamma_one_is_token_verification():
  # With one draft token h_1 = w_1 = min(1, p/q) and the residual is the
  # token rule's: the two rules coincide.
  p, q = _random_pair(5, 4, 1, 0.5, 0.3, 0.0)
  blocks, draft, target, _ = _batched(p, q)
  args = (jnp.asarray(blocks), jnp.asarray(draft), jnp.asarray(target))
  _, h = bv.keep_probabilities(*args)
  accept = token_rule.acceptance_probability(args[2][:, 0], args[1][:, 0])
  np.testing.assert_allclose(
      np.asarray(h)[:, 0],
      np.take_along_axis(np.asarray(accept), blocks, axis=1)[:, 0])


def test_draft_equal_to_target_keeps_everything():
  p, _ = _random_pair(7, 4, 3, 1.0, 0.0, 0.0)
  q = p[:3]
  blocks, draft, target, _ = _batched(p, q)
  num_accepted, correction = bv.verify_block(
      jnp.asarray(blocks), jnp.asarray(draft), jnp.asarray(target),
      jnp.full(blocks.shape, 1 - 2**-24, jnp.float32))
  np.testing.assert_array_equal(np.asarray(num_accepted), 3)
  np.testing.assert_allclose(np.asarray(correction), target[:, 3], atol=1e-7)


def test_empty_residual_falls_back_to_p():
  p = jnp.asarray([[[0.25, 0.25, 0.5]] * 2])
  q = p[:, :1]
  correction = bv.block_residual(q, p, jnp.ones((1, 2)),
                                 jnp.zeros((1,), jnp.int32))
  np.testing.assert_allclose(np.asarray(correction), np.asarray(p[:, 0]))


def test_analysis_rejects_malformed_distributions():
  with pytest.raises(ValueError, match='p must hold at least 3'):
    analysis.expected_accepted_tokens_block([[0.5, 0.5]] * 2,
                                            [[0.5, 0.5]] * 2)
  with pytest.raises(ValueError, match=r'q\[1\] must have shape'):
    analysis.expected_accepted_tokens_block([[0.5, 0.5]] * 3,
                                            [[0.5, 0.5], np.ones((3, 2)) / 2])
  with pytest.raises(ValueError, match='probability distributions'):
    analysis.expected_accepted_tokens_token([[0.5, 0.6]] * 2, [[0.5, 0.5]])
  with pytest.raises(ValueError, match="verification must be 'token' or"):
    analysis.expected_tokens_per_iteration([[0.5, 0.5]] * 2, [[0.5, 0.5]],
                                           'tree')


# Adaptive draft length (draft_stop): a stopped block, exactly.

def _stopped_exact(p, q, rule, verification, zero_after_stop=True):
  """Output distribution and E[accepted] when each row stops by `rule`.

  The stop point k of a block is computed by `draft_stop.is_unsure` on the
  draft's distributions along it (passed as logits log q), the draft's
  probabilities after k are zeroed as `drafting.propose` does, and
  positions from k on never pass (their uniforms are 1, as
  `draft_stop.never_accept_past` sets them).
  """
  blocks, draft, target, draw = _batched(p, q)
  gamma = len(q)
  with np.errstate(divide='ignore'):
    logits = jnp.asarray(np.log(draft))
  unsure = np.stack([np.asarray(draft_stop.is_unsure(logits[:, i], rule))
                     for i in range(gamma)], axis=1)
  unsure[:, 0] = False  # The first token is always proposed.
  count = np.argmax(np.concatenate([unsure, np.ones((len(blocks), 1), bool)],
                                   axis=1), axis=1)  # first unsure position
  proposed = np.arange(gamma)[None] < count[:, None]
  uniforms = np.asarray(draft_stop.never_accept_past(
      jnp.zeros(blocks.shape), jnp.asarray(count, jnp.int32)))
  np.testing.assert_array_equal(uniforms == 1.0, ~proposed)
  if zero_after_stop:
    draft = np.where(proposed[..., None], draft, 0.0).astype(np.float32)
  args = (jnp.asarray(blocks), jnp.asarray(draft), jnp.asarray(target))
  if verification == 'block':
    weights, h = bv.keep_probabilities(*args)
    stop = _stop_probabilities(np.where(proposed, np.asarray(h), 0.0))
    residuals = [np.asarray(bv.block_residual(
        args[1], args[2], weights, jnp.full((len(blocks),), tau, jnp.int32)))
                 for tau in range(gamma + 1)]
  else:
    accept = np.asarray(token_rule.acceptance_probability(
        args[2][:, :-1], args[1]), np.float64)
    accept = np.take_along_axis(accept, blocks[..., None], -1)[..., 0]
    accept = np.where(proposed, accept, 0.0)
    reach = np.concatenate([np.ones((len(blocks), 1)),
                            np.cumprod(accept, axis=1)], axis=1)
    stop = reach * np.concatenate([1.0 - accept,
                                   np.ones((len(blocks), 1))], axis=1)
    residuals = [np.asarray(token_rule.correction_distribution(
        args[1], args[2], jnp.full((len(blocks),), tau, jnp.int32)))
                 for tau in range(gamma + 1)]
  # Nothing is ever accepted past a row's stop.
  assert np.all(stop[np.arange(gamma + 1)[None] > count[:, None]] == 0)
  output = _output_distribution(p, q, stop, residuals, draw, blocks)
  accepted = float(np.sum(draw[:, None] * stop * np.arange(gamma + 1)))
  return output, accepted, count


@hypothesis.settings(max_examples=80, deadline=None)
@hypothesis.given(
    rule=st.sampled_from(['confidence', 'entropy']),
    threshold=st.floats(0.05, 1.0),
    verification=st.sampled_from(['token', 'block']),
    **PAIRS)
def test_stopped_blocks_are_exact(rule, threshold, verification, seed, vocab,
                                  gamma, concentration, zero_fraction,
                                  tie_fraction):
  if rule == 'entropy':
    threshold *= np.log(vocab)  # Spread over [0, max entropy].
  p, q = _random_pair(seed, vocab, gamma, concentration, zero_fraction,
                      tie_fraction)
  output, accepted, count = _stopped_exact(p, q, (rule, threshold),
                                           verification)
  np.testing.assert_allclose(output, _target_joint(p)[0], atol=1e-6)
  assert -1e-6 <= accepted <= gamma + 1e-6
  assert count.min() >= 1 and count.max() <= gamma


def test_stopped_blocks_are_exact_for_a_fixed_mixed_case():
  # A draw where some blocks stop after 1 token, some after 2 and some run
  # to gamma = 3, so the exactness above is not vacuous.
  p, q = _random_pair(11, 4, 3, 1.0, 0.0, 0.0)
  for rule in ('token', 'block'):
    output, _, count = _stopped_exact(p, q, ('confidence', 0.5), rule)
    assert set(count.tolist()) == {1, 2, 3}
    np.testing.assert_allclose(output, _target_joint(p)[0], atol=1e-6)
    # Negative control: keeping the unproposed q_{k+1} makes the token
    # after a fully accepted short block a residual instead of p: biased.
    wrong, _, _ = _stopped_exact(p, q, ('confidence', 0.5), rule,
                                 zero_after_stop=False)
    assert np.abs(wrong - _target_joint(p)[0]).max() > 1e-3


def test_draft_stop_rules():
  logits = jnp.log(jnp.asarray([[0.9, 0.05, 0.05], [0.4, 0.3, 0.3],
                                [1.0, 0.0, 0.0]]))
  np.testing.assert_array_equal(
      np.asarray(draft_stop.is_unsure(logits, ('confidence', 0.5))),
      [False, True, False])
  entropy = -np.sum(np.where(np.exp(logits) > 0,
                             np.exp(logits) * logits, 0.0), axis=1)
  np.testing.assert_array_equal(
      np.asarray(draft_stop.is_unsure(logits, ('entropy', 0.5))),
      entropy > 0.5)
  assert not bool(draft_stop.is_unsure(logits[2:], ('entropy', 0.0))[0])
