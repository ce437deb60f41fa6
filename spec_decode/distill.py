"""Turning a trained target into data its drafts learn from.

Drafts are trained on the target's own greedy outputs (sequence-level
distillation) with the target's top-k next-token distribution at every
position as soft targets (token-level distillation, as DistillSpec does), so
they agree with the target under greedy decoding and under sampling. The
paper's cheap drafts are ordinary `Model`s too: a unigram model in closed form
and a bigram model (a T5 without layers) trained on the same data.
"""

import dataclasses
import os
import time
from typing import Iterator, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import generation
from spec_decode import report
from spec_decode.data import tasks
from spec_decode.model import Model
from spec_decode.model import shift_right
from spec_decode.model import T5Config


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


def _round_up(length: int, multiple: int) -> int:
  return int(np.ceil(length / multiple) * multiple)


def _batches(indices: Sequence[int], split: tasks.TokenizedSplit,
             batch_size: int, max_input_length: int, eos_id: int,
             length_multiple: int = 16
             ) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
  # Sorting by length keeps padding (and compiled shapes) small.
  order = sorted(indices, key=lambda i: split.input_lengths[i])
  for start in range(0, len(order), batch_size):
    chunk = np.array(order[start:start + batch_size])
    length = min(max_input_length,
                 int(np.max(split.input_lengths[chunk])))
    # Few distinct lengths mean few compiled shapes (an accelerator wants a
    # coarse multiple, a CPU a fine one).
    length = min(_round_up(length, length_multiple),
                 _round_up(max_input_length, 16))
    inputs = [tasks.truncate_keeping_eos(split.input(i), length, eos_id)
              for i in chunk]
    yield chunk, tasks.pad_rows(tasks.pad_batch(inputs, length), batch_size)


def teacher_outputs(target: Model, split: tasks.TokenizedSplit,
                    indices: Sequence[int], max_decode_len: int,
                    batch_size: int = 128, max_input_length: int = 64,
                    log_every: int = 20, length_multiple: int = 16
                    ) -> tasks.TokenizedSplit:
  """The target's greedy outputs for `split[indices]` (EOS kept).

  Inputs are padded to a multiple of `length_multiple` tokens.

  Returns:
    A split with the same inputs (truncated as at training) and the target's
    outputs as targets; outputs without EOS get one appended.
  """
  inputs, outputs = {}, {}
  started = time.time()
  for count, (chunk, rows) in enumerate(
      _batches(indices, split, batch_size, max_input_length, target.eos_id,
               length_multiple)):
    result = generation.generate(target, jnp.asarray(rows),
                                 max_decode_len=max_decode_len)
    tokens = np.asarray(result.tokens)
    lengths = np.asarray(result.lengths)
    for row, index in enumerate(chunk):
      out = tokens[row, :lengths[row]]
      if not len(out) or out[-1] != target.eos_id:
        out = np.append(out, target.eos_id)
      inputs[index] = rows[row][rows[row] > 0]
      outputs[index] = out
    if log_every and count % log_every == 0:
      print('  ' + report.progress_line('teacher outputs', len(outputs),
                                        len(indices), started), flush=True)
  order = list(indices)
  return tasks.TokenizedSplit.from_sequences([inputs[i] for i in order],
                                             [outputs[i] for i in order])


def teacher_top_k(target: Model, split: tasks.TokenizedSplit, k: int = 16,
                  batch_size: int = 64, log_every: int = 50,
                  length_multiple: int = 16) -> DistillationTargets:
  """The target's top-k next-token probabilities at every target token.

  Inputs and targets are padded to multiples of `length_multiple` tokens.
  """
  total = int(split.target_offsets[-1])
  ids = np.zeros((total, k), np.uint16)
  probs = np.zeros((total, k), np.float16)

  @jax.jit
  def top_k(logits):
    values, indices = jax.lax.top_k(jax.nn.softmax(logits), k)
    return indices, values

  order = sorted(range(len(split)), key=lambda i: split.target_lengths[i])
  started = time.time()
  for count, start in enumerate(range(0, len(order), batch_size)):
    chunk = order[start:start + batch_size]
    input_len = _round_up(max(split.input_lengths[chunk]), length_multiple)
    target_len = _round_up(max(split.target_lengths[chunk]), length_multiple)
    enc = tasks.pad_rows(
        tasks.pad_batch([split.input(i) for i in chunk], input_len),
        batch_size)
    targets = tasks.pad_rows(
        tasks.pad_batch([split.target(i) for i in chunk], target_len),
        batch_size)
    top_ids, top_probs = top_k(target.logits(enc, shift_right(targets)))
    top_ids, top_probs = np.asarray(top_ids), np.asarray(top_probs)
    for row, index in enumerate(chunk):
      start_offset = split.target_offsets[index]
      n = split.target_lengths[index]
      ids[start_offset:start_offset + n] = top_ids[row, :n]
      probs[start_offset:start_offset + n] = top_probs[row, :n]
    if log_every and count % log_every == 0:
      print('  ' + report.progress_line(f'teacher top-{k}', start + len(chunk),
                                        len(order), started), flush=True)
  return DistillationTargets(ids=ids, probs=probs)


def unigram_model(counts: np.ndarray, eos_id: int = 1,
                  emb_dim: int = 8) -> Model:
  """A unigram draft: a T5 without layers whose embedding rows are equal.

  RMSNorm of a constant all-ones row is all ones, so the logits are the
  column sums of `logits_dense`, set to the add-one smoothed log-frequencies.

  Args:
    counts: [vocab] token counts.
    eos_id: The vocabulary's EOS id.
    emb_dim: Width (any; the model ignores its input either way).

  Returns:
    The model.
  """
  vocab = len(counts)
  config = T5Config(vocab_size=vocab, emb_dim=emb_dim, num_heads=1,
                    head_dim=emb_dim, mlp_dim=emb_dim, num_encoder_layers=0,
                    num_decoder_layers=0, dtype='float32')
  logprobs = np.log((counts + 1.0) / (counts.sum() + vocab))
  kernel = np.tile(logprobs[None, :] / emb_dim, (emb_dim, 1))
  params = {
      'token_embedder': {'embedding': np.ones((vocab, emb_dim), np.float32)},
      'encoder': {'encoder_norm': {'scale': np.ones(emb_dim, np.float32)}},
      'decoder': {'decoder_norm': {'scale': np.ones(emb_dim, np.float32)},
                  'logits_dense': {'kernel': kernel.astype(np.float32)}},
  }
  return Model(config, params, eos_id=eos_id)


def token_counts(split: tasks.TokenizedSplit, vocab_size: int) -> np.ndarray:
  return np.bincount(split.targets.astype(np.int64), minlength=vocab_size)
