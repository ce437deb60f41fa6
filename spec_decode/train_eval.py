"""Evaluating a model as training does: validation loss, accuracy, agreement.

Training reports these at every evaluation, and optionally the chrF of
greedy translations (`translation_metrics`, also what the exported models'
manifest records); `scripts/agreement.py` computes the agreement of any draft
the same way, without an optimizer. The eval step is the training loss
without dropout or gradients (`losses.make_loss_fn`).
"""

import os
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp

from spec_decode import evaluation
from spec_decode import generation
from spec_decode import sampling as sampling_lib
from spec_decode import verification
from spec_decode.data import batching
from spec_decode.data import tasks
from spec_decode.data.corpora import Pair
from spec_decode.losses import LossFn
from spec_decode.model import Model
from spec_decode.model import shift_right
from spec_decode.model.model import teacher_forced_logits

Array = jax.Array
EvalStep = Callable[[Any, Dict[str, Any]], Dict[str, Array]]


def make_eval_step(loss_fn: LossFn) -> EvalStep:
  """The jitted metrics of a batch under the deterministic model.

  Args:
    loss_fn: The training loss; called without a dropout key, it runs the
      model without dropout.

  Returns:
    eval_step(params, batch) -> the loss's metrics ('loss_sum',
    'token_count', 'correct').
  """

  @jax.jit
  def eval_step(params, batch):
    return loss_fn(params, batch)[1]

  return eval_step


def load_agreement_splits(distillation_dir: Optional[str],
                          task_names: Iterable[str]
                          ) -> Optional[Dict[str, tasks.TokenizedSplit]]:
  """The teacher's greedy outputs on validation inputs, if distilled.

  Args:
    distillation_dir: The run's distillation folder (written by
      scripts/distill_target.py), or None.
    task_names: The tasks of the run's mixture.

  Returns:
    task -> split of `<distillation_dir>/<task>_validation.npz` for every
    task, or None without a distillation folder or when a task's file is
    missing (folders written before scripts/distill_target.py wrote validation
    outputs).
  """
  if not distillation_dir:
    return None
  paths = {name: os.path.join(distillation_dir, f'{name}_validation.npz')
           for name in task_names}
  if not all(os.path.isfile(path) for path in paths.values()):
    return None
  return {name: tasks.TokenizedSplit.load(path)
          for name, path in paths.items()}


def evaluate(eval_step: EvalStep, params, sampler: batching.BatchSampler,
             mixture: Mapping[str, float], count: int) -> Dict[str, float]:
  """Validation loss and token accuracy per task.

  Args:
    eval_step: From `make_eval_step`.
    params: The model's parameters.
    sampler: Batches of the validation data.
    mixture: The tasks to evaluate (keys).
    count: Examples per task (the first ones).

  Returns:
    `<task>/loss` and `<task>/accuracy` per task.
  """
  results = {}
  for name in sorted(mixture):
    totals = {'loss_sum': 0.0, 'token_count': 0.0, 'correct': 0.0}
    for batch in sampler.eval_batches(name, count):
      metrics = eval_step(params, batch)
      for key in totals:
        totals[key] += float(metrics[key])
    results[f'{name}/loss'] = totals['loss_sum'] / max(totals['token_count'],
                                                       1)
    results[f'{name}/accuracy'] = totals['correct'] / max(
        totals['token_count'], 1)
  return results


def evaluate_agreement(eval_step: EvalStep, params,
                       sampler: batching.BatchSampler,
                       mixture: Mapping[str, float],
                       count: int) -> Dict[str, float]:
  """Teacher-forced argmax agreement with the teacher's greedy outputs.

  At each position of the teacher's greedy output the draft's argmax either
  is the teacher's token or not; greedy speculative decoding accepts a draft
  token exactly when it is. So this token accuracy, on inputs neither model
  trained on, estimates the paper's alpha at temperature 0 without decoding.

  Args:
    eval_step: From `make_eval_step`.
    params: The draft's parameters.
    sampler: Batches of the splits `load_agreement_splits` returns.
    mixture: The tasks to evaluate (keys).
    count: Examples per task (the first ones).

  Returns:
    `<task>/target_agreement` per task.
  """
  metrics = evaluate(eval_step, params, sampler, mixture, count)
  return {f'{name}/target_agreement': metrics[f'{name}/accuracy']
          for name in sorted(mixture)}


def expected_acceptance(target: Model, draft: Model,
                        sampler: batching.BatchSampler,
                        mixture: Mapping[str, float], count: int,
                        sampling: Optional[sampling_lib.SamplingConfig] = None
                        ) -> Dict[str, float]:
  """Mean beta = sum_x min(p(x), q(x)) along the teacher's greedy outputs.

  Beta is the exact probability that speculative sampling accepts the
  draft's token at a position (Theorem 3.5); averaged over the positions of
  the target's own outputs it estimates the paper's alpha under sampling
  without decoding, as `evaluate_agreement` does at temperature 0. Both
  models' logits go through the same processing the decoders apply.

  Args:
    target: The target (p).
    draft: The draft (q), same vocabulary.
    sampler: Batches of the splits `load_agreement_splits` returns.
    mixture: The tasks to evaluate (keys).
    count: Examples per task (the first ones).
    sampling: Temperature / top-k / top-p (default: temperature 1).

  Returns:
    `<task>/expected_acceptance` per task.
  """
  sampling = sampling or sampling_lib.SamplingConfig(temperature=1.0)
  if sampling.greedy:
    raise ValueError('sampling must have temperature > 0 (at temperature 0 '
                     'acceptance is evaluate_agreement).')

  @jax.jit
  def beta_sums(target_params, draft_params, inputs, targets):
    decoder_inputs = shift_right(targets)
    p, q = (jnp.exp(sampling_lib.process_logits(
        teacher_forced_logits(model.config, params, inputs, decoder_inputs),
        sampling))
            for model, params in ((target, target_params),
                                  (draft, draft_params)))
    weights = (targets > 0).astype(jnp.float32)  # [batch, length]
    return (jnp.sum(verification.overlap_mass(p, q) * weights),
            jnp.sum(weights))

  results = {}
  for name in sorted(mixture):
    total, tokens = 0.0, 0.0
    for batch in sampler.eval_batches(name, count):
      beta, weight = beta_sums(target.params, draft.params, batch['inputs'],
                               batch['targets'])
      total, tokens = total + float(beta), tokens + float(weight)
    results[f'{name}/expected_acceptance'] = total / max(tokens, 1.0)
  return results


def translation_metrics(model: Model, vocabulary, pairs: Sequence[Pair],
                        batch_size: int = 50, input_length: int = 64,
                        max_decode_len: int = 64,
                        num_samples: int = 5) -> Dict[str, Any]:
  """Greedy En->De translations scored against their references.

  What a T5X user reads from an inference eval: corpus chrF and BLEU of the
  model's greedy output, and a few examples beside their references. The
  last batch is padded with empty rows, so every call compiles one shape.

  Args:
    model: The model to translate with (any dtype).
    vocabulary: The SentencePiece vocabulary its data was tokenized with.
    pairs: (English source, German reference) pairs.
    batch_size: Rows per decoding call.
    input_length: Inputs are encoded (and truncated) to this many tokens.
    max_decode_len: Output tokens per row.
    num_samples: Examples returned under 'samples'.

  Returns:
    'chrf', 'bleu', 'examples' (how many pairs) and 'samples' (a list of
    {'input', 'reference', 'output'}).
  """
  if not pairs:
    raise ValueError('pairs must hold at least one (source, reference) '
                     'pair.')
  hypotheses = []
  for start in range(0, len(pairs), batch_size):
    chunk = pairs[start:start + batch_size]
    inputs = tasks.pad_rows(evaluation.encode_inputs(
        vocabulary, 'translate_en_de', [source for source, _ in chunk],
        input_length), batch_size)
    result = generation.generate(model, inputs,
                                 max_decode_len=max_decode_len)
    hypotheses.extend(
        evaluation.decode_outputs(vocabulary, result.tokens)[:len(chunk)])
  scores: Dict[str, Any] = evaluation.translation_scores(
      hypotheses, [reference for _, reference in pairs])
  scores['examples'] = len(pairs)
  scores['samples'] = [
      {'input': source, 'reference': reference, 'output': output}
      for (source, reference), output in list(zip(pairs, hypotheses))[
          :num_samples]]
  return scores
