"""Logit processing and token sampling, shared by baseline and speculative.

`process_logits` turns raw logits into the log-probabilities of the
distribution a token is actually drawn from: temperature, then top-k, then
top-p, as T5X's `temperature_sample` applies them. Speculative decoding calls
the same function on the draft's and the target's logits, so the rejection
rule compares exactly the distributions that are sampled from (getting this
wrong is a classic bug: HF #32867, vLLM #9834).

Temperature 0 is greedy decoding. Its distribution is one-hot at the argmax
(first index on ties, as T5X), which makes greedy a special case of the same
code paths: sampling from a one-hot picks the argmax, and the rejection rule on
one-hot distributions accepts exactly when the argmaxes agree.
"""

import dataclasses

import jax
import jax.numpy as jnp

from spec_decode import validation

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a sampling distribution (hashable, jit-static).

  Attributes:
    temperature: 0 for greedy, else logits are divided by it.
    top_k: Keep the k largest logits (ties kept); 0 keeps all.
    top_p: Keep the smallest set of most likely tokens whose probability
      reaches top_p (ties kept); 1.0 keeps all.
  """
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    temperature = validation.check_float('temperature', self.temperature)
    if temperature < 0:
      raise ValueError(f'temperature must be >= 0 (0 is greedy), got '
                       f'{temperature}.')
    top_k = validation.check_int('top_k', self.top_k, 0)
    top_p = validation.check_float('top_p', self.top_p)
    if not 0.0 < top_p <= 1.0:
      raise ValueError(f'top_p must be in (0, 1], got {top_p}.')
    object.__setattr__(self, 'temperature', temperature)
    object.__setattr__(self, 'top_k', top_k)
    object.__setattr__(self, 'top_p', top_p)

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def argmax(x: Array) -> Array:
  """`jnp.argmax(x, axis=-1)` (the first maximum; the first NaN if any).

  XLA:CPU lowers argmax to a reduce over (value, index) pairs that does not
  vectorise: ~40 us per row at a vocabulary of 8000 on a 2-core EPYC, paid
  for every processed and drawn token of both decoders. The maximum, then
  the smallest index holding it, are two plain reductions, ~3x cheaper.

  Args:
    x: [..., n] values (float or bool).

  Returns:
    int32 [...] indices.
  """
  best = jnp.max(x, axis=-1, keepdims=True)
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  # x != x is NaN, which jnp.argmax reports first.
  hit = (x == best) | (x != x)
  return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)


def process_logits(logits: Array, sampling: SamplingConfig) -> Array:
  """Log-probabilities of the distribution tokens are drawn from.

  Args:
    logits: float [..., vocab] raw model logits.
    sampling: Temperature, top-k and top-p.

  Returns:
    float32 [..., vocab] normalised log-probabilities; -inf marks tokens that
    cannot be drawn.
  """
  logits = logits.astype(jnp.float32)
  if sampling.greedy:
    best = argmax(logits)
    one_hot = jax.nn.one_hot(best, logits.shape[-1], dtype=jnp.bool_)
    return jnp.where(one_hot, 0.0, -jnp.inf)
  scaled = logits / sampling.temperature
  if 0 < sampling.top_k < logits.shape[-1]:
    kth_largest = jax.lax.top_k(scaled, sampling.top_k)[0][..., -1:]
    scaled = jnp.where(scaled >= kth_largest, scaled, -jnp.inf)
  if sampling.top_p < 1.0:
    probs = jax.nn.softmax(scaled, axis=-1)
    sorted_probs = -jnp.sort(-probs, axis=-1)
    cumulative = jnp.cumsum(sorted_probs, axis=-1)
    # The last kept token is the first whose cumulative mass reaches top_p.
    last_kept = jnp.minimum(
        jnp.sum(cumulative < sampling.top_p, axis=-1, keepdims=True),
        logits.shape[-1] - 1)
    threshold = jnp.take_along_axis(sorted_probs, last_kept, axis=-1)
    scaled = jnp.where(probs >= threshold, scaled, -jnp.inf)
  return jax.nn.log_softmax(scaled, axis=-1)


def row_keys(rng: Array, batch_size: int) -> Array:
  """One key per row, so a row's draws do not depend on the batch size."""
  return jax.vmap(jax.random.fold_in, (None, 0))(
      rng, jnp.arange(batch_size, dtype=jnp.uint32))


def fold_in_rows(keys: Array, data: Array) -> Array:
  """Folds the same `data` (e.g. a step counter) into every row's key."""
  return jax.vmap(jax.random.fold_in, (0, None))(keys, data)


def sample_tokens(keys: Array, logprobs: Array, greedy: bool) -> Array:
  """Draws one token per row.

  Args:
    keys: [batch] per-row keys (unused when greedy).
    logprobs: float32 [batch, vocab] from `process_logits` (or any
      normalised log-distribution).
    greedy: Take the argmax instead of sampling.

  Returns:
    int32 [batch] tokens.
  """
  if greedy:
    return argmax(logprobs)
  # Inverse-CDF sampling: one uniform per row against the running sum of the
  # probabilities. As exact as the Gumbel-max trick of
  # `jax.random.categorical` (both up to float32 rounding), and on CPU about
  # four times cheaper at a vocabulary of 8000 (processing and drawing: 0.41
  # -> 0.11 ms on a 2-core AVX2 EPYC; one random number per row instead of
  # two logarithms per token): the draft draws once per proposal, so an
  # iteration pays it gamma + 1 times.
  probs = jnp.exp(logprobs)  # [batch, vocab]; 0 where logprobs is -inf
  cumulative = jnp.cumsum(probs, axis=-1)
  uniforms = jax.vmap(lambda key: jax.random.uniform(key, ()))(keys)
  threshold = uniforms * cumulative[:, -1]  # [batch], below the total mass
  token = jnp.sum(cumulative <= threshold[:, None], axis=-1)
  # Rounding could put the threshold at the total: never step past the
  # last token that can be drawn.
  vocab = logprobs.shape[-1]
  last_possible = vocab - 1 - argmax(probs[:, ::-1] > 0)
  return jnp.minimum(token, last_possible).astype(jnp.int32)


def token_logprobs(logits: Array, tokens: Array) -> Array:
  """log softmax(logits)[token]: the model's own (unprocessed) log-prob."""
  logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logprobs, tokens[..., None], axis=-1)[..., 0]
