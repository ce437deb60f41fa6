"""What k candidates per row are worth (`candidate_verification`'s rule).

Exact expectations by enumeration on small vocabularies, in float64 and
independently of the JAX implementation (the tests hold one against the
other), and the closed form the loop's statistics feed:

  tokens per call = 1 + P_k * (1 - alpha^gamma) / (1 - alpha),

where P_k is the chance that one of the k distinct first tokens is accepted
(P_1 = alpha = sum_x min(p, q)) and alpha the acceptance rate at each
further position of the chosen chain (i.i.d. positions, as the paper's
Eq. 1; k = 1 gives Eq. 1 itself).
"""

import itertools
from typing import Any, Iterator, List, Sequence, Tuple

import numpy as np

from spec_decode import analysis


def _check_candidates(num_candidates: Any) -> int:
  if (isinstance(num_candidates, bool)
      or not isinstance(num_candidates, (int, np.integer))
      or num_candidates < 1):
    raise ValueError(f'num_candidates must be an integer >= 1, got '
                     f'{num_candidates!r}.')
  return int(num_candidates)


def ordered_draws(q: np.ndarray, num_candidates: int
                  ) -> Iterator[Tuple[Tuple[int, ...], float]]:
  """Every ordered draw of distinct tokens without replacement from q.

  Draws stop at num_candidates tokens, or earlier when q has no mass left
  (top-k/top-p processing can leave fewer tokens than candidates).

  Yields:
    (tokens, probability) pairs; the probabilities sum to 1.
  """
  def extend(tokens, probability):
    left = [int(x) for x in np.flatnonzero(q > 0) if x not in tokens]
    if len(tokens) == num_candidates or not left:
      yield tuple(tokens), probability
      return
    mass = float(sum(q[x] for x in left))
    for x in left:
      yield from extend(tokens + [x], probability * q[x] / mass)
  yield from extend([], 1.0)


def first_token_rounds(p: np.ndarray, q: np.ndarray,
                       tokens: Sequence[int]) -> Tuple[List[float],
                                                       np.ndarray]:
  """Each round's acceptance probability and the distribution after all.

  Args:
    p: float64 [vocab] the target's first-position distribution.
    q: float64 [vocab] the draft's.
    tokens: The distinct first tokens in draw order.

  Returns:
    [k] acceptance probabilities min(1, r_j(x_j) / q_j(x_j)) and r_{k+1}.
  """
  residual = np.asarray(p, np.float64)
  remaining = np.asarray(q, np.float64).copy()
  accept = []
  for x in tokens:
    q_j = remaining / remaining.sum()
    accept.append(min(1.0, residual[x] / q_j[x]) if q_j[x] > 0 else 0.0)
    left = np.maximum(residual - q_j, 0.0)
    if left.sum() > 1e-12:
      residual = left / left.sum()
    remaining[x] = 0.0
  return accept, residual


def first_token_acceptance(p: Any, q: Any, num_candidates: int) -> float:
  """EXACT P_k: the chance that one of k distinct first tokens is accepted.

  Args:
    p: [vocab] target distribution.
    q: [vocab] draft distribution.
    num_candidates: k (P_1 = sum_x min(p(x), q(x))).

  Returns:
    P_k in [0, 1], never below P_1 and increasing with k.
  """
  k = _check_candidates(num_candidates)
  p, q = (analysis.prefix_distributions([d], 1, name)[0]
          for d, name in ((p, 'p'), (q, 'q')))
  total = 0.0
  for tokens, probability in ordered_draws(q, k):
    accept, _ = first_token_rounds(p, q, tokens)
    total += probability * (1.0 - float(np.prod(1.0 - np.asarray(accept))))
  return total


def expected_accepted_tokens_candidates(p: Sequence[Any], q: Sequence[Any],
                                        num_candidates: int) -> float:
  """EXACT E[accepted draft tokens per iteration] with k candidates.

  Enumerates every ordered draw of first tokens and every chain below the
  one that continues (small vocabularies only).

  Args:
    p: gamma + 1 target distributions, as `analysis.
      expected_accepted_tokens_token` takes them ([vocab] each, or indexed
      by the prefix).
    q: gamma draft distributions in the same form; len(q) is gamma.
    num_candidates: k; 1 is `analysis.expected_accepted_tokens_token`.

  Returns:
    The expected accepted count (tokens per call is this plus 1).
  """
  k = _check_candidates(num_candidates)
  gamma = len(q)
  if gamma < 1:
    raise ValueError('q must hold at least one distribution (gamma >= 1).')
  q_tree = analysis.prefix_distributions(q, gamma, 'q')
  p_tree = analysis.prefix_distributions(p, gamma + 1, 'p')
  vocab = q_tree[0].shape[-1]
  total = 0.0
  for tokens, probability in ordered_draws(q_tree[0], k):
    accept, _ = first_token_rounds(p_tree[0], q_tree[0], tokens)
    not_yet = 1.0
    for x, chance in zip(tokens, accept):
      chosen, not_yet = not_yet * chance, not_yet * (1.0 - chance)
      if chosen > 0.0:
        total += probability * chosen * (1.0 + _chain_accepted(
            p_tree, q_tree, x, gamma, vocab))
  return total


def _chain_accepted(p_tree, q_tree, first: int, gamma: int,
                    vocab: int) -> float:
  """E[tokens accepted below an accepted first token], token rule."""
  total = 0.0
  for block in itertools.product(range(vocab), repeat=gamma - 1):
    path = (first,) + block
    q_path = [q_tree[i][path[:i]] for i in range(1, gamma)]
    probability = float(np.prod([q_path[i][x] for i, x in enumerate(block)]))
    if probability > 0.0:
      p_path = [p_tree[i][path[:i]] for i in range(1, gamma + 1)]
      total += probability * analysis.accepted_given_block(
          p_path, q_path, block, 'token')
  return total


def expected_tokens_per_call(first_accept: Any, alpha: Any, gamma: int
                             ) -> np.ndarray:
  """1 + P_k (1 - alpha^gamma) / (1 - alpha): tokens per target call.

  Args:
    first_accept: P_k (`first_token_acceptance`, or what the loop
      measured: `DecodeResult.first_token_acceptance`).
    alpha: Acceptance rate at the chain's further positions.
    gamma: Tokens per candidate (>= 1).

  Returns:
    float64 tokens per call (k = 1, P_1 = alpha: the paper's Eq. 1).
  """
  alpha = np.clip(np.asarray(alpha, np.float64), 0.0, 1.0)
  first_accept = np.clip(np.asarray(first_accept, np.float64), 0.0, 1.0)
  # 1 + alpha + ... + alpha^(gamma - 1), written as a sum: exact at 1.
  chain = sum(alpha ** i for i in range(gamma))
  return 1.0 + first_accept * chain


def predicted_speedup(first_accept: Any, alpha: Any, gamma: int,
                      iteration_cost: float) -> np.ndarray:
  """Tokens per call over what an iteration costs in baseline steps (the
  k-row draft steps and the (1 + k gamma)-token target call, measured)."""
  if not iteration_cost > 0:
    raise ValueError(f'iteration_cost must be > 0, got {iteration_cost}.')
  return expected_tokens_per_call(first_accept, alpha, gamma) / iteration_cost
