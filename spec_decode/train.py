"""Training T5 models on pre-tokenized arrays, T5X style (Adafactor, z-loss).

One jitted step per (batch, input length, target length) shape; batches are
length-bucketed so little compute goes to padding. Training is resumable: a
checkpoint (T5X format, plus the optimizer state and the step) is written
every `checkpoint_every` steps and training continues from the newest one.
The same code runs unchanged on a GPU, where it is far faster.

Drafts can be distilled: examples may carry the teacher's top-k next-token
distribution at every target position, and the loss mixes cross-entropy on
the teacher's tokens with cross-entropy against its distribution. A draft's
evaluation then also reports its agreement with the target on validation
inputs, the figure that predicts speculative decoding's acceptance rate.
"""

import dataclasses
import functools
import json
import os
import shutil
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import flax
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from spec_decode import checkpoints
from spec_decode import on_policy
from spec_decode.data import tasks
from spec_decode.model import init_params
from spec_decode.model import Model
from spec_decode.model import T5Config
from spec_decode.model.network import Transformer

Array = jax.Array
INPUT_BUCKETS = (32, 64, 128)
TARGET_BUCKETS = (16, 32, 64, 96)


@dataclasses.dataclass
class DistillationTargets:
  """The teacher's top-k distribution at each target token of a split.

  Rows align with the split's concatenated `targets` array.
  """
  ids: np.ndarray    # uint16 [total_target_tokens, k]
  probs: np.ndarray  # float16 [total_target_tokens, k]

  def save(self, path: str) -> None:
    tmp = path + '.tmp.npz'
    np.savez(tmp, ids=self.ids, probs=self.probs)
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> 'DistillationTargets':
    with np.load(path) as arrays:
      return cls(ids=arrays['ids'], probs=arrays['probs'])


@dataclasses.dataclass
class TrainConfig:
  """Everything a training run needs (bound from gin by scripts/train.py).

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
  eval_every: int = 250
  checkpoint_every: int = 250
  keep_checkpoints: int = 2
  log_every: int = 25
  seed: int = 0
  init_checkpoint: Optional[str] = None
  input_buckets: Tuple[int, ...] = INPUT_BUCKETS
  target_buckets: Tuple[int, ...] = TARGET_BUCKETS
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


def cross_entropy_with_z_loss(logits: Array, targets: Array, weights: Array,
                              z_loss: float,
                              soft_ids: Optional[Array] = None,
                              soft_probs: Optional[Array] = None,
                              soft_weight: float = 0.0
                              ) -> Tuple[Array, Dict[str, Array]]:
  """Mean token loss (T5X's cross entropy with z-loss), optionally distilled.

  Args:
    logits: float32 [batch, length, vocab].
    targets: int [batch, length].
    weights: float [batch, length], 0 at padding.
    z_loss: Weight of log(Z)^2.
    soft_ids: Optional int [batch, length, k] teacher top-k ids.
    soft_probs: Optional float [batch, length, k] their probabilities.
    soft_weight: Weight of the soft loss.

  Returns:
    The scalar loss and metrics (sums and counts).
  """
  log_z = jax.nn.logsumexp(logits, axis=-1)
  logprobs = logits - log_z[..., None]
  hard = -jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
  token_loss = hard
  if soft_ids is not None:
    picked = jnp.take_along_axis(logprobs, soft_ids.astype(jnp.int32),
                                 axis=-1)
    probs = soft_probs.astype(jnp.float32)
    probs = probs / jnp.maximum(jnp.sum(probs, -1, keepdims=True), 1e-9)
    soft = -jnp.sum(probs * picked, axis=-1)
    token_loss = (1.0 - soft_weight) * hard + soft_weight * soft
  total = token_loss + z_loss * jnp.square(log_z)
  count = jnp.maximum(jnp.sum(weights), 1.0)
  loss = jnp.sum(total * weights) / count
  correct = (jnp.argmax(logits, -1) == targets) * weights
  return loss, {'loss_sum': jnp.sum(hard * weights),
                'token_count': jnp.sum(weights),
                'correct': jnp.sum(correct)}


def _shift_right(targets: Array) -> Array:
  return jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]


@flax.struct.dataclass
class TrainState:
  step: Array
  params: Any
  opt_state: Any


def make_train_step(config: TrainConfig, optimizer):
  """The jitted update: forward, loss, gradients, Adafactor."""
  model = Transformer(config.model)

  def loss_fn(params, batch, dropout_rng=None):
    # Evaluation passes no rng: the deterministic model.
    rngs = None if dropout_rng is None else {'dropout': dropout_rng}
    logits = model.apply({'params': params}, batch['inputs'],
                         _shift_right(batch['targets']),
                         enable_dropout=rngs is not None, rngs=rngs)
    return cross_entropy_with_z_loss(
        logits, batch['targets'], (batch['targets'] > 0).astype(jnp.float32),
        config.z_loss, batch.get('soft_ids'), batch.get('soft_probs'),
        config.soft_target_weight)

  @jax.jit
  def train_step(state: TrainState, batch):
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
    return TrainState(state.step + 1, params, opt_state), metrics

  @jax.jit
  def eval_step(params, batch):
    return loss_fn(params, batch)[1]

  return train_step, eval_step


def make_on_policy_step(config: TrainConfig, optimizer,
                        teacher_config: T5Config):
  """The jitted update on the draft's own samples (see `on_policy`)."""

  @functools.partial(jax.jit, static_argnums=3)
  def on_policy_step(state: TrainState, teacher_params, inputs,
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
    return TrainState(state.step + 1, params, opt_state), metrics

  return on_policy_step


def _bucket(length: int, boundaries: Sequence[int]) -> int:
  for boundary in boundaries:
    if length <= boundary:
      return boundary
  return boundaries[-1]


class BatchSampler:
  """Length-bucketed random batches from several tasks, reproducibly.

  Each step picks a task by its mixture rate, then an example uniformly at
  random; the batch is filled with random examples of that example's
  (input bucket, target bucket). Step s always yields the same batch, so a
  resumed run sees the data an uninterrupted one would.
  """

  def __init__(self, splits: Dict[str, tasks.TokenizedSplit],
               mixture: Dict[str, float], batch_tokens: int, seed: int,
               teacher: Optional[Dict[str, DistillationTargets]] = None,
               max_input_length: int = INPUT_BUCKETS[-1],
               input_buckets: Sequence[int] = INPUT_BUCKETS,
               target_buckets: Sequence[int] = TARGET_BUCKETS):
    self._splits = splits
    self._input_buckets = tuple(b for b in input_buckets
                                if b <= max_input_length) or (
                                    max_input_length,)
    self._target_buckets = tuple(target_buckets)
    self._teacher = teacher
    names = sorted(mixture)
    rates = np.array([mixture[n] for n in names], np.float64)
    self._tasks, self._rates = names, rates / rates.sum()
    self._batch_tokens = batch_tokens
    self._seed = seed
    self._buckets = {}
    for name in names:
      split = splits[name]
      keys = [(_bucket(i, self._input_buckets),
               _bucket(t, self._target_buckets))
              for i, t in zip(split.input_lengths, split.target_lengths)]
      groups = {}
      for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
      self._buckets[name] = (keys, {k: np.array(v) for k, v in
                                    groups.items()})

  def shapes(self) -> List[Tuple[int, int, int]]:
    return sorted({self.batch_shape(k) for name in self._tasks
                   for k in self._buckets[name][1]})

  def batch_shape(self, key: Tuple[int, int]) -> Tuple[int, int, int]:
    input_len, target_len = key
    batch = max(8, (self._batch_tokens // (input_len + target_len)) // 8 * 8)
    return batch, input_len, target_len

  def batch(self, step: int) -> Dict[str, np.ndarray]:
    rng = np.random.RandomState((self._seed * 1_000_003 + step) % 2**32)
    name = self._tasks[rng.choice(len(self._tasks), p=self._rates)]
    keys, groups = self._buckets[name]
    key = keys[rng.randint(len(keys))]
    size, input_len, target_len = self.batch_shape(key)
    chosen = rng.choice(groups[key], size=size, replace=True)
    return self.examples(name, chosen, input_len, target_len)

  def examples(self, name: str, indices: Sequence[int], input_len: int,
               target_len: int) -> Dict[str, np.ndarray]:
    split = self._splits[name]
    inputs = [split.input(i) for i in indices]
    # Truncated inputs keep their EOS, as T5's preprocessing does.
    inputs = [x if len(x) <= input_len else np.append(x[:input_len - 1], 1)
              for x in inputs]
    batch = {
        'inputs': tasks.pad_batch(inputs, input_len),
        'targets': tasks.pad_batch([split.target(i) for i in indices],
                                   target_len),
    }
    if self._teacher is not None:
      teacher = self._teacher[name]
      k = teacher.ids.shape[1]
      ids = np.zeros((len(indices), target_len, k), np.int32)
      probs = np.zeros((len(indices), target_len, k), np.float32)
      for row, index in enumerate(indices):
        start, end = split.target_offsets[index], split.target_offsets[
            index + 1]
        n = min(end - start, target_len)
        ids[row, :n] = teacher.ids[start:start + n]
        probs[row, :n] = teacher.probs[start:start + n]
      batch['soft_ids'], batch['soft_probs'] = ids, probs
    return batch

  def eval_batches(self, name: str, count: int
                   ) -> Iterator[Dict[str, np.ndarray]]:
    """Fixed batches of the first `count` examples of a task, by bucket."""
    keys, _ = self._buckets[name]
    by_key = {}
    for index in range(min(count, len(keys))):
      by_key.setdefault(keys[index], []).append(index)
    for key, indices in sorted(by_key.items()):
      size = self.batch_shape(key)[0]
      for start in range(0, len(indices), size):
        yield self.examples(name, indices[start:start + size], *key)


def _latest_checkpoint(model_dir: str) -> Optional[Tuple[int, str]]:
  if not os.path.isdir(model_dir):
    return None
  steps = []
  for name in os.listdir(model_dir):
    if name.startswith('checkpoint_') and name[11:].isdigit():
      path = os.path.join(model_dir, name)
      if os.path.isfile(os.path.join(path, 'train_state.msgpack')):
        steps.append((int(name[11:]), path))
  return max(steps) if steps else None


def save_train_state(model_dir: str, state: TrainState, keep: int) -> str:
  """Writes params (T5X format) and the optimizer state; prunes old ones."""
  step = int(state.step)
  path = os.path.join(model_dir, f'checkpoint_{step}')
  params = jax.tree_util.tree_map(np.asarray, state.params)
  checkpoints.save_t5x_checkpoint(path, params, step=step)
  opt_bytes = flax.serialization.msgpack_serialize(
      flax.serialization.to_state_dict(
          jax.tree_util.tree_map(np.asarray, state.opt_state)))
  tmp = os.path.join(path, 'train_state.msgpack.tmp')
  with open(tmp, 'wb') as f:
    f.write(opt_bytes)
  os.replace(tmp, os.path.join(path, 'train_state.msgpack'))
  existing = sorted(
      (int(n[11:]), n) for n in os.listdir(model_dir)
      if n.startswith('checkpoint_') and n[11:].isdigit())
  for _, name in existing[:-keep]:
    shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)
  return path


def load_splits(config: TrainConfig, split: str
                ) -> Tuple[Dict[str, tasks.TokenizedSplit],
                           Optional[Dict[str, DistillationTargets]]]:
  splits, teacher = {}, None
  for name in config.mixture:
    if config.distillation_dir and split == 'train':
      splits[name] = tasks.TokenizedSplit.load(
          os.path.join(config.distillation_dir, f'{name}_train.npz'))
      teacher = teacher or {}
      teacher[name] = DistillationTargets.load(
          os.path.join(config.distillation_dir, f'{name}_train_teacher.npz'))
    else:
      splits[name] = tasks.TokenizedSplit.load(
          tasks.tokenized_path(config.data_dir, name, split))
  return splits, teacher


def load_trained(path: str, eos_id: int = 1) -> Model:
  """A float32 model from a training folder (or one of its checkpoints).

  Args:
    path: A `model_dir` written by `train`, or a `checkpoint_<step>` folder
      inside one; a folder loads its newest checkpoint.
    eos_id: The vocabulary's EOS id.

  Returns:
    The model, with the architecture the run's config.json records.
  """
  path = path.rstrip('/')
  run_dir = (os.path.dirname(path)
             if os.path.basename(path).startswith('checkpoint_') else path)
  config_path = os.path.join(run_dir, 'config.json')
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f'{config_path} does not exist: expected a '
                            'training folder written by scripts/train.py.')
  with open(config_path) as f:
    fields = json.load(f)['model']
  config = T5Config(**{**fields, 'dtype': 'float32'})
  params = checkpoints.load_t5x_checkpoint(path, config, dtype='float32')
  return Model(config, params, eos_id=eos_id)


def load_agreement_splits(config: TrainConfig
                          ) -> Optional[Dict[str, tasks.TokenizedSplit]]:
  """The teacher's greedy outputs on validation inputs, if distilled.

  Args:
    config: The run's config.

  Returns:
    task -> split of `<distillation_dir>/<task>_validation.npz` for every
    task of the mixture, or None without a distillation folder or when a
    task's file is missing (folders written before scripts/distill.py wrote
    validation outputs).
  """
  if not config.distillation_dir:
    return None
  paths = {name: os.path.join(config.distillation_dir,
                              f'{name}_validation.npz')
           for name in config.mixture}
  if not all(os.path.isfile(path) for path in paths.values()):
    return None
  return {name: tasks.TokenizedSplit.load(path)
          for name, path in paths.items()}


def evaluate(eval_step, params, sampler: BatchSampler, mixture,
             count: int) -> Dict[str, float]:
  """Validation loss and token accuracy per task."""
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


def evaluate_agreement(eval_step, params, sampler: BatchSampler, mixture,
                       count: int) -> Dict[str, float]:
  """Teacher-forced argmax agreement with the teacher's greedy outputs.

  At each position of the teacher's greedy output the draft's argmax either
  is the teacher's token or not; greedy speculative decoding accepts a draft
  token exactly when it is. So this token accuracy, on inputs neither model
  trained on, estimates the paper's alpha at temperature 0 without decoding.

  Returns:
    `<task>/target_agreement` per task.
  """
  metrics = evaluate(eval_step, params, sampler, mixture, count)
  return {f'{name}/target_agreement': metrics[f'{name}/accuracy']
          for name in sorted(mixture)}


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
  sampler = BatchSampler(train_splits, config.mixture, config.batch_tokens,
                         config.seed, teacher, **buckets)
  eval_sampler = BatchSampler(eval_splits, config.mixture,
                              config.batch_tokens, config.seed, **buckets)
  agreement_splits = load_agreement_splits(config)
  agreement_sampler = None
  if agreement_splits:
    agreement_sampler = BatchSampler(
        agreement_splits, config.mixture, config.batch_tokens, config.seed,
        **buckets)
  if config.distillation_dir and not agreement_sampler:
    print(f'{config.distillation_dir} has no <task>_validation.npz for every '
          'task; target agreement is not reported (re-run '
          'scripts/distill.py to write them).', flush=True)
  optimizer = make_optimizer(config)
  train_step, eval_step = make_train_step(config, optimizer)
  on_policy_step = teacher_model = None
  if config.on_policy_fraction > 0:
    teacher_model = load_trained(config.teacher_dir)
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
  state = TrainState(jnp.zeros((), jnp.int32), params, optimizer.init(params))
  latest = _latest_checkpoint(config.model_dir)
  if latest is not None:
    step, path = latest
    params = jax.tree_util.tree_map(jnp.asarray, checkpoints.load_t5x_checkpoint(
        path, config.model, dtype='float32'))
    with open(os.path.join(path, 'train_state.msgpack'), 'rb') as f:
      opt_state = flax.serialization.from_state_dict(
          state.opt_state, flax.serialization.msgpack_restore(f.read()))
    state = TrainState(jnp.asarray(step, jnp.int32), params,
                       jax.tree_util.tree_map(jnp.asarray, opt_state))
    print(f'resumed from {path} at step {step}', flush=True)

  log_path = os.path.join(config.model_dir, 'train_log.jsonl')
  count = sum(int(np.prod(x.shape))
              for x in jax.tree_util.tree_leaves(state.params))
  print(f'training {count:,} parameters for {config.num_steps} steps; '
        f'{len(sampler.shapes())} batch shapes', flush=True)
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
      record = {'step': done,
                'tokens_per_second': tokens / max(elapsed, 1e-9),
                'time': time.time()}
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
        record.update(evaluate(eval_step, state.params, eval_sampler,
                               config.mixture, config.eval_examples))
        if agreement_sampler:
          record.update(evaluate_agreement(
              eval_step, state.params, agreement_sampler, config.mixture,
              config.eval_examples))
        metrics = record
      print(json.dumps(record), flush=True)
      with open(log_path, 'a') as f:
        f.write(json.dumps(record) + '\n')
    if done % config.checkpoint_every == 0 or last:
      save_train_state(config.model_dir, state, config.keep_checkpoints)
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
