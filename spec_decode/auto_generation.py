"""gamma='auto' on the host: what the in-loop rule reads, and which program
runs a call.

Before a call: the pair's measured costs (`costs.cost_profile`) and its kept
acceptance as the rule's prior, made into the rule's inputs once per value;
whether the call's rows would propose at all (a call that never would runs
the baseline's program). After a call that proposed: its betas added to the
pair's kept acceptance. The rule itself runs inside the compiled loop
(`spec_decode.adaptive`, `spec_decode.speculative`).
"""

import functools
from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import adaptive
from spec_decode import compile as compile_lib
from spec_decode import costs
from spec_decode import decoding
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
  kept = costs.acceptance_prior(model, draft, sampling)
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


@functools.lru_cache(maxsize=64)
def _iteration_costs(profile: costs.CostProfile,
                     greedy: bool) -> Tuple[float, ...]:
  """The rule's iteration costs, 0 .. the profile's max_gamma proposals."""
  return tuple(profile.iteration_cost(g, greedy)
               for g in range(profile.max_gamma + 1))


@functools.lru_cache(maxsize=256)
def _would_propose(iteration_cost: Tuple[float, ...], alpha_prior: float,
                   min_gain: float, max_decode_len: int) -> bool:
  """Whether a call's rows would propose at all (`adaptive.ever_proposes`,
  one small compiled program), before the call; asked once per costs and
  prior, which change only after calls that proposed."""
  return bool(adaptive.ever_proposes(
      adaptive.ProposalCosts.create(iteration_cost, alpha_prior, min_gain),
      max_decode_len))


@functools.lru_cache(maxsize=64)
def _proposal_costs(iteration_cost: Tuple[float, ...], alpha_prior: float,
                    min_gain: float) -> adaptive.ProposalCosts:
  """The rule's inputs as device arrays, made once per value: the costs
  and the prior change only after calls that proposed, and NumPy arguments
  are copied to the device again at every call."""
  return jax.tree_util.tree_map(jnp.asarray, adaptive.ProposalCosts.create(
      iteration_cost, alpha_prior, min_gain))


# gamma='auto' calls (by what their programs depend on) whose baseline
# program is compiled: see `auto_generate`.
_BASELINE_READY = set()


@functools.partial(compile_lib.decoder_jit, static_argnums=(0, 4, 5, 7, 9))
def _baseline_as_auto(config, params, encoder_input_tokens, rng,
                      max_decode_len, sampling, eos_id, partitioning,
                      prepared, max_gamma: int,
                      proposal_costs: adaptive.ProposalCosts) -> DecodeResult:
  """A baseline decode reported as gamma='auto' whose rows chose 0 at every
  iteration: proposal_counts [batch, max_gamma + 1], the rule's predicted
  speedup of plain steps, gamma = max_gamma.

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
      predicted_speedup=adaptive.predicted_speedup(
          steps, steps * proposal_costs.iteration_cost[0]),
      gamma=max_gamma)


def auto_generate(model: Model, draft: Model, tokens: Array, rng: Array,
                  max_decode_len: int, sampling: sampling_lib.SamplingConfig,
                  eos_id: int, max_gamma: int, min_gain: float,
                  **options) -> DecodeResult:
  """Speculative decoding whose proposal counts the loop chooses.

  A call whose rows would never propose (`adaptive.ever_proposes`) is a
  baseline decode, so the baseline's loop runs it (`_baseline_as_auto`):
  the same outputs for the same rng, and a lighter program to dispatch
  than the speculative one (no draft parameters). The first call that runs
  the speculative program also compiles that one, so a prior that later
  falls below the rule's margin never compiles in the middle of a run.
  (The prior moves only after calls that proposed.)

  Args:
    model: The target, placed as `generate` places it.
    draft: The draft.
    tokens: int32 [batch, enc_len] encoder inputs.
    rng: The call's key.
    max_decode_len: Output limit.
    sampling: Temperature, top-k and top-p of both models.
    eos_id: End-of-sequence id.
    max_gamma: The most tokens a row proposes in an iteration.
    min_gain: The rule's margin over a plain step (`adaptive.MIN_GAIN` by
      default in `generate`).
    **options: `speculative.speculative_generate`'s verification options.

  Returns:
    The `DecodeResult`, gamma = max_gamma.
  """
  profile = costs.cost_profile(model, draft, tokens.shape[0], max_gamma)
  prior = costs.acceptance_prior(model, draft, sampling)
  iteration_cost = _iteration_costs(profile, sampling.greedy)
  alpha_prior = _on_prior_grid(costs.DEFAULT_ALPHA_PRIOR if prior is None
                               else prior)
  proposal_costs = _proposal_costs(iteration_cost, alpha_prior, min_gain)
  plain_args = baseline_args(model, tokens, rng, max_decode_len, sampling,
                             eos_id)
  if not _would_propose(iteration_cost, alpha_prior, min_gain,
                        max_decode_len):
    return _baseline_as_auto(*plain_args, max_gamma, proposal_costs)
  # Each trimming setting has its own programs (`compile.decoder_jit`).
  signature = (id(model), id(draft), tokens.shape, max_decode_len, sampling,
               max_gamma, encoder_widths.enabled())
  if signature not in _BASELINE_READY:
    _baseline_as_auto.lower(*plain_args, max_gamma,
                            proposal_costs).compile()
    _BASELINE_READY.add(signature)
  result = speculative.speculative_generate(
      model, draft, tokens, rng=rng, max_decode_len=max_decode_len,
      sampling=sampling, eos_id=eos_id, gamma=max_gamma,
      proposal_costs=proposal_costs, **options)
  verified = np.asarray(result.verified_positions)
  if verified.any():  # A call whose rows never proposed observed nothing.
    # Rows that examined nothing have a NaN mean and count 0.
    betas = np.where(verified > 0, np.asarray(result.mean_beta), 0.0)
    costs.record_acceptance(model, draft, sampling,
                            float(np.dot(betas, verified)),
                            int(verified.sum()))
  return result
