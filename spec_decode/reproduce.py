"""Reproducing the paper's comparisons: functions that return data.

Scripts (`scripts/reproduce_paper.py`, `scripts/sweep.py`) bind these dataclasses
from gin files in `configs/paper/` (TPU scale: T5X checkpoints, seqio tasks)
and `configs/local/` (CPU scale: the shipped models, the local tasks), print
the results and save them (`report`). Notebooks can call the same functions.
Models and inputs are named by `specs.ModelSpec` and `specs.DataSpec`.
"""

import dataclasses
from typing import (Any, Callable, Dict, List, Optional, Sequence, Tuple,
                    Union)

import jax
import numpy as np

from spec_decode import analysis
from spec_decode import benchmark
from spec_decode import generation
from spec_decode import partitioning
from spec_decode import specs
from spec_decode.decoding import DecodeResult
from spec_decode.model import Model


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
  """One row of Table 2: a target, a draft, a task and sampling settings.

  Attributes:
    name: Row label.
    target: The target model.
    draft: The draft model.
    data: Held-out inputs.
    temperature: 0 (greedy) or the sampling temperature.
    gamma: Draft tokens per iteration.
    batch_size: Rows decoded together.
    num_examples: Inputs decoded (in batches of `batch_size`).
    max_decode_len: Output limit.
    lenience: 1.0 is exact (appendix A.5 otherwise).
    paper_alpha: The paper's alpha for this row, if any (for the table).
    paper_speedup: The paper's speedup for this row, if any.
    mesh: How the models are laid out over devices (`specs.MeshSpec`;
      configs/partitioning/ binds it from NUM_PARTITIONS).
    verification: 'token' (the paper's rule) or 'block'.
    draft_stop: None, 'confidence' or 'entropy' (draft lengths that adapt).
    draft_threshold: The stop rule's threshold.
    num_candidates: Candidate continuations per row and iteration
      (`spec_decode.candidates`); 1 is one draft sequence.
  """
  name: str
  target: specs.ModelSpec
  draft: specs.ModelSpec
  data: specs.DataSpec
  temperature: float = 0.0
  gamma: int = 5
  batch_size: int = 1
  num_examples: int = 16
  max_decode_len: int = 48
  lenience: float = 1.0
  paper_alpha: Optional[float] = None
  paper_speedup: Optional[float] = None
  mesh: specs.MeshSpec = specs.MeshSpec()
  verification: str = 'token'
  draft_stop: Optional[str] = None
  draft_threshold: Optional[float] = None
  num_candidates: int = 1

  def decode_options(self) -> Dict[str, Any]:
    """The speculative-only `generate` options of this row."""
    return {'verification': self.verification, 'draft_stop': self.draft_stop,
            'draft_threshold': self.draft_threshold,
            'num_candidates': self.num_candidates}

  def describe(self) -> str:
    return '\n'.join([
        f'row {self.name}: T={self.temperature} gamma={self.gamma} '
        f'batch={self.batch_size} examples={self.num_examples}',
        f'  target: {self.target.describe()}',
        f'  draft:  {self.draft.describe()}',
        f'  data:   {self.data.describe()}'])


_MODELS: Dict[Any, Model] = {}


def load_pair(target: specs.ModelSpec, draft: specs.ModelSpec,
              mesh: specs.MeshSpec = specs.MeshSpec()) -> Tuple[Model, Model]:
  """Loads a target and draft laid out as `mesh.plans` says, each model
  once per (spec, partitioning) however many rows or drafts share it."""
  target_plan, draft_plan = mesh.plans(target)
  return _load_once(target, target_plan), _load_once(draft, draft_plan)


def _load_once(spec: specs.ModelSpec,
               plan: Optional[partitioning.Partitioning]) -> Model:
  if (spec, plan) not in _MODELS:
    _MODELS[spec, plan] = spec.load(plan)
  return _MODELS[spec, plan]


def timing_batches(enc: np.ndarray, batch_size: int) -> List[np.ndarray]:
  """Consecutive batches, padded as given (as T5X pads to a feature length).

  The decoders' encoder pass covers only a batch's used columns
  (`encoder_widths`), so every batch keeps one shape and the decoders
  compile once. (Trimming each batch's padding on the host instead, to a
  multiple of 16 columns, compiled a program per width: the main job took
  60 s where it now takes 30, with the same ms per token.)

  Args:
    enc: int [examples, length] encoder inputs, 0-padded on the right.
    batch_size: Rows per batch; a remainder that does not fill a batch is
      dropped, and fewer examples than one batch are repeated to fill it.

  Returns:
    int [batch_size, length] batches.
  """
  count = (len(enc) // batch_size) * batch_size or batch_size
  if len(enc) < batch_size:  # Repeat inputs to fill one batch.
    enc = np.resize(enc, (batch_size, enc.shape[1]))
  return [enc[i:i + batch_size] for i in range(0, count, batch_size)]


def compare_decoders(target: Model, draft: Model,
                     batches: Sequence[np.ndarray], *, temperature: float,
                     gamma: Union[int, str], max_decode_len: int,
                     lenience: float = 1.0,
                     seed: int = 0, repeats: int = 3,
                     on_batch: Optional[Callable[..., None]] = None,
                     decode_options: Optional[Dict[str, Any]] = None
                     ) -> Dict[str, Any]:
  """Baseline vs speculative decoding, interleaved per batch after warm-up.

  Each batch is decoded `repeats` times by each decoder in turn (same inputs
  and key, so the same outputs) and its median time counts, so one call
  slowed down by another process on a shared machine does not move a row.

  Args:
    target: The target.
    draft: The draft.
    batches: int32 [batch, length] encoder inputs, decoded one after another.
    temperature: 0 for greedy.
    gamma: Draft tokens per iteration, or 'auto' (each row chooses at
      each iteration, inside the compiled loop; `adaptive`).
    max_decode_len: Output limit.
    lenience: 1.0 is exact.
    seed: Sampling seed (batch i uses fold_in(seed, i)).
    repeats: Timed calls per batch and decoder (their median counts).
    on_batch: Called as on_batch(index, baseline_result, speculative_result).
    decode_options: More `generate` arguments for the speculative decoder
      (verification, draft_stop, draft_threshold, min_gain).

  Returns:
    alpha (empirical and Corollary 3.6), tokens per target call, per-token
    latencies, the measured speedup, how many rows were identical, the
    speculative output lengths (for `add_predictions`), the draft tokens
    proposed per iteration (`mean_proposals`) and how many iterations
    proposed each count (`proposal_counts`), and with gamma='auto' the
    speedup the in-loop rule expected (`predicted_speedup_in_loop`).
  """
  rng = jax.random.PRNGKey(seed)
  common = dict(max_decode_len=max_decode_len, temperature=temperature)
  seconds = {'baseline': 0.0, 'speculative': 0.0}
  tokens = {'baseline': 0, 'speculative': 0}
  stats = {'identical': 0, 'rows': 0}
  speculative_results = []
  compiled_shapes = set()
  for index, batch in enumerate(batches):
    key = jax.random.fold_in(rng, index)
    out = {}

    def baseline(batch=batch, key=key, out=out):
      out['baseline'] = generation.generate(target, batch, rng=key, **common)
      return out['baseline'].tokens

    def speculative(batch=batch, key=key, out=out):
      out['speculative'] = generation.generate(
          target, batch, rng=key, draft=draft, gamma=gamma,
          lenience=lenience, **(decode_options or {}), **common)
      return out['speculative'].tokens

    # A batch of a shape not seen yet first compiles both decoders, untimed.
    shape = np.shape(batch)
    timings = benchmark.interleaved_timings(
        {'baseline': baseline, 'speculative': speculative}, repeats=repeats,
        warmup=0 if shape in compiled_shapes else 1, start=index * repeats)
    compiled_shapes.add(shape)
    for name in seconds:
      seconds[name] += benchmark.median(timings[name])
      tokens[name] += int(np.sum(out[name].lengths))
    spec = out['speculative']
    speculative_results.append(spec)
    same = np.all(np.asarray(spec.tokens) == np.asarray(
        out['baseline'].tokens), axis=1)
    stats['identical'] += int(same.sum())
    stats['rows'] += len(same)
    if on_batch is not None:
      on_batch(index, out['baseline'], spec)
  latency = {k: seconds[k] / max(tokens[k], 1) for k in seconds}
  return {
      **analysis.summarize_result(speculative_results),
      'baseline_ms_per_token': 1e3 * latency['baseline'],
      'speculative_ms_per_token': 1e3 * latency['speculative'],
      'measured_speedup': latency['baseline'] / latency['speculative'],
      'identical_rows': stats['identical'], 'rows': stats['rows'],
      'output_lengths': [int(n) for r in speculative_results
                         for n in np.asarray(r.lengths)],
      **proposal_figures(speculative_results),
  }


def proposal_figures(results: Sequence[DecodeResult]) -> Dict[str, Any]:
  """How many tokens the iterations proposed, pooled over results, and
  what gamma='auto''s rule expected of its choices."""
  width = max(r.proposal_counts.shape[1] for r in results)
  counts = sum(np.pad(np.asarray(r.proposal_counts),
                      ((0, 0), (0, width - r.proposal_counts.shape[1])))
               .sum(axis=0) for r in results)
  iterations = max(int(counts.sum()), 1)
  predicted = np.concatenate([np.asarray(r.predicted_speedup)
                              for r in results])
  predicted = predicted[np.isfinite(predicted)]
  return {
      'proposal_counts': counts.tolist(),
      'mean_proposals': float(np.dot(np.arange(width), counts) / iterations),
      'predicted_speedup_in_loop': (float(np.mean(predicted))
                                    if predicted.size else None),
  }


def add_predictions(figures: Dict[str, Any], gamma: int,
                    costs: Dict[str, float]) -> Dict[str, Any]:
  """Adds c, the verification cost and the analysis' predictions.

  Three predictions from the measured alpha and c, each charging one more
  measured fact the paper's formula leaves out: `predicted_speedup` is
  Theorem 3.8 as printed (scoring gamma + 1 tokens costs one target step,
  outputs are endless); `predicted_speedup_with_verify_cost` charges the
  measured cost of scoring gamma + 1 tokens; `predicted_speedup_at_lengths`
  also ends each output where it really ended
  (`analysis.walltime_improvement_at_lengths`). What separates the last one
  from the measurement is the loops' own overhead and the encoder pass that
  both decoders pay once per call.
  """
  alpha = figures['alpha']
  predicted = analysis.predicted_speedup(alpha, gamma, costs, False)
  predicted_v = analysis.predicted_speedup(alpha, gamma, costs, True)
  lengths = [n for n in figures.get('output_lengths', ()) if n > 0]
  predicted_l = (analysis.walltime_improvement_at_lengths(
      alpha, gamma, costs['c'], lengths, costs['verify_cost'])
                 if lengths else None)
  measured = figures['measured_speedup']
  return {**figures, 'c': costs['c'], 'verify_cost': costs['verify_cost'],
          'predicted_speedup': predicted,
          'predicted_speedup_with_verify_cost': predicted_v,
          'predicted_speedup_at_lengths': predicted_l,
          'measured_over_predicted': measured / predicted,
          'measured_over_predicted_with_verify_cost': measured / predicted_v,
          'measured_over_predicted_at_lengths': (
              measured / predicted_l if predicted_l else None)}


def measure_row(row: ComparisonRow, costs: Optional[Dict[str, float]] = None,
                seed: int = 0, repeats: int = 3) -> Dict[str, Any]:
  """Measures one row: `compare_decoders` plus the analysis' prediction."""
  target, draft = load_pair(row.target, row.draft, row.mesh)
  enc, _ = row.data.load(row.num_examples)
  batches = timing_batches(enc, row.batch_size)
  if costs is None:
    costs = benchmark.measure_costs(target, draft, batches[0], row.gamma)
  figures = compare_decoders(
      target, draft, batches, temperature=row.temperature, gamma=row.gamma,
      max_decode_len=row.max_decode_len, lenience=row.lenience, seed=seed,
      repeats=repeats, decode_options=row.decode_options())
  return {'row': row.name, 'temperature': row.temperature,
          'gamma': row.gamma, 'batch_size': row.batch_size,
          'lenience': row.lenience, **row.decode_options(),
          **add_predictions(figures, row.gamma, costs),
          'paper_alpha': row.paper_alpha, 'paper_speedup': row.paper_speedup}


def acceptance(target_spec: specs.ModelSpec, draft_spec: specs.ModelSpec,
               data: specs.DataSpec, temperature: float, gamma: int = 3,
               num_examples: int = 32, batch_size: int = 16,
               max_decode_len: int = 48, seed: int = 0,
               decode_options: Optional[Dict[str, Any]] = None
               ) -> Dict[str, float]:
  """Alpha of a draft against a target on held-out inputs (Table 3).

  Counts only, no timing. `decode_options` are extra speculative `generate`
  options (`ComparisonRow.decode_options`: verification, draft stop).
  """
  target, draft = load_pair(target_spec, draft_spec)
  enc, _ = data.load(num_examples)
  results = [
      generation.generate(
          target, batch, max_decode_len=max_decode_len,
          temperature=temperature, draft=draft, gamma=gamma,
          rng=jax.random.fold_in(jax.random.PRNGKey(seed), index),
          **(decode_options or {}))
      for index, batch in enumerate(timing_batches(enc, batch_size))]
  return analysis.summarize_result(results)


@dataclasses.dataclass(frozen=True)
class AcceptanceTable:
  """Table 3: alpha of several drafts against one target.

  Attributes:
    target: The target.
    drafts: The drafts (include the unigram and bigram ones).
    data: Held-out inputs per task.
    temperatures: Sampling temperatures.
    gamma: Draft tokens per iteration (alpha does not depend on it).
    num_examples: Inputs per task.
  """
  target: specs.ModelSpec
  drafts: Tuple[specs.ModelSpec, ...]
  data: Tuple[specs.DataSpec, ...]
  temperatures: Tuple[float, ...] = (0.0, 1.0)
  gamma: int = 3
  num_examples: int = 32

  def describe(self) -> str:
    return '\n'.join([f'target: {self.target.describe()}'] +
                     [f'draft:  {d.describe()}' for d in self.drafts] +
                     [f'data:   {d.describe()}' for d in self.data])


def acceptance_table(table: AcceptanceTable) -> List[Dict[str, Any]]:
  rows = []
  for data in table.data:
    for draft in table.drafts:
      for temperature in table.temperatures:
        figures = acceptance(table.target, draft, data, temperature,
                             table.gamma, table.num_examples)
        rows.append({'task': data.task, 'draft': draft.label,
                     'temperature': temperature, **figures})
  return rows
