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
    (`costs.CostProfile.iteration_cost`). g = 0 is a plain target step in
    this loop (1 token for its measured cost, a little over a baseline
    step). Each row takes the count of the highest rate: inside a call
    that speculates, a row that proposes nothing still pays the loop's
    plain step, so no margin belongs here.
  * Whether a call speculates at all is decided once, before it
    (`ever_proposes`): the call's predicted speedup over baseline
    decoding, at the prior and the pair's usual output length, with what
    a call spends once (its encoder pass and set-up, and what the
    speculative program adds to them) priced in, must clear the margin
    `min_gain`. Below it the call is a baseline decode.
  * The target's call width is the smallest of a few compiled widths
    (`chunk_widths`) covering every row's g + 1; the speculative loop runs
    each width as a loop of its own for as long as the choices keep to it.
    The rule prices each g at the width it would run at.

Why this stays exact: a row's count is fixed before its draft proposes,
from tokens already emitted; any count is a valid speculative step
(positions past it are never accepted and the token after a fully accepted
block is the bonus from p, as with `draft_stop`). The costs, the prior and
the margin are traced arrays, so one compiled program serves every choice.
"""

from typing import Any, List, Optional, Sequence, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode.model import shift_right

Array = jax.Array

# How fast a row's estimate follows its own betas (weight of one examined
# position), and how fast an estimate nobody feeds drifts back to the prior
# (per iteration without a proposal). A row leaves the prior's choice on
# some twenty positions of evidence, not on one rejection: on the shipped
# pair a row's last few betas said nothing of its next ones, and at 0.15 a
# single rejection turned rows to 1 proposal where 3 paid more (2026-12-07,
# scripts/README.md, auto_gamma.py).
ALPHA_RATE = 0.05
PRIOR_PULL = 0.1
# A call speculates only when its predicted speedup over baseline decoding,
# its one-off costs included, clears this margin (`ever_proposes`). What
# the prediction still leaves out: a row's acceptance varies along its
# output (the prior is a mean), the draft catching up after plain steps,
# and the costs are medians on a shared machine. On a 2-core AMX Xeon
# (2026-12-07, fourth session; scripts/README.md, auto_gamma.py) greedy
# calls predicted ~1.2-1.25x measured 1.03-1.22x on the main job's data and
# 1.08-1.16x on unseen text, 0.95-0.96 of the best fixed gamma; sampled
# calls (predicted ~1.0x) and batch 8 ran as baseline decodes (0.99-1.00x).
# (Where speculation pays by the paper's margins, on accelerators,
# predictions are 2-3x: the margin does not bind.)
MIN_GAIN = 1.1


@flax.struct.dataclass
class ProposalCosts:
  """What the rule reads, traced: changing them never recompiles.

  Attributes:
    iteration_cost: float32 [max_gamma + 1]: an iteration proposing g
      tokens, in baseline iterations, as timed at the call width it runs
      at (`costs.CostProfile.iteration_cost`); [0] is a plain step of the
      speculative loop (`costs.CostProfile.plain_cost`).
    alpha_prior: float32 []: the estimate every row starts from.
    min_gain: float32 []: the margin a call's predicted speedup over
      baseline decoding must clear for it to speculate.
    call_cost: float32 []: what a baseline call spends once, beyond its
      iterations, in baseline iterations (`costs.CostProfile.call_cost`).
    call_extra_cost: float32 []: what a speculating call spends once
      beyond that (`costs.CostProfile.call_extra_cost`).
  """
  iteration_cost: Array
  alpha_prior: Array
  min_gain: Array
  call_cost: Array
  call_extra_cost: Array

  @classmethod
  def create(cls, iteration_cost: Sequence[float], alpha_prior: float,
             min_gain: Optional[float] = None, call_cost: float = 0.0,
             call_extra_cost: float = 0.0) -> 'ProposalCosts':
    """The rule's inputs as arrays; min_gain None reads `MIN_GAIN` now."""
    # NumPy arrays: they reach the device with the call's other arguments
    # instead of as separate transfers before it, on every call.
    return cls(iteration_cost=np.asarray(iteration_cost, np.float32),
               alpha_prior=np.asarray(alpha_prior, np.float32),
               min_gain=np.asarray(MIN_GAIN if min_gain is None else min_gain,
                                   np.float32),
               call_cost=np.asarray(call_cost, np.float32),
               call_extra_cost=np.asarray(call_extra_cost, np.float32))


def forced_costs(count: int, max_gamma: int) -> ProposalCosts:
  """Costs under which every row proposes `count` tokens at every iteration
  where it may still emit more than `count` (and 0 after): how
  `benchmark.loop_iteration_seconds` times what an iteration of
  gamma='auto''s own loop costs at a count (0: plain steps in that loop).

  Args:
    count: Proposals per iteration, 0 .. max_gamma.
    max_gamma: The loop's largest count.
  """
  if not 0 <= count <= max_gamma:
    raise ValueError(f'count must be in [0, max_gamma={max_gamma}], got '
                     f'{count}.')
  # Only `count` (and a plain step where it cannot be used) is cheap: its
  # rate beats every other count's by orders of magnitude.
  iteration_cost = np.full((max_gamma + 1,), 1e6, np.float32)
  iteration_cost[0] = 1e3
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
  # The first highest: on a tie, fewer proposals.
  best = jnp.argmax(rate, axis=-1).astype(jnp.int32)
  chosen = jnp.where(active, best, 0)
  pick = lambda table: jnp.take_along_axis(
      jnp.broadcast_to(table, rate.shape), chosen[:, None], axis=1)[:, 0]
  return chosen, pick(tokens), pick(cost)


def call_speedup(costs: ProposalCosts, output_length: Array) -> Array:
  """float32 []: the speedup over baseline decoding the rule predicts for
  a call whose rows start from the prior and emit `output_length` tokens.

  A baseline call spends `call_cost` once and one iteration per token; a
  speculating call spends `call_extra_cost` more once, then its rows'
  first choice at the prior (the iteration cost over the expected tokens
  per iteration) per token. 1 where the rows would not propose.

  Args:
    costs: The measured costs and the prior.
    output_length: float32 [] tokens a row emits (> 0).
  """
  length = jnp.maximum(jnp.asarray(output_length, jnp.float32), 1.0)
  counts, tokens, cost = choose_counts(
      costs.alpha_prior[None], jnp.ceil(length).astype(jnp.int32)[None],
      jnp.ones((1,), jnp.bool_), costs)
  baseline = costs.call_cost + length
  speculating = (costs.call_cost + costs.call_extra_cost
                 + length * cost[0] / tokens[0])
  return jnp.where(counts[0] > 0, baseline / speculating, 1.0)


@jax.jit
def ever_proposes(costs: ProposalCosts, output_length: Array) -> Array:
  """bool []: whether a call speculates at all.

  Its predicted speedup (`call_speedup`) must clear `costs.min_gain`.
  Otherwise the call is a baseline decode, and `speculative` runs it as
  one: no row would gain enough from proposing to pay for what
  speculating costs the call once.

  Jitted (the length traced, so one program serves every call): `generate`
  asks before every gamma='auto' call, and as a dozen eager ops, each
  waited for, the question cost ~3 ms, a sixth of a short output's decode.

  Args:
    costs: The measured costs and the prior.
    output_length: float32 [] tokens a row is expected to emit (the pair's
      usual output length, at most the call's limit).
  """
  return call_speedup(costs, output_length) > costs.min_gain


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


def greedy_agreement(draft: Any, encoder_input_tokens: Any, result: Any
                     ) -> List[np.ndarray]:
  """What `replay_greedy` reads, per row of a greedy decode.

  Args:
    draft: The draft `Model`.
    encoder_input_tokens: int [batch, enc_len] the call's inputs.
    result: The call's `DecodeResult` (greedy; baseline or speculative,
      the same outputs).

  Returns:
    Per row, bool [length]: whether the draft's argmax, teacher-forced
    along the row's output (one call for the batch: positions past a row's
    end change nothing before it), is the output's token there.
  """
  tokens = np.asarray(result.tokens)
  logits = draft.logits(encoder_input_tokens, shift_right(tokens))
  agrees = np.argmax(np.asarray(logits), axis=-1) == tokens
  return [agrees[row, :int(length)]
          for row, length in enumerate(np.asarray(result.lengths))]


def replay_greedy(agrees: np.ndarray, costs: ProposalCosts,
                  max_decode_len: int, count: Optional[int] = None
                  ) -> np.ndarray:
  """The iterations a greedy row makes, replayed on the host.

  Under greedy decoding a proposal is accepted exactly when the draft's
  argmax agrees with the target's output at its position, and a row's
  betas are 1 where accepted and 0 where rejected; so where the two agree
  along the row's output decides every iteration the loop makes for it:
  its own choices (`choose_counts`, `update_alpha`), or with every
  iteration proposing `count` tokens (a plain step once no more than
  `count` can still be emitted, as under `forced_costs`). Policies can so
  be compared exactly, by the costs the rule reads, without timing
  (`scripts/auto_gamma.py --simulate`).

  Args:
    agrees: bool [length] per position of the row's output (which ends at
      EOS or max_decode_len): whether the draft's argmax, teacher-forced
      along the output, is the output's token (`greedy_agreement`).
    costs: The rule's inputs, as the loop got them.
    max_decode_len: The call's output limit.
    count: None for the rule's choices, else proposals per iteration.

  Returns:
    int64 [max_gamma + 1]: the row's iterations per proposal count (the
    loop's `DecodeResult.proposal_counts` row).
  """
  max_gamma = costs.iteration_cost.shape[0] - 1
  histogram = np.zeros(max_gamma + 1, np.int64)
  alpha = np.full((1,), costs.alpha_prior, np.float32)
  emitted = 0
  while emitted < len(agrees):
    remaining = max_decode_len - emitted
    if count is None:
      chosen = int(choose_counts(alpha, np.asarray([remaining], np.int32),
                                 np.ones((1,), np.bool_), costs)[0][0])
    else:
      chosen = count if count < remaining else 0
    accepted = 0
    while (accepted < chosen and emitted + accepted < len(agrees)
           and agrees[emitted + accepted]):
      accepted += 1
    # A rejected proposal is examined too (beta 0); none past it.
    alpha = np.asarray(update_alpha(
        alpha, np.asarray([accepted], np.float32),
        np.asarray([min(accepted + 1, chosen)], np.int32),
        costs.alpha_prior))
    histogram[chosen] += 1
    emitted += accepted + 1
  return histogram


def predicted_speedup(expected: Array, cost: Array) -> Array:
  """Tokens the rule expected per target step over its iterations: its
  predicted speedup over plain steps (NaN for a row that never ran)."""
  return jnp.where(cost > 0, expected / jnp.where(cost > 0, cost, 1.0),
                   jnp.nan)
