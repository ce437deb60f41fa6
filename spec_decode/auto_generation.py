"""gamma='auto' on the host: what the in-loop rule reads, and which program
runs a call.

Before a call: the pair's measured costs (`costs.cost_profile`) and its kept
acceptance as the rule's prior, made into the rule's inputs once per value;
the program's size, where the caller leaves max_gamma to the costs (the most
proposals they ever favour, `default_max_gamma`); whether the call
speculates at all, from its predicted speedup at the pair's usual output
length (a call that does not runs the baseline's program). After a call:
its betas and its rows' lengths, kept to add to the pair's figures when they
are next read (`acceptance.record_result`: not waited for inside the call).
The rule itself runs inside the compiled loop (`spec_decode.adaptive`,
`spec_decode.speculative`).
"""

import functools
from typing import Any, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import acceptance
from spec_decode import adaptive
from spec_decode import compile as compile_lib
from spec_decode import costs
from spec_decode import decoding
from spec_decode import multihost_agreement
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode.decoding import DecodeResult
from spec_decode.model import Model
from spec_decode.model import encoder_widths

Array = jax.Array


def baseline_args(model: Model, tokens: Any, rng: Array,
                  max_decode_len: int, sampling: sampling_lib.SamplingConfig,
                  eos_id: int) -> Tuple[Any, ...]:
  """`decoding.baseline_generate`'s arguments for `model` (its call and its
  ahead-of-time compile must see the same ones)."""
  return (model.config, model.device_params, tokens, rng, max_decode_len,
          sampling, eos_id, model.partitioning, model.decode_kernels)


def auto_prior(model: Model, draft: Model, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0) -> Optional[float]:
  """The alpha gamma='auto' starts every row from for this pair and
  sampling (the last runs' mean beta, kept beside the measured costs, on
  the rule's grid), or None before any run."""
  sampling = sampling_lib.SamplingConfig(temperature, top_k, top_p)
  kept = acceptance.acceptance_prior(model, draft, sampling)
  return None if kept is None else _on_prior_grid(kept)


# The grid the pair's kept acceptance is rounded to as the rule's prior.
PRIOR_GRID = 256


def _on_prior_grid(alpha: float) -> float:
  """`alpha` to the nearest multiple of 1 / PRIOR_GRID.

  The rule's inputs are cached by value (their device copies, whether rows
  would propose), and the kept mean moves after every call that proposed,
  by far less than its own noise: on the grid, those calls reuse them
  instead of paying host and device round trips again (0.6-0.7 ms a call
  on a 2-core Xeon, 3% of a short output's).
  """
  return round(alpha * PRIOR_GRID) / PRIOR_GRID


class _RuleCosts(NamedTuple):
  """The profile's figures the rule reads, in baseline iterations."""
  iteration_cost: Tuple[float, ...]  # 0 (a plain step) .. max_gamma
  call_cost: float
  call_extra_cost: float


@functools.lru_cache(maxsize=64)
def _rule_costs(profile: costs.CostProfile, greedy: bool) -> _RuleCosts:
  """The rule's costs for greedy or sampled calls: a plain step of the
  speculative loop, then iterations of 1 .. the profile's max_gamma
  proposals; what a call spends once."""
  return _RuleCosts(
      (profile.plain_cost(greedy),) + tuple(
          profile.iteration_cost(g, greedy)
          for g in range(1, profile.max_gamma + 1)),
      profile.call_cost(greedy), profile.call_extra_cost(greedy))


# The highest acceptance a row's estimate is taken to reach when sizing
# gamma='auto''s program by default (`default_max_gamma`): counts that pay
# only above it would gain little there, and every count the program can
# choose costs each of its iterations something (its buffers and its call
# width's loop).
ALPHA_CEILING = 0.95


@functools.lru_cache(maxsize=64)
def _most_chosen_count(rule_costs: _RuleCosts) -> int:
  """The largest count the rule picks at any estimate up to ALPHA_CEILING
  (at least 1)."""
  alphas = np.linspace(0.0, ALPHA_CEILING, 191, dtype=np.float32)
  most = len(rule_costs.iteration_cost) - 1
  counts, _, _ = adaptive.choose_counts(
      alphas, np.full(alphas.shape, most + 1, np.int32),
      np.ones(alphas.shape, np.bool_),
      adaptive.ProposalCosts.create(rule_costs.iteration_cost, 0.5))
  return max(1, int(np.max(counts)))


def default_max_gamma(profile: costs.CostProfile, greedy: bool) -> int:
  """The most tokens gamma='auto' lets a row propose when `generate` is not
  given max_gamma: the largest count its rule chooses under the profile's
  costs for any estimate up to ALPHA_CEILING (1 .. the profile's max_gamma).

  Where a call scoring 8 tokens costs twice one scoring 4 (a 2-core CPU),
  that is 3; where the K-curve is flat (accelerators), the profile's 7.
  A program able to propose 7 spent 1.2-5.2% more per token (median 1.9%,
  five paired runs) than one able to propose 3, making the same choices,
  on the shipped pair (2-core AMX Xeon, 2026-12-07; scripts/README.md,
  auto_gamma.py).

  Args:
    profile: The pair's measured costs (`costs.cost_profile`).
    greedy: Greedy calls or sampled ones (their costs differ).
  """
  return _most_chosen_count(_rule_costs(profile, greedy))


def _trimmed(rule_costs: _RuleCosts, max_gamma: int) -> _RuleCosts:
  """The rule's costs for counts 0 .. max_gamma."""
  return rule_costs._replace(
      iteration_cost=rule_costs.iteration_cost[:max_gamma + 1])


@functools.lru_cache(maxsize=256)
def _would_propose(rule_costs: _RuleCosts, alpha_prior: float,
                   min_gain: float, output_length: int) -> bool:
  """Whether a call speculates at all (`adaptive.ever_proposes`, one small
  compiled program), before the call; asked once per costs, prior and
  length, which change only after calls that speculated."""
  return bool(adaptive.ever_proposes(
      _proposal_costs(rule_costs, alpha_prior, min_gain),
      np.float32(output_length)))


@functools.lru_cache(maxsize=64)
def _proposal_costs(rule_costs: _RuleCosts, alpha_prior: float,
                    min_gain: float) -> adaptive.ProposalCosts:
  """The rule's inputs as device arrays, made once per value: the costs
  and the prior change only after calls that proposed, and NumPy arguments
  are copied to the device again at every call."""
  return jax.tree_util.tree_map(jnp.asarray, adaptive.ProposalCosts.create(
      rule_costs.iteration_cost, alpha_prior, min_gain, rule_costs.call_cost,
      rule_costs.call_extra_cost))


def proposal_costs(profile: costs.CostProfile, greedy: bool,
                   alpha_prior: float, min_gain: Optional[float] = None,
                   max_gamma: Optional[int] = None) -> adaptive.ProposalCosts:
  """What the in-loop rule reads for a pair's measured costs and a prior,
  as `generate` passes it (min_gain None: `adaptive.MIN_GAIN`; max_gamma
  None: `default_max_gamma`)."""
  if max_gamma is None:
    max_gamma = default_max_gamma(profile, greedy)
  return _proposal_costs(_trimmed(_rule_costs(profile, greedy), max_gamma),
                         alpha_prior,
                         adaptive.MIN_GAIN if min_gain is None else min_gain)


def _output_length(kept: Optional[float], max_decode_len: int) -> int:
  """The tokens a row of this call is expected to emit: the pair's usual
  output length `kept` (whole tokens, so calls share the cached answers),
  else the call's limit; at most the limit."""
  return max(1, min(max_decode_len,
                    max_decode_len if kept is None else round(kept)))


# gamma='auto' calls (by what their programs depend on) whose baseline
# program is compiled: see `auto_generate`.
_BASELINE_READY = set()


@functools.partial(compile_lib.decoder_jit, static_argnums=(0, 4, 5, 7, 9))
def _baseline_as_auto(config, params, encoder_input_tokens, rng,
                      max_decode_len, sampling, eos_id, partitioning,
                      prepared, max_gamma: int) -> DecodeResult:
  """A baseline decode reported as gamma='auto' whose rows chose 0 at every
  iteration: proposal_counts [batch, max_gamma + 1], a predicted speedup
  of 1 (the baseline's own steps), gamma = max_gamma.

  The baseline's loop and the report are one program: a second program
  for the report cost a dispatch waiting on the decode's outputs, 0.2-0.6
  ms per call on a 2-core Xeon, 1-3% of a short output's decode.
  """
  result = decoding.baseline_generate.__wrapped__(
      config, params, encoder_input_tokens, rng, max_decode_len, sampling,
      eos_id, partitioning, prepared)
  steps = result.lengths.astype(jnp.float32)
  return result.replace(
      proposal_counts=jnp.pad(result.proposal_counts,
                              ((0, 0), (0, max_gamma))),
      predicted_speedup=adaptive.predicted_speedup(steps, steps),
      gamma=max_gamma)


def _process_zero_figures(prior: Optional[float], length: Optional[float]
                          ) -> Tuple[Optional[float], Optional[float]]:
  """The kept figures, process 0's on every process of a multi-host slice
  (each keeps its own; the rule's inputs and the program must agree)."""
  if not multihost_agreement.is_multihost():
    return prior, length
  agreed = multihost_agreement.process_zero_values(
      [np.nan if value is None else value for value in (prior, length)])
  return tuple(None if np.isnan(value) else float(value) for value in agreed)


def auto_generate(model: Model, draft: Model, tokens: Array, rng: Array,
                  max_decode_len: int, sampling: sampling_lib.SamplingConfig,
                  eos_id: int, max_gamma: Optional[int], min_gain: float,
                  **options) -> DecodeResult:
  """Speculative decoding whose proposal counts the loop chooses.

  A call predicted not to gain the margin by speculating
  (`adaptive.ever_proposes`) is a baseline decode, so the baseline's loop
  runs it (`_baseline_as_auto`): the same outputs for the same rng, and a
  lighter program to dispatch than the speculative one (no draft
  parameters). The first call that runs the speculative program also
  compiles that one, so a prior that later falls below the margin never
  compiles in the middle of a run. (The prior and the usual length move
  only after calls that proposed.)

  Args:
    model: The target, placed as `generate` places it.
    draft: The draft.
    tokens: int32 [batch, enc_len] encoder inputs.
    rng: The call's key.
    max_decode_len: Output limit.
    sampling: Temperature, top-k and top-p of both models.
    eos_id: End-of-sequence id.
    max_gamma: The most tokens a row proposes in an iteration; None:
      `default_max_gamma` of the pair's profile at `costs.DEFAULT_MAX_GAMMA`.
    min_gain: The margin over baseline decoding the call's predicted
      speedup must clear for it to speculate (`adaptive.MIN_GAIN` by
      default in `generate`).
    **options: `speculative.speculative_generate`'s verification options.

  Returns:
    The `DecodeResult`, gamma = the max_gamma used.
  """
  profile = costs.cost_profile(model, draft, tokens.shape[0],
                               max_gamma or costs.DEFAULT_MAX_GAMMA)
  prior, kept_length = _process_zero_figures(
      *acceptance.kept_figures(model, draft, sampling))
  rule_costs = _rule_costs(profile, sampling.greedy)
  if max_gamma is None:
    max_gamma = _most_chosen_count(rule_costs)
  rule_costs = _trimmed(rule_costs, max_gamma)
  alpha_prior = _on_prior_grid(acceptance.DEFAULT_ALPHA_PRIOR if prior is None
                               else prior)
  proposal_costs = _proposal_costs(rule_costs, alpha_prior, min_gain)
  plain_args = baseline_args(model, tokens, rng, max_decode_len, sampling,
                             eos_id)
  if not _would_propose(rule_costs, alpha_prior, min_gain,
                        _output_length(kept_length, max_decode_len)):
    return _baseline_as_auto(*plain_args, max_gamma)
  # Each trimming setting has its own programs (`compile.decoder_jit`).
  signature = (id(model), id(draft), tokens.shape, max_decode_len, sampling,
               max_gamma, encoder_widths.enabled())
  if signature not in _BASELINE_READY:
    _baseline_as_auto.lower(*plain_args, max_gamma).compile()
    _BASELINE_READY.add(signature)
  result = speculative.speculative_generate(
      model, draft, tokens, rng=rng, max_decode_len=max_decode_len,
      sampling=sampling, eos_id=eos_id, gamma=max_gamma,
      proposal_costs=proposal_costs, **options)
  acceptance.record_result(model, draft, sampling, result)
  return result
