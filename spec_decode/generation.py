"""`generate`: the one entry point for baseline and speculative decoding.

It validates every argument on the host (so mistakes surface as clear errors
naming the argument, not as XLA stack traces), then calls the jitted core.
"""

from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import decoding
from spec_decode import sampling as sampling_lib
from spec_decode import speculative
from spec_decode import validation
from spec_decode.decoding import DecodeResult
from spec_decode.model import Model

Array = jax.Array


def generate(model: Model, encoder_input_tokens: Any, *, max_decode_len: int,
             temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: Optional[int] = None, rng: Optional[Array] = None,
             draft: Optional[Model] = None, gamma: int = 4,
             lenience: float = 1.0) -> DecodeResult:
  """Decodes with `model`, speculatively when a `draft` model is given.

  Speculative decoding (Leviathan et al. 2023) samples from exactly the
  distribution baseline decoding samples from; under greedy decoding its
  output equals the baseline's token for token.

  Args:
    model: The (target) model.
    encoder_input_tokens: int [batch, enc_len], 0-padded.
    max_decode_len: Maximum number of output tokens (>= 1).
    temperature: 0 for greedy, else the sampling temperature (>= 0).
    top_k: Sample among the k most likely tokens; 0 disables.
    top_p: Nucleus sampling mass in (0, 1]; 1 disables.
    eos_id: End-of-sequence id; defaults to the models' `eos_id` (1).
    rng: `jax.random` key; defaults to `jax.random.PRNGKey(0)`. Each row
      draws from its own stream, so a row's output does not depend on the
      rest of the batch.
    draft: A smaller model with the same vocabulary and EOS id. None runs
      baseline decoding.
    gamma: Draft tokens proposed per iteration (>= 1); speculative only.
    lenience: Paper appendix A.5. 1.0 (default) is exact. Values in (0, 1)
      accept more draft tokens and are LOSSY: outputs no longer follow the
      target's distribution.

  Returns:
    A `DecodeResult`.

  Raises:
    TypeError, ValueError: An argument is malformed; the message names it.
  """
  if not isinstance(model, Model):
    raise TypeError(f'model must be a spec_decode.Model, got '
                    f'{type(model).__name__}.')
  config = model.config
  tokens = validation.check_tokens('encoder_input_tokens',
                                   encoder_input_tokens, config.vocab_size)
  max_decode_len = validation.check_int('max_decode_len', max_decode_len, 1)
  sampling = sampling_lib.SamplingConfig(temperature, top_k, top_p)
  if eos_id is None:
    eos_id = model.eos_id
  eos_id = validation.check_int('eos_id', eos_id, 0)
  if eos_id >= config.vocab_size:
    raise ValueError(f'eos_id must be < vocab_size={config.vocab_size}, got '
                     f'{eos_id}.')
  if rng is None:
    rng = jax.random.PRNGKey(0)
  rng = _check_rng(rng)
  if draft is None:
    return decoding.baseline_generate(config, model.params, tokens, rng,
                                      max_decode_len, sampling, eos_id)
  return speculative.speculative_generate(
      model, draft, tokens, rng=rng, max_decode_len=max_decode_len,
      sampling=sampling, eos_id=eos_id, gamma=gamma, lenience=lenience)


def _check_rng(rng: Any) -> Array:
  """Accepts old-style uint32 [2] keys and new-style typed keys."""
  if isinstance(rng, jax.Array) and jax.dtypes.issubdtype(
      rng.dtype, jax.dtypes.prng_key):
    return rng
  array = np.asarray(rng)
  if array.shape != (2,) or array.dtype != np.uint32:
    raise TypeError(f'rng must be a jax.random key (e.g. '
                    f'jax.random.PRNGKey(0)), got {type(rng).__name__} with '
                    f'shape {array.shape} and dtype {array.dtype}.')
  return jnp.asarray(array)
