"""Training T5 models on pre-tokenized arrays, T5X style (Adafactor, z-loss).

One jitted step per (batch, input length, target length) shape; batches are
length-bucketed (`data.batching`) so little compute goes to padding. Training
is resumable: a checkpoint (T5X format, plus the optimizer state and the
step; `train_state`) is written every `checkpoint_every` steps and training
continues from the newest one. The same code runs unchanged on a GPU, where
it is far faster.

Drafts can be distilled: examples may carry the teacher's top-k next-token
distribution at every target position (`distill.DistillationTargets`), and
the loss mixes cross-entropy on the teacher's tokens with cross-entropy
against its distribution. A draft's evaluation (`train_eval`) then also
reports its agreement with the target on validation inputs, the figure that
predicts speculative decoding's acceptance rate.
"""

import dataclasses
import functools
import json
import os
import time
from typing import Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode import checkpoints
from spec_decode import distill
from spec_decode import losses
from spec_decode import on_policy
from spec_decode import pretrained
from spec_decode import train_eval
from spec_decode import train_state
from spec_decode.data import batching
from spec_decode.data import tasks
from spec_decode.data.tokenizer import Vocabulary
from spec_decode.model import init_params
from spec_decode.model import Model
from spec_decode.model import parameter_count
from spec_decode.model import T5Config

Array = jax.Array


@dataclasses.dataclass
class TrainConfig:
  """Everything a training run needs (bound from gin by scripts/train_model.py).

  Attributes:
    model: Architecture of the model to train (dtype float32 on CPU).
    model_dir: Checkpoints and logs go here; training resumes from it.
    data_dir: Folder written by scripts/prepare_data.py.
    mixture: task -> sampling rate of its training examples.
    distillation_dir: If set, train on `<dir>/<task>_train.npz` (teacher
      outputs) with soft targets from `<dir>/<task>_train_teacher.npz`, and
      report agreement with `<dir>/<task>_validation.npz` where it exists.
    soft_target_weight: Weight of the soft (distribution) loss in [0, 1].
    batch_tokens: Padded tokens (input + target) per batch.
    max_input_length: Inputs are truncated to this many tokens (a multiple
      of 32, at most 128).
    num_steps: Steps to train in total (including resumed ones).
    learning_rate: Peak Adafactor learning rate.
    warmup_steps: Linear warm-up, then 1/sqrt decay (T5's schedule).
    z_loss: T5X's auxiliary log-partition loss weight.
    eval_examples: Validation examples per task for the eval loss.
    chrf_examples: If > 0 (and the mixture has 'translate_en_de'), each
      evaluation also translates this many En->De validation sentences
      greedily and logs their corpus chrF and BLEU (T5X's inference eval).
    vocabulary: SentencePiece model the data was tokenized with (for
      `chrf_examples`); None is the shipped vocabulary.
    eval_every: Steps between evaluations.
    checkpoint_every: Steps between checkpoints.
    keep_checkpoints: Newest checkpoints kept.
    log_every: Steps between progress lines.
    seed: Initialisation and data order.
    init_checkpoint: Optional checkpoint to start from (e.g. to shrink).
    input_buckets: Padded input lengths batches are bucketed to (each
      pair of buckets is one compiled shape; accelerators want few).
    target_buckets: Padded target lengths, likewise.
    time_limit_seconds: If set, training stops (and checkpoints) at the first
      logging step after this many seconds of this run, whatever
      `num_steps` says; the log records the step reached. The schedule does
      not depend on `num_steps`, so re-running with that step count
      reproduces the run.
    teacher_dir: Training folder of the target, for on-policy distillation.
    on_policy_fraction: Share of steps (chosen by (seed, step)) that train
      on the draft's own samples against the teacher (DistillSpec); the
      rest train on the offline distillation data. Needs `teacher_dir`.
    on_policy_divergence: 'tvd' (1 - acceptance probability) or
      'forward_kl'.
    on_policy_temperature: Temperature of the draft's samples.
  """
  model: T5Config = dataclasses.field(default_factory=T5Config)
  model_dir: str = 'runs/model'
  data_dir: str = 'data'
  mixture: Dict[str, float] = dataclasses.field(
      default_factory=lambda: {'translate_en_de': 1.0})
  distillation_dir: Optional[str] = None
  soft_target_weight: float = 0.5
  batch_tokens: int = 4096
  max_input_length: int = 128
  num_steps: int = 1000
  learning_rate: float = 0.01
  warmup_steps: int = 500
  z_loss: float = 1e-4
  eval_examples: int = 256
  chrf_examples: int = 0
  vocabulary: Optional[str] = None
  eval_every: int = 250
  checkpoint_every: int = 250
  keep_checkpoints: int = 2
  log_every: int = 25
  seed: int = 0
  init_checkpoint: Optional[str] = None
  input_buckets: Tuple[int, ...] = batching.INPUT_BUCKETS
  target_buckets: Tuple[int, ...] = batching.TARGET_BUCKETS
  time_limit_seconds: Optional[float] = None
  teacher_dir: Optional[str] = None
  on_policy_fraction: float = 0.0
  on_policy_divergence: str = 'tvd'
  on_policy_temperature: float = 1.0

  def __post_init__(self):
    self.input_buckets = tuple(sorted(self.input_buckets))
    self.target_buckets = tuple(sorted(self.target_buckets))
    if not 0.0 <= self.on_policy_fraction <= 1.0:
      raise ValueError('on_policy_fraction must be in [0, 1], got '
                       f'{self.on_policy_fraction!r}.')
    if self.on_policy_fraction > 0 and not self.teacher_dir:
      raise ValueError('on_policy_fraction > 0 needs teacher_dir (the '
                       "target's training folder).")
    on_policy.check_divergence(self.on_policy_divergence)


def learning_rate_schedule(peak: float, warmup_steps: int) -> optax.Schedule:
  """Linear warm-up to `peak`, then peak * sqrt(warmup / step)."""
  def schedule(step):
    step = jnp.maximum(step, 1).astype(jnp.float32)
    warm = jnp.minimum(step / warmup_steps, 1.0)
    return peak * warm * jax.lax.rsqrt(jnp.maximum(step / warmup_steps, 1.0))
  return schedule


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
  """Adafactor with T5X's t5_1_1 settings."""
  return optax.adafactor(
      learning_rate=learning_rate_schedule(config.learning_rate,
                                           config.warmup_steps),
      min_dim_size_to_factor=128, decay_rate=0.8, decay_offset=0,
      multiply_by_parameter_scale=True, clipping_threshold=1.0, eps=1e-30,
      factored=True)


def make_train_step(config: TrainConfig, optimizer):
  """The jitted update: forward, loss, gradients, Adafactor.

  Returns:
    train_step(state, batch) -> (state, metrics), and the eval step
    (`train_eval.make_eval_step`) of the same loss.
  """
  loss_fn = losses.make_loss_fn(config.model, config.z_loss,
                                config.soft_target_weight)

  @jax.jit
  def train_step(state: train_state.TrainState, batch):
    # A function of (seed, step): a resumed run drops what a straight one
    # would.
    dropout_rng = jax.random.fold_in(jax.random.PRNGKey(config.seed),
                                     state.step)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, batch, dropout_rng)
    updates, opt_state = optimizer.update(grads, state.opt_state,
                                          state.params)
    params = optax.apply_updates(state.params, updates)
    metrics['loss'] = loss
    return train_state.TrainState(state.step + 1, params, opt_state), metrics

  return train_step, train_eval.make_eval_step(loss_fn)


def make_on_policy_step(config: TrainConfig, optimizer,
                        teacher_config: T5Config):
  """The jitted update on the draft's own samples (see `on_policy`)."""

  @functools.partial(jax.jit, static_argnums=3)
  def on_policy_step(state: train_state.TrainState, teacher_params, inputs,
                     max_decode_len: int):
    base = jax.random.fold_in(jax.random.PRNGKey(config.seed), state.step)
    sample_rng, dropout_rng = jax.random.split(base)
    (loss, metrics), grads = jax.value_and_grad(
        on_policy.on_policy_loss, argnums=2, has_aux=True)(
            config.model, teacher_config, state.params, teacher_params,
            inputs, sample_rng, max_decode_len, config.on_policy_temperature,
            config.on_policy_divergence, dropout_rng)
    updates, opt_state = optimizer.update(grads, state.opt_state,
                                          state.params)
    params = optax.apply_updates(state.params, updates)
    metrics['loss'] = loss
    return train_state.TrainState(state.step + 1, params, opt_state), metrics

  return on_policy_step


def load_splits(config: TrainConfig, split: str
                ) -> Tuple[Dict[str, tasks.TokenizedSplit],
                           Optional[Dict[str, distill.DistillationTargets]]]:
  splits, teacher = {}, None
  for name in config.mixture:
    if config.distillation_dir and split == 'train':
      splits[name] = tasks.TokenizedSplit.load(
          os.path.join(config.distillation_dir, f'{name}_train.npz'))
      teacher = teacher or {}
      teacher[name] = distill.DistillationTargets.load(
          os.path.join(config.distillation_dir, f'{name}_train_teacher.npz'))
    else:
      splits[name] = tasks.TokenizedSplit.load(
          tasks.tokenized_path(config.data_dir, name, split))
  return splits, teacher


def train(config: TrainConfig) -> Dict[str, float]:
  """Trains (or resumes) a model; returns the final validation metrics."""
  os.makedirs(config.model_dir, exist_ok=True)
  with open(os.path.join(config.model_dir, 'config.json'), 'w') as f:
    json.dump(dataclasses.asdict(config), f, indent=1, default=str)
  train_splits, teacher = load_splits(config, 'train')
  eval_splits, _ = load_splits(
      dataclasses.replace(config, distillation_dir=None), 'validation')
  buckets = dict(max_input_length=config.max_input_length,
                 input_buckets=config.input_buckets,
                 target_buckets=config.target_buckets)
  sampler = batching.BatchSampler(
      train_splits, config.mixture, config.batch_tokens, config.seed,
      teacher, **buckets)
  eval_sampler = batching.BatchSampler(
      eval_splits, config.mixture, config.batch_tokens, config.seed,
      **buckets)
  chrf_pairs, vocabulary = [], None
  if config.chrf_examples > 0 and 'translate_en_de' in config.mixture:
    chrf_pairs = tasks.load_pairs('translate_en_de', 'validation',
                                  config.data_dir)[:config.chrf_examples]
    vocabulary = Vocabulary(config.vocabulary or pretrained.VOCABULARY_PATH)
  agreement_splits = train_eval.load_agreement_splits(
      config.distillation_dir, config.mixture)
  agreement_sampler = None
  if agreement_splits:
    agreement_sampler = batching.BatchSampler(
        agreement_splits, config.mixture, config.batch_tokens, config.seed,
        **buckets)
  if config.distillation_dir and not agreement_sampler:
    print(f'{config.distillation_dir} has no <task>_validation.npz for every '
          'task; target agreement is not reported (re-run '
          'scripts/distill_target.py to write them).', flush=True)
  optimizer = make_optimizer(config)
  train_step, eval_step = make_train_step(config, optimizer)
  on_policy_step = teacher_model = None
  if config.on_policy_fraction > 0:
    teacher_model = train_state.load_trained(config.teacher_dir)
    teacher_model = Model(
        teacher_model.config.replace(dtype=config.model.dtype),
        teacher_model.params)
    on_policy_step = make_on_policy_step(config, optimizer,
                                         teacher_model.config)

  if config.init_checkpoint:
    params = checkpoints.load_t5x_checkpoint(config.init_checkpoint,
                                             config.model, dtype='float32')
  else:
    params = init_params(config.model, jax.random.PRNGKey(config.seed))
  params = jax.tree_util.tree_map(jnp.asarray, params)
  state = train_state.TrainState(jnp.zeros((), jnp.int32), params,
                                 optimizer.init(params))
  restored = train_state.restore_latest(config.model_dir, config.model, state)
  if restored is not None:
    state, path = restored
    print(f'resumed from {path} at step {int(state.step)}', flush=True)

  log_path = os.path.join(config.model_dir, 'train_log.jsonl')
  print(f'training {parameter_count(state.params):,} parameters for '
        f'{config.num_steps} steps; {len(sampler.shapes())} batch shapes',
        flush=True)
  run_start = start_time = time.time()
  tokens, pending, on_policy_pending = 0, [], []
  metrics = {}
  while int(state.step) < config.num_steps:
    step = int(state.step)
    batch = sampler.batch(step)
    if on_policy_step is not None and _is_on_policy(config, step):
      state, step_metrics = on_policy_step(
          state, teacher_model.params, batch['inputs'],
          batch['targets'].shape[1])
      on_policy_pending.append(step_metrics)
    else:
      state, step_metrics = train_step(state, batch)
      # Device scalars are summed at logging time: no host sync per step.
      pending.append(step_metrics)
    tokens += int(batch['inputs'].size + batch['targets'].size)
    done = step + 1
    out_of_time = (config.time_limit_seconds is not None and
                   time.time() - run_start > config.time_limit_seconds)
    last = done == config.num_steps or (
        out_of_time and done % config.log_every == 0)
    if done % config.log_every == 0 or last:
      jax.block_until_ready(state.step)
      elapsed = time.time() - start_time
      steps_left = config.num_steps - done
      record = {'step': done,
                'tokens_per_second': tokens / max(elapsed, 1e-9),
                'time': time.time(),
                # From this logging interval's pace; a time limit may stop
                # training sooner.
                'eta_seconds': round(steps_left * elapsed
                                     / max(len(pending) +
                                           len(on_policy_pending), 1))}
      if pending:
        sums = _sum_metrics(pending)
        record['train_loss'] = sums['loss'] / len(pending)
        record['train_accuracy'] = sums['correct'] / max(
            sums['token_count'], 1)
      if on_policy_pending:
        on_sums = _sum_metrics(on_policy_pending)
        record['on_policy_divergence'] = (on_sums['loss_sum'] /
                                          max(on_sums['token_count'], 1))
        record['on_policy_agreement'] = (on_sums['correct'] /
                                         max(on_sums['token_count'], 1))
      pending, on_policy_pending, tokens = [], [], 0
      start_time = time.time()
      if done % config.eval_every == 0 or last:
        record.update(train_eval.evaluate(
            eval_step, state.params, eval_sampler, config.mixture,
            config.eval_examples))
        if chrf_pairs:
          scores = train_eval.translation_metrics(
              Model(config.model, state.params), vocabulary, chrf_pairs)
          record['translate_en_de/chrf'] = scores['chrf']
          record['translate_en_de/bleu'] = scores['bleu']
        if agreement_sampler:
          record.update(train_eval.evaluate_agreement(
              eval_step, state.params, agreement_sampler, config.mixture,
              config.eval_examples))
        metrics = record
      print(json.dumps(record), flush=True)
      with open(log_path, 'a') as f:
        f.write(json.dumps(record) + '\n')
    if done % config.checkpoint_every == 0 or last:
      train_state.save_train_state(config.model_dir, state,
                                   config.keep_checkpoints)
    if last and out_of_time:
      print(f'time limit of {config.time_limit_seconds} s reached at step '
            f'{done}', flush=True)
      break
  return metrics


def _is_on_policy(config: TrainConfig, step: int) -> bool:
  """Whether `step` trains on the draft's own samples (a function of step)."""
  rng = np.random.RandomState((config.seed * 7_919 + step) % 2**32)
  return rng.random_sample() < config.on_policy_fraction


def _sum_metrics(metrics: List[Dict[str, Array]]) -> Dict[str, float]:
  keys = ('loss', 'loss_sum', 'correct', 'token_count')
  return {key: float(sum(m[key] for m in metrics)) for key in keys}
