"""Drafts from a target: teacher data, the closed-form unigram model."""

import jax
import numpy as np

import spec_decode as sd
from spec_decode import distill
from spec_decode.data import tasks

from conftest import random_model


def test_unigram_model_predicts_smoothed_frequencies_everywhere():
  counts = np.array([0, 10, 5, 85, 0], np.int64)
  model = distill.unigram_model(counts)
  logits = np.asarray(model.logits(np.array([[2, 3, 4]]),
                                   np.array([[0, 3, 1, 2]])))
  expected = np.log((counts + 1) / (counts.sum() + 5))
  for position in range(4):
    np.testing.assert_allclose(jax.nn.log_softmax(logits[0, position]),
                               expected, atol=1e-5)


def test_teacher_outputs_and_top_k_align():
  model = random_model(0, vocab_size=64, emb_dim=16, mlp_dim=32)
  rng = np.random.RandomState(0)
  inputs = [list(rng.randint(2, 64, size=n)) + [1] for n in (3, 7, 5)]
  split = tasks.TokenizedSplit.from_sequences(inputs, [[5, 1]] * 3)
  outputs = distill.teacher_outputs(model, split, [0, 1, 2],
                                    max_decode_len=6, batch_size=2,
                                    log_every=0)
  baseline = sd.generate(model, tasks.pad_batch(inputs, 16),
                         max_decode_len=6)
  for i in range(3):
    length = int(baseline.lengths[i])
    np.testing.assert_array_equal(outputs.target(i)[:length],
                                  np.asarray(baseline.tokens)[i, :length])
    assert outputs.target(i)[-1] == 1
  soft = distill.teacher_top_k(model, outputs, k=4, batch_size=2,
                               log_every=0)
  assert soft.ids.shape == (int(outputs.target_offsets[-1]), 4)
  # Greedy outputs are the teacher's argmax, so its top-1 is the output
  # (except an EOS appended to rows that never emitted one).
  emitted = outputs.targets != 1
  np.testing.assert_array_equal(soft.ids[emitted, 0],
                                outputs.targets[emitted])
  assert np.all(np.diff(soft.probs.astype(np.float32), axis=1) <= 1e-3)
