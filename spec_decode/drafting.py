"""The draft's side of a speculative iteration: catch up, then propose.

The draft keeps its own cache. `draft_len[b]` says how many leading
positions of row b's draft cache are right: the draft fed them itself,
either while proposing (accepted proposals) or while catching up. At the
start of an iteration a row of n emitted tokens needs positions
draft_len .. n fed (its last token, position n, gives the distribution of
the first proposal):

  * usually one position (n), or two after an iteration that accepted every
    proposal (the last proposal was never fed);
  * more after iterations in which the row, or the whole batch, proposed
    nothing (gamma='auto' skips the draft then).

`catch_up` feeds them in chunks of a few compiled widths; re-feeding a
position that is already right is harmless (same token, same position, same
keys and values), and positions past n are masked and later overwritten.
Then `propose` draws each row's proposals, up to its own count, from the
draft's processed distributions, and may stop a row sooner with a
`draft_stop` rule.
"""

from typing import Any, Callable, Optional, Tuple

import jax
import jax.numpy as jnp

from spec_decode import adaptive
from spec_decode import draft_stop as draft_stop_lib
from spec_decode import sampling as sampling_lib
from spec_decode.model.model import decode_chunk
from spec_decode.sampling import SamplingConfig

Array = jax.Array

# Chunk widths `catch_up` may feed: a fixed gamma never needs more than 2;
# gamma='auto' may fall further behind.
FIXED_CATCH_UP_WIDTHS = (1, 2)
ADAPTIVE_CATCH_UP_WIDTHS = (1, 2, 4, 8)


def slice_rows(array: Array, start: Array, size: int) -> Array:
  """array[b, start[b]:start[b] + size] for every row."""
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice_in_dim(row, s, size))(
      array, start)


def catch_up(config, params, prepared, encoded, cache, inputs: Array,
             lengths: Array, draft_len: Array, widths: Tuple[int, ...]
             ) -> Tuple[Array, Any]:
  """Feeds every row's positions draft_len .. n; the logits at n.

  Args:
    config: The draft's config.
    params: The draft's parameters.
    prepared: The draft's `Model.decode_kernels` (or None).
    encoded: The draft's `EncodedInputs`.
    cache: The draft's cache.
    inputs: int32 [batch, buffer]: 0 then the emitted tokens (position i's
      input is inputs[:, i]); long enough for start + max(widths).
    lengths: int32 [batch] emitted tokens n.
    draft_len: int32 [batch] right positions of each row's draft cache.
    widths: Chunk widths to compile, ascending.

  Returns:
    float32 logits [batch, vocab] at position n, and the cache.
  """
  batch = lengths.shape[0]

  def feed(width):
    def run(cache, start):
      logits, cache = decode_chunk(config, params,
                                   slice_rows(inputs, start, width), start,
                                   cache, encoded, prepared)
      offset = jnp.clip(lengths - start, 0, width - 1)
      return jnp.take_along_axis(logits, offset[:, None, None],
                                 axis=1)[:, 0], cache
    return run

  def cond(carry):
    return jnp.any(carry[2] <= lengths)

  def body(carry):
    logits, cache, fed = carry
    # A row already caught up re-feeds position n (harmless).
    start = jnp.minimum(fed, lengths)
    gap = jnp.max(lengths + 1 - start)
    index = adaptive.width_index(jnp.minimum(gap, widths[-1]), widths)
    chunk_logits, cache = jax.lax.switch(
        index, [feed(width) for width in widths], cache, start)
    width = jnp.asarray(widths)[index]
    logits = jnp.where((lengths < start + width)[:, None], chunk_logits,
                       logits)
    fed = jnp.maximum(fed, jnp.minimum(start + width, lengths + 1))
    return logits, cache, fed

  logits = jnp.zeros((batch, config.vocab_size), jnp.float32)
  logits, cache, _ = jax.lax.while_loop(cond, body,
                                        (logits, cache, draft_len))
  return logits, cache


def propose(decode: Callable[[Any, Array, Array], Tuple[Array, Any]],
            cache: Any, logits: Array, step_keys: Array, max_gamma: int,
            counts: Array, sampling: SamplingConfig,
            stop_rule: Optional[Tuple[str, float]] = None
            ) -> Tuple[Array, Array, Any, Array, Array]:
  """Each row's proposals: up to its count, fewer if its stop rule says so.

  Args:
    decode: (cache, token [batch], i) -> (logits [batch, vocab], cache):
      feeds proposal i (1-based) at position n + i.
    cache: The draft cache, caught up to position n.
    logits: float32 [batch, vocab] the draft's logits at position n.
    step_keys: [batch, max_gamma] per-row keys, one per proposal.
    max_gamma: Most proposals per row (the buffers' size).
    counts: int32 [batch] proposals each row may make, 0 .. max_gamma
      (some row proposes: the loop runs the draft only then).
    sampling: The shared sampling settings.
    stop_rule: None, or a `draft_stop` rule: a row stops before a proposal
      (not the first) whose distribution is unsure.

  Returns:
    tokens int32 [batch, max_gamma] (0 after a row's last proposal), probs
    float32 [batch, max_gamma, vocab] they were drawn from (0 where nothing
    was proposed), the draft cache, int32 [batch] proposals per row, and
    int32 [batch] of those fed to the draft (positions n + 1 .. n + fed
    of its cache hold them).
  """
  batch, vocab = logits.shape

  def draw(logits, i):
    logprobs = sampling_lib.process_logits(logits, sampling)
    return (sampling_lib.sample_tokens(step_keys[:, i], logprobs,
                                       sampling.greedy), jnp.exp(logprobs))

  made = counts > 0
  token, probs_1 = draw(logits, 0)
  tokens = jnp.zeros((batch, max_gamma), jnp.int32).at[:, 0].set(
      jnp.where(made, token, 0))
  probs = jnp.zeros((batch, max_gamma, vocab), jnp.float32).at[:, 0].set(
      jnp.where(made[:, None], probs_1, 0.0))
  proposed = made.astype(jnp.int32)
  zeros = jnp.zeros((batch,), jnp.int32)

  def cond(carry):
    i, stopped = carry[0], carry[1]
    return (i < max_gamma) & ~jnp.all(stopped)

  def body(carry):
    i, stopped, token, cache, tokens, probs, proposed, fed = carry
    # Proposal i goes in at position n + i; its logits give proposal i + 1.
    logits, cache = decode(cache, token, i)
    fed = jnp.where(proposed >= i, i, fed)
    if stop_rule is not None:
      stopped = stopped | draft_stop_lib.is_unsure(logits, stop_rule)
    token, step_probs = draw(logits, i)
    tokens = tokens.at[:, i].set(jnp.where(stopped, 0, token))
    probs = probs.at[:, i].set(jnp.where(stopped[:, None], 0.0, step_probs))
    proposed = proposed + (~stopped).astype(jnp.int32)
    stopped = stopped | (i + 1 >= counts)
    return i + 1, stopped, token, cache, tokens, probs, proposed, fed

  carry = (jnp.ones((), jnp.int32), counts <= 1, token, cache, tokens,
           probs, proposed, zeros)
  _, _, _, cache, tokens, probs, proposed, fed = jax.lax.while_loop(
      cond, body, carry)
  return tokens, probs, cache, proposed, fed
