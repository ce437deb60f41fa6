"""Sweeps of one Table 2 row: gamma, batch size, lenience, the
verification comparison (token vs block verification x fixed vs adaptive
draft length) and several candidates per row.

Each point is a full `reproduce.measure_row`: baseline and speculative
decoding interleaved after compilation, with the row's own costs.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import numpy as np

from spec_decode import benchmark
from spec_decode import candidate_analysis
from spec_decode import reproduce


@dataclasses.dataclass(frozen=True)
class Sweep:
  """Speedup of one row as gamma, the batch size or the lenience varies.

  Attributes:
    row: The row to vary.
    gammas: Draft lengths to try (gamma sweep).
    batch_sizes: Batch sizes to try (batch sweep).
    leniences: Lenience values to try (lenience trade-off, paper Table 5).
    lenience_temperature: Temperature of the lenience sweep. Lenience
      changes nothing under greedy decoding (p and q are one-hot, so a
      mismatched draft token has p = 0 however lenient the rule), so it is
      swept while sampling.
  """
  row: reproduce.ComparisonRow
  gammas: Tuple[int, ...] = (1, 2, 3, 4, 5, 7, 10)
  batch_sizes: Tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
  leniences: Tuple[float, ...] = (1.0, 0.5, 0.3, 0.1)
  lenience_temperature: float = 1.0

  def describe(self) -> str:
    return self.row.describe()


OnRow = Optional[Callable[[Dict[str, Any]], None]]


def measure_rows(rows: Sequence[reproduce.ComparisonRow],
                 on_row: OnRow = None) -> List[Dict[str, Any]]:
  """`reproduce.measure_row` of each row, reporting each as it ends.

  Args:
    rows: The settings to measure, in order.
    on_row: Called with each result (e.g. to print progress and time left).

  Returns:
    The results, in order.
  """
  results = []
  for row in rows:
    results.append(reproduce.measure_row(row))
    if on_row is not None:
      on_row(results[-1])
  return results


def gamma_sweep(sweep: Sweep, on_row: OnRow = None) -> List[Dict[str, Any]]:
  """Measured speedup per gamma, next to the predicted curve.

  Each row measures its own c and verification cost (`measure_row`), since
  the cost of scoring gamma + 1 tokens grows with gamma.
  """
  return measure_rows([dataclasses.replace(sweep.row, gamma=gamma)
                       for gamma in sweep.gammas], on_row)


def batch_sweep(sweep: Sweep, on_row: OnRow = None) -> List[Dict[str, Any]]:
  """Measured speedup per batch size: where speculation stops paying.

  Each row measures c and the verification cost on its own first batch
  (`measure_row`), since both change as the batch grows.
  """
  return measure_rows([dataclasses.replace(
      sweep.row, batch_size=batch_size,
      num_examples=max(sweep.row.num_examples, batch_size))
                       for batch_size in sweep.batch_sizes], on_row)


def lenience_sweep(sweep: Sweep, on_row: OnRow = None
                   ) -> List[Dict[str, Any]]:
  """Alpha and speedup per lenience (lossy below 1)."""
  return measure_rows([dataclasses.replace(
      sweep.row, lenience=lenience, temperature=sweep.lenience_temperature)
                       for lenience in sweep.leniences], on_row)


def crossing_batch_size(rows: Sequence[Dict[str, Any]]) -> Optional[int]:
  """The smallest batch size at which speculation no longer pays."""
  for row in sorted(rows, key=lambda r: r['batch_size']):
    if row['measured_speedup'] < 1.0:
      return int(row['batch_size'])
  return None


@dataclasses.dataclass(frozen=True)
class VerificationComparison:
  """Token vs block verification, each with a fixed and an adaptive draft
  length, on several rows (tasks x temperatures) and batch sizes.

  Attributes:
    rows: The rows to vary (their gamma is the fixed draft length and the
      adaptive rule's maximum).
    batch_sizes: Batch sizes to try.
    verifications: Verification rules.
    draft_stop: The adaptive rule: ('confidence' or 'entropy', threshold).
    adaptive_gamma: The adaptive rule's most proposals per iteration (it
      stops sooner when unsure, so it can afford more than the fixed
      gamma); None uses the row's gamma.
    seeds: Sampling seeds of `block_gain` (tokens per call, no timing).
    gain_examples: Inputs per seed and rule in `block_gain`.
    gain_batch_size: Rows decoded together in `block_gain` (acceptance
      is a per-row figure; a larger batch only makes counting faster).
  """
  rows: Tuple[reproduce.ComparisonRow, ...]
  batch_sizes: Tuple[int, ...] = (1, 8)
  verifications: Tuple[str, ...] = ('token', 'block')
  draft_stop: Tuple[str, float] = ('confidence', 0.4)
  adaptive_gamma: Optional[int] = None
  seeds: Tuple[int, ...] = (0, 1, 2, 3, 4)
  gain_examples: int = 64
  gain_batch_size: int = 16

  def describe(self) -> str:
    return '\n'.join(row.describe() for row in self.rows)

  def draft_lengths(self, row: reproduce.ComparisonRow
                    ) -> List[reproduce.ComparisonRow]:
    """`row` with its fixed gamma, then with the adaptive rule."""
    stop_rule, threshold = self.draft_stop
    return [row, dataclasses.replace(
        row, gamma=self.adaptive_gamma or row.gamma, draft_stop=stop_rule,
        draft_threshold=threshold)]

  def settings(self) -> List[reproduce.ComparisonRow]:
    """Every (row, batch size, verification, draft length) to measure."""
    settings = []
    for row in self.rows:
      for batch_size in self.batch_sizes:
        sized = dataclasses.replace(
            row, batch_size=batch_size,
            num_examples=max(row.num_examples, 2 * batch_size))
        for verification in self.verifications:
          for setting in self.draft_lengths(sized):
            settings.append(dataclasses.replace(setting,
                                                verification=verification))
    return settings


def draft_length_label(row: reproduce.ComparisonRow) -> str:
  """'fixed 4' or 'adaptive (confidence 0.4, <= 6)'."""
  if row.draft_stop:
    return (f'adaptive ({row.draft_stop} {row.draft_threshold}, '
            f'<= {row.gamma})')
  return f'fixed {row.gamma}'


def verification_comparison(comparison: VerificationComparison,
                            on_row: OnRow = None) -> List[Dict[str, Any]]:
  """Measures every setting; adds 'task' and 'draft_length' labels.

  Args:
    comparison: What to measure.
    on_row: Called with each result as it is measured (progress).

  Returns:
    One `measure_row` dict per setting.
  """
  settings = comparison.settings()

  def label(result: Dict[str, Any]) -> None:
    row = settings[label.done]
    label.done += 1
    result['task'] = row.data.task
    result['draft_length'] = draft_length_label(row)
    if on_row is not None:
      on_row(result)

  label.done = 0
  return measure_rows(settings, label)


def block_gain(comparison: VerificationComparison,
               on_row: OnRow = None) -> List[Dict[str, Any]]:
  """Tokens per target call, block vs token verification, seed by seed.

  Counts only (no timing), so it affords more inputs and seeds than the
  timed comparison: every sampled row (temperature > 0) of `comparison`, at
  each of its draft lengths, decodes `gain_examples` inputs under each rule
  with the same seeds. Greedy rows are left out: there both rules accept
  exactly the tokens that match the target's argmax.

  Args:
    comparison: The rows, draft lengths, seeds and sizes.
    on_row: Called with each (setting, seed) result as it is measured.

  Returns:
    One dict per (row, draft length, seed): `token` and `block` tokens per
    target call and `block_gain` (block minus token); then one summary per
    (row, draft length), seed 'mean', with the means, `block_gain_std`
    (standard deviation across seeds) and `seeds_block_ahead`.
  """
  per_seed, summaries = [], []
  for row in comparison.rows:
    if row.temperature <= 0:
      continue
    for setting in comparison.draft_lengths(row):
      labels = {'task': row.data.task, 'temperature': row.temperature,
                'batch_size': comparison.gain_batch_size,
                'draft_length': draft_length_label(setting)}
      results = []
      for seed in comparison.seeds:
        counts = {
            verification: reproduce.acceptance(
                row.target, row.draft, row.data, row.temperature,
                gamma=setting.gamma, num_examples=comparison.gain_examples,
                batch_size=comparison.gain_batch_size,
                max_decode_len=row.max_decode_len, seed=seed,
                decode_options=dataclasses.replace(
                    setting, verification=verification).decode_options()
            )['tokens_per_target_call']
            for verification in ('token', 'block')}
        results.append({**labels, 'seed': seed, **counts,
                        'block_gain': counts['block'] - counts['token']})
        if on_row is not None:
          on_row(results[-1])
      gains = np.asarray([r['block_gain'] for r in results])
      summaries.append({
          **labels, 'seed': 'mean',
          'token': float(np.mean([r['token'] for r in results])),
          'block': float(np.mean([r['block'] for r in results])),
          'block_gain': float(gains.mean()),
          'block_gain_std': float(gains.std(ddof=1)) if len(gains) > 1
                            else 0.0,
          'seeds_block_ahead': int((gains > 0).sum())})
      per_seed.extend(results)
  return per_seed + summaries


@dataclasses.dataclass(frozen=True)
class CandidateComparison:
  """k candidate continuations per row x gamma, on several rows (tasks x
  temperatures) and batch sizes (`generate(..., num_candidates=k)`).

  Attributes:
    rows: The rows to vary (their gamma is replaced by each of `gammas`).
    batch_sizes: Batch sizes to time.
    num_candidates: Values of k (1: one draft sequence, the reference).
    gammas: Tokens per candidate.
    seeds: Sampling seeds of the counts-only repeat (sampled rows, first
      batch size): tokens per call seed by seed, for the spread.
    gain_examples: Inputs per seed in that repeat.
    gain_batch_size: Rows decoded together there.
  """
  rows: Tuple[reproduce.ComparisonRow, ...]
  batch_sizes: Tuple[int, ...] = (1, 8)
  num_candidates: Tuple[int, ...] = (1, 2, 4)
  gammas: Tuple[int, ...] = (1, 3)
  seeds: Tuple[int, ...] = (0, 1, 2, 3, 4)
  gain_examples: int = 32
  gain_batch_size: int = 16

  def describe(self) -> str:
    return '\n'.join(row.describe() for row in self.rows)

  def settings(self) -> List[reproduce.ComparisonRow]:
    """Every (row, batch size, gamma, k) to measure."""
    return [dataclasses.replace(row, batch_size=batch_size, gamma=gamma,
                                num_candidates=k,
                                num_examples=max(row.num_examples,
                                                 2 * batch_size))
            for row in self.rows for batch_size in self.batch_sizes
            for gamma in self.gammas for k in self.num_candidates]


def _predicted_tokens_per_call(summary: Dict[str, Any], gamma: int
                               ) -> float:
  """`candidate_analysis.expected_tokens_per_call` from a run's P_k (alpha
  for one candidate) and alpha."""
  first = summary['first_token_acceptance']
  alpha = summary['alpha_beta']
  return float(candidate_analysis.expected_tokens_per_call(
      alpha if first is None else first, alpha, gamma))


def candidate_comparison(comparison: CandidateComparison,
                         on_row: OnRow = None) -> List[Dict[str, Any]]:
  """Measures every setting of `comparison` against the analysis.

  Each setting is a timed `reproduce.measure_row` (baseline interleaved)
  with its own costs: c, and the target call at its width 1 + k gamma.
  Added: `predicted_tokens_per_call` (`candidate_analysis.
  expected_tokens_per_call` from the measured P_k, or alpha_beta for k = 1,
  and alpha_beta further along) against `accepted_per_target_call`, and
  `predicted_speedup_candidates`, those tokens over gamma c plus the
  call's measured cost (the k-row draft step taken at the cost of one
  row's). Sampled rows at the first batch size are also counted seed by
  seed: `seed_tokens_mean` / `seed_tokens_std` of accepted_per_target_call,
  and `seed_predicted_mean`, the prediction from each seed's own counts.

  Args:
    comparison: What to measure.
    on_row: Called with each result as it is measured.

  Returns:
    One dict per setting.
  """
  results = []
  group = None
  for setting in comparison.settings():
    if (setting.name, setting.batch_size) != group:
      # A new row or batch size shares no compiled program with the last
      # (sampling and shapes are static); dropping them keeps the process
      # under the kernel's limit on memory mappings: XLA:CPU maps each
      # program's code separately, and the 48 settings' several hundred
      # programs ended the run with "LLVM compilation error: Cannot
      # allocate memory" (vm.max_map_count 65530) half way through.
      jax.clear_caches()
      group = (setting.name, setting.batch_size)
    target, draft = reproduce.load_pair(setting.target, setting.draft,
                                        setting.mesh)
    enc, _ = setting.data.load(setting.num_examples)
    k, gamma = setting.num_candidates, setting.gamma
    costs = benchmark.measure_costs(
        target, draft, reproduce.timing_batches(enc, setting.batch_size)[0],
        k * gamma)
    result = reproduce.measure_row(setting, costs)
    predicted = _predicted_tokens_per_call(result, gamma)
    result.update(
        task=setting.data.task, width=1 + k * gamma,
        predicted_tokens_per_call=predicted,
        predicted_over_measured_tokens=(
            predicted / result['accepted_per_target_call']),
        predicted_speedup_candidates=predicted / (
            gamma * costs['c'] + costs['verify_cost']))
    if (setting.temperature > 0 and comparison.seeds
        and setting.batch_size == comparison.batch_sizes[0]):
      repeats = [reproduce.acceptance(
          setting.target, setting.draft, setting.data, setting.temperature,
          gamma=gamma, num_examples=comparison.gain_examples,
          batch_size=comparison.gain_batch_size,
          max_decode_len=setting.max_decode_len, seed=seed,
          decode_options=setting.decode_options())
                 for seed in comparison.seeds]
      counts = [r['accepted_per_target_call'] for r in repeats]
      # The same prediction from each repeat's own P_k and alpha: ten times
      # the timed run's inputs, so the closed form is held to less noise.
      predictions = [_predicted_tokens_per_call(r, gamma) for r in repeats]
      result.update(
          seed_tokens_mean=float(np.mean(counts)),
          seed_tokens_std=(float(np.std(counts, ddof=1))
                           if len(counts) > 1 else 0.0),
          seed_predicted_mean=float(np.mean(predictions)),
          seed_predicted_over_measured=float(
              np.mean(predictions) / np.mean(counts)))
    results.append(result)
    if on_row is not None:
      on_row(result)
  return results
