"""`generate` rejects malformed arguments with a message naming them."""

import jax
import numpy as np
import pytest

import spec_decode as sd

from conftest import random_model

ENC = np.ones((2, 4), np.int32)


@pytest.mark.parametrize('kwargs, error, message', [
    (dict(encoder_input_tokens=np.ones(4, np.int32)), ValueError,
     r'encoder_input_tokens must be 2-D \[batch, length\]'),
    (dict(encoder_input_tokens=np.ones((2, 4, 1), np.int32)), ValueError,
     'encoder_input_tokens must be 2-D'),
    (dict(encoder_input_tokens=np.ones((2, 4), np.float32)), TypeError,
     'encoder_input_tokens must be an integer array'),
    (dict(encoder_input_tokens=[['a', 'b']]), TypeError,
     'encoder_input_tokens must be an integer array'),
    (dict(encoder_input_tokens=np.zeros((0, 4), np.int32)), ValueError,
     'encoder_input_tokens must have at least one row'),
    (dict(encoder_input_tokens=np.full((2, 4), 600)), ValueError,
     r'holds id 600, outside \[0, vocab_size=512\)'),
    (dict(encoder_input_tokens=np.full((2, 4), -3)), ValueError,
     'holds id -3'),
    (dict(max_decode_len=0), ValueError, 'max_decode_len must be an integer '
     '>= 1'),
    (dict(max_decode_len=2.5), TypeError, 'max_decode_len must be an integer'),
    (dict(eos_id=512), ValueError, 'eos_id must be < vocab_size=512'),
    (dict(eos_id=-1), ValueError, 'eos_id must be an integer >= 0'),
    (dict(rng=3), TypeError, 'rng must be a jax.random key'),
    (dict(temperature=-1.0), ValueError, 'temperature must be >= 0'),
    (dict(top_p=0.0), ValueError, r'top_p must be in \(0, 1\]'),
    # Checked without a draft too, so a typo never goes unnoticed.
    (dict(verification='blocks'), ValueError,
     "verification must be one of 'token', 'block', got 'blocks'"),
    (dict(draft_stop='entropic', draft_threshold=1.0), ValueError,
     "draft_stop must be None, 'confidence' or 'entropy'"),
])
def test_bad_arguments(kwargs, error, message):
  arguments = dict(encoder_input_tokens=ENC, max_decode_len=4)
  arguments.update(kwargs)
  with pytest.raises(error, match=message):
    sd.generate(random_model(0), **arguments)


def test_model_must_be_a_model():
  with pytest.raises(TypeError, match='model must be a spec_decode.Model'):
    sd.generate({'params': 1}, ENC, max_decode_len=3)


def test_typed_and_raw_keys_are_accepted():
  model = random_model(0)
  a = sd.generate(model, ENC, max_decode_len=3, temperature=1.0,
                  rng=jax.random.PRNGKey(5))
  b = sd.generate(model, ENC, max_decode_len=3, temperature=1.0,
                  rng=jax.random.key(5))
  assert np.asarray(a.tokens).shape == np.asarray(b.tokens).shape == (2, 3)


def test_lists_of_ints_are_accepted():
  result = sd.generate(random_model(0), [[5, 6, 7]], max_decode_len=2)
  assert np.asarray(result.tokens).shape == (1, 2)
