"""gamma='auto' inside the compiled loop: how many tokens each row proposes.

At every iteration each active row chooses how many draft tokens to
propose, 0 .. max_gamma, from its own acceptance so far and the measured
costs, and the target's call is as wide as the longest proposal needs:

  * alpha_b: an exponential average of the row's beta = sum_x min(p, q) at
    the positions the rule examined (Corollary 3.6: its expectation is the
    acceptance rate), starting from a prior (the pair's last measured
    alpha). A row that proposes nothing observes nothing; its estimate then
    drifts back toward the prior, so a row that hit a hard stretch tries
    again later instead of never.
  * The value of g proposals at alpha_b is Theorem 3.8's ratio: expected
    tokens (1 - alpha^(g+1)) / (1 - alpha) over the iteration's measured
    cost in baseline iterations: the target call at the call's width, g
    draft steps, and what the speculative loop pays beyond its calls
    (`costs.CostProfile.iteration_cost`). g = 0 is a plain target step (1
    token for 1 iteration). A row speculates only when its best g beats 0
    by the margin `min_gain`.
  * The target's call width is the smallest of a few compiled widths
    (`chunk_widths`) covering every row's g + 1, chosen with `lax.switch`;
    the rule prices each g at the width it would run at.
  * A row that does not propose at its first iteration never does in that
    call (`ever_proposes`): when that holds for the prior, the call is a
    baseline decode and `generate` runs the baseline's own program.

Why this stays exact: a row's count is fixed before its draft proposes,
from tokens already emitted; any count is a valid speculative step
(positions past it are never accepted and the token after a fully accepted
block is the bonus from p, as with `draft_stop`). The costs, the prior and
the margin are traced arrays, so one compiled program serves every choice.
"""

from typing import Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# How fast a row's estimate follows its own betas (weight of one examined
# position), and how fast an estimate nobody feeds drifts back to the prior
# (per iteration without a proposal).
ALPHA_RATE = 0.15
PRIOR_PULL = 0.1
# A row speculates only when its best count is predicted this much faster
# than a plain step. The prediction leaves out what a speculative call pays
# once (the draft's encoder pass and set-up), what switching between
# proposing and plain steps costs (the draft catching up), and the costs are
# medians on a shared machine. The main job (`python -m spec_decode.main`,
# its `speedup` over its `pred loop` column) measured 0.79-0.86 of the
# predicted speedup on the 2-core AVX2 EPYC (2026-12-02), 0.67-0.73 on
# the AVX-512 one (greedy, three runs, 2026-12-03) and, with the faster
# few-row kernels there, 0.56-0.62 (greedy, both tasks, two runs with
# freshly measured profiles, 2026-12-04: 0.88-0.92x measured where the
# rule predicted 1.44-1.64x): below this margin a proposal can lose to
# baseline, and losing is worse than missing a small gain. (Where
# speculation pays by the paper's margins, on accelerators, predictions
# are 2-3x: the margin does not bind.)
MIN_GAIN = 1.7


@flax.struct.dataclass
class ProposalCosts:
  """What the rule reads, traced: changing them never recompiles.

  Attributes:
    iteration_cost: float32 [max_gamma + 1]: an iteration proposing g
      tokens, in baseline iterations, as timed at the call width it runs
      at (`costs.CostProfile.iteration_cost`).
    alpha_prior: float32 []: the estimate every row starts from.
    min_gain: float32 []: the margin over a plain step.
  """
  iteration_cost: Array
  alpha_prior: Array
  min_gain: Array

  @classmethod
  def create(cls, iteration_cost: Sequence[float], alpha_prior: float,
             min_gain: Optional[float] = None) -> 'ProposalCosts':
    """The rule's inputs as arrays; min_gain None reads `MIN_GAIN` now."""
    # NumPy arrays: they reach the device with the call's other arguments
    # instead of as three separate transfers before it, on every call.
    return cls(iteration_cost=np.asarray(iteration_cost, np.float32),
               alpha_prior=np.asarray(alpha_prior, np.float32),
               min_gain=np.asarray(MIN_GAIN if min_gain is None else min_gain,
                                   np.float32))


def forced_costs(count: int, max_gamma: int) -> ProposalCosts:
  """Costs under which every row proposes `count` tokens at every iteration
  where it may still emit more than `count` (and 0 after): how
  `benchmark.loop_iteration_seconds` times what an iteration of
  gamma='auto''s own loop costs at a count.

  Args:
    count: Proposals per iteration, 1 .. max_gamma.
    max_gamma: The loop's largest count.
  """
  if not 1 <= count <= max_gamma:
    raise ValueError(f'count must be in [1, max_gamma={max_gamma}], got '
                     f'{count}.')
  # Only `count` is cheap: its rate beats a plain step's by orders of
  # magnitude, every other count's is far below it.
  iteration_cost = np.full((max_gamma + 1,), 1e6, np.float32)
  iteration_cost[0] = 1.0
  iteration_cost[count] = 1e-6
  return ProposalCosts.create(iteration_cost, alpha_prior=0.5)


def chunk_widths(max_gamma: int) -> Tuple[int, ...]:
  """The target call widths compiled for gamma='auto': 1, 2, 4, ... and
  max_gamma + 1 (each is one more compiled branch of the target)."""
  widths = {max_gamma + 1}
  width = 1
  while width < max_gamma + 1:
    widths.add(width)
    width *= 2
  return tuple(sorted(widths))


def width_index(tokens: Array, widths: Tuple[int, ...]) -> Array:
  """Index of the smallest width >= tokens (int32, any shape)."""
  return jnp.sum(jnp.asarray(widths) < jnp.asarray(tokens)[..., None],
                 axis=-1).astype(jnp.int32)


def expected_tokens(alpha: Array, max_gamma: int) -> Array:
  """(1 - alpha^(g+1)) / (1 - alpha) for g = 0 .. max_gamma.

  Args:
    alpha: float32 [batch].
    max_gamma: Largest count.

  Returns:
    float32 [batch, max_gamma + 1]; g + 1 where alpha = 1.
  """
  alpha = jnp.clip(alpha, 0.0, 1.0)[:, None]
  # sum_{i=0}^{g} alpha^i, written as a sum: exact at alpha = 1.
  powers = alpha ** jnp.arange(max_gamma + 1, dtype=jnp.float32)[None, :]
  return jnp.cumsum(powers, axis=-1)


def choose_counts(alpha: Array, remaining: Array, active: Array,
                  costs: ProposalCosts) -> Tuple[Array, Array, Array]:
  """Each row's proposals this iteration, and what the rule expects of it.

  Args:
    alpha: float32 [batch] each row's acceptance estimate.
    remaining: int32 [batch] tokens each row may still emit.
    active: bool [batch] rows still decoding.
    costs: The measured costs and the prior.

  Returns:
    int32 [batch] counts in [0, max_gamma] (0 for inactive rows), and
    float32 [batch] the expected tokens and the cost (in baseline
    iterations) of the chosen count.
  """
  max_gamma = costs.iteration_cost.shape[0] - 1
  tokens = expected_tokens(alpha, max_gamma)  # [batch, max_gamma + 1]
  cost = costs.iteration_cost[None, :]
  counts = jnp.arange(max_gamma + 1, dtype=jnp.int32)[None, :]
  # Proposing more than can still be emitted only costs.
  usable = counts < jnp.maximum(remaining, 1)[:, None]
  rate = jnp.where(usable, tokens / cost, -1.0)
  best = jnp.argmax(rate, axis=-1).astype(jnp.int32)
  best_rate = jnp.max(rate, axis=-1)
  speculate = best_rate > costs.min_gain * rate[:, 0]
  chosen = jnp.where(speculate & active, best, 0)
  pick = lambda table: jnp.take_along_axis(
      jnp.broadcast_to(table, rate.shape), chosen[:, None], axis=1)[:, 0]
  return chosen, pick(tokens), pick(cost)


@jax.jit
def ever_proposes(costs: ProposalCosts, max_decode_len: int) -> Array:
  """bool []: whether a row starting a call would propose at all.

  Every row starts from the prior with the whole output to go. A row that
  proposes nothing observes nothing, so its estimate stays exactly the
  prior (`update_alpha` pulls it toward itself) while fewer tokens remain,
  which only removes counts the rule may choose: a row that does not
  propose at its first iteration never does. Such a call is a baseline
  decode, and `speculative` runs it as one.

  Jitted (the length traced, so one program serves every call): `generate`
  asks before every gamma='auto' call, and as a dozen eager ops, each
  waited for, the question cost ~3 ms, a sixth of a short output's decode.

  Args:
    costs: The measured costs and the prior.
    max_decode_len: The call's output limit.
  """
  counts, _, _ = choose_counts(
      costs.alpha_prior[None], jnp.full((1,), max_decode_len, jnp.int32),
      jnp.ones((1,), jnp.bool_), costs)
  return counts[0] > 0


def update_alpha(alpha: Array, beta_sum: Array, beta_count: Array,
                 prior: Array) -> Array:
  """The estimate after an iteration that examined `beta_count` positions.

  Each examined position moves the estimate by ALPHA_RATE toward the
  iteration's mean beta; an iteration that examined none pulls it by
  PRIOR_PULL toward the prior.

  Args:
    alpha: float32 [batch].
    beta_sum: float32 [batch] sum of beta over the examined positions.
    beta_count: int32 [batch] examined positions.
    prior: float32 [] the pair's estimate.

  Returns:
    float32 [batch].
  """
  seen = beta_count > 0
  mean = beta_sum / jnp.maximum(beta_count, 1).astype(jnp.float32)
  keep = (1.0 - ALPHA_RATE) ** beta_count.astype(jnp.float32)
  observed = keep * alpha + (1.0 - keep) * mean
  drifted = alpha + PRIOR_PULL * (prior - alpha)
  return jnp.where(seen, observed, drifted)


def predicted_speedup(expected: Array, cost: Array) -> Array:
  """Tokens the rule expected per target step over its iterations: its
  predicted speedup over plain steps (NaN for a row that never ran)."""
  return jnp.where(cost > 0, expected / jnp.where(cost > 0, cost, 1.0),
                   jnp.nan)
