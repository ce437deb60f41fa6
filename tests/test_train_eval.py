"""Evaluation as training reports it: expected acceptance under sampling."""

import jax
import numpy as np
import pytest

from conftest import random_model
from spec_decode import sampling
from spec_decode import train_eval
from spec_decode.data import batching
from spec_decode.data import tasks


def _sampler(seed: int = 0, examples: int = 6):
  rng = np.random.RandomState(seed)
  inputs = [list(rng.randint(3, 512, size=rng.randint(2, 9))) + [1]
            for _ in range(examples)]
  targets = [list(rng.randint(3, 512, size=rng.randint(1, 7))) + [1]
             for _ in range(examples)]
  split = tasks.TokenizedSplit.from_sequences(inputs, targets)
  return split, batching.BatchSampler({'translate_en_de': split},
                                      {'translate_en_de': 1.0}, 512, 0,
                                      max_input_length=32)


def _beta_by_hand(target, draft, split, temperature):
  total = count = 0.0
  for index in range(len(split)):
    enc = split.input(index)[None].astype(np.int32)
    dec = split.target(index)[None].astype(np.int32)
    shifted = np.pad(dec, ((0, 0), (1, 0)))[:, :-1]
    p, q = (np.asarray(jax.nn.softmax(
        np.asarray(m.logits(enc, shifted), np.float64) / temperature, -1))
            for m in (target, draft))
    total += float(np.sum(np.minimum(p, q)))
    count += dec.size
  return total / count


@pytest.mark.parametrize('temperature', [1.0, 0.5])
def test_expected_acceptance_is_mean_overlap_along_the_outputs(temperature):
  target, draft = random_model(0), random_model(1)
  split, sampler = _sampler()
  result = train_eval.expected_acceptance(
      target, draft, sampler, {'translate_en_de': 1.0}, len(split),
      sampling.SamplingConfig(temperature=temperature))
  assert result['translate_en_de/expected_acceptance'] == pytest.approx(
      _beta_by_hand(target, draft, split, temperature), abs=1e-5)


def test_a_draft_equal_to_its_target_is_always_accepted():
  target = random_model(0)
  _, sampler = _sampler()
  result = train_eval.expected_acceptance(
      target, target, sampler, {'translate_en_de': 1.0}, 6)
  assert result['translate_en_de/expected_acceptance'] == pytest.approx(
      1.0, abs=1e-5)


def test_expected_acceptance_refuses_greedy():
  _, sampler = _sampler()
  with pytest.raises(ValueError, match='temperature > 0'):
    train_eval.expected_acceptance(
        random_model(0), random_model(1), sampler, {'translate_en_de': 1.0},
        6, sampling.SamplingConfig(temperature=0.0))
