"""Length-bucketed batches of tokenized splits, reproducible step by step.

Each batch pads its examples to one (input bucket, target bucket) pair, so
little compute goes to padding and a jitted step compiles once per pair.
"""

from typing import (Dict, Iterator, List, Optional, Sequence, Tuple,
                    TYPE_CHECKING)

import numpy as np

from spec_decode.data import tasks

if TYPE_CHECKING:
  # For annotations only: data/ does not depend on the model code at run time.
  from spec_decode import distill

INPUT_BUCKETS = (32, 64, 128)
TARGET_BUCKETS = (16, 32, 64, 96)


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
               teacher: Optional[
                   Dict[str, 'distill.DistillationTargets']] = None,
               max_input_length: int = INPUT_BUCKETS[-1],
               input_buckets: Sequence[int] = INPUT_BUCKETS,
               target_buckets: Sequence[int] = TARGET_BUCKETS,
               eos_id: int = 1):
    """Groups every task's examples by bucket.

    Args:
      splits: task -> its tokenized examples.
      mixture: task -> sampling rate (any positive scale).
      batch_tokens: Padded tokens (input + target) per batch.
      seed: Data order.
      teacher: task -> the teacher's top-k distributions over the split's
        targets, added to batches as 'soft_ids' and 'soft_probs'.
      max_input_length: Longer inputs are cut to the largest input bucket
        not above it.
      input_buckets: Padded input lengths.
      target_buckets: Padded target lengths.
      eos_id: The vocabulary's EOS id, which cut inputs end with.
    """
    self._splits = splits
    self._input_buckets = tuple(b for b in input_buckets
                                if b <= max_input_length) or (
                                    max_input_length,)
    self._target_buckets = tuple(target_buckets)
    self._teacher = teacher
    self._eos_id = eos_id
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
    inputs = [tasks.truncate_keeping_eos(split.input(i), input_len,
                                         self._eos_id) for i in indices]
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
