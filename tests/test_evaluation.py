"""Inputs for timing runs: padding beyond what a batch uses is dropped."""

import numpy as np

import spec_decode as sd
from spec_decode import evaluation

from conftest import random_inputs
from conftest import random_model


def test_trim_padding_keeps_every_token_and_rounds_up():
  tokens = np.zeros((2, 64), np.int32)
  tokens[0, :5] = 7
  tokens[1, :18] = 3
  trimmed = evaluation.trim_padding(tokens, multiple=16)
  assert trimmed.shape == (2, 32)
  np.testing.assert_array_equal(trimmed, tokens[:, :32])
  assert evaluation.trim_padding(tokens[:1], multiple=16).shape == (1, 16)
  # Never longer than the input, even when rounding up would be.
  assert evaluation.trim_padding(tokens[:, :20], multiple=16).shape == (2, 20)
  # An all-padding batch keeps one bucket.
  assert evaluation.trim_padding(np.zeros((1, 64), np.int32)).shape == (1, 16)


def test_trimmed_inputs_decode_to_the_same_outputs():
  model = random_model(0)
  enc = random_inputs(3, 40, 512, seed=4, min_length=3)
  enc[:, 12:] = 0  # Rows use at most 12 of 40 columns.
  trimmed = evaluation.trim_padding(enc)
  assert trimmed.shape == (3, 16)
  full = sd.generate(model, enc, max_decode_len=10)
  short = sd.generate(model, trimmed, max_decode_len=10)
  np.testing.assert_array_equal(np.asarray(full.tokens),
                                np.asarray(short.tokens))
  np.testing.assert_allclose(np.asarray(full.token_logprobs),
                             np.asarray(short.token_logprobs), atol=1e-5)
