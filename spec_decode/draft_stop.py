"""Adaptive draft length: the draft stops proposing when it is unsure.

With `draft_stop`, a row's draft stops proposing (in this iteration) as soon
as its own distribution for the next token looks unsure: its largest
probability is below `draft_threshold` ('confidence') or its entropy in nats
is above it ('entropy'). It always proposes at least one token. The proposal
loop exits as soon as every row has stopped, which is where the time is
saved; positions after a row's stop are never accepted, and its correction
after a fully accepted shorter block is the bonus token drawn from p.

Why this stays exact: the stop decision reads only the draft's own
distribution after the drafted prefix, i.e. it is a function of that prefix.
A stopped block is then exactly the block of a modified draft that, after
such a prefix, proposes an "end" symbol the target never emits (p = 0): its
acceptance probability is 0, its residual max(w p - 0, 0) normalises to p,
and every later weight is 0. Token and block verification are exact for any
draft that is a function of the prefix, so they are for this one. (A rule
that peeked at the target's scores or at the acceptance uniforms would not
be such a function of the prefix alone.)

The rules read the draft's unprocessed distribution, softmax(logits), so
they behave alike under greedy decoding (where the processed distribution is
one-hot) and sampling.
"""

from typing import Any, Optional, Tuple

import jax
import jax.numpy as jnp

from spec_decode import validation

Array = jax.Array

RULES = ('confidence', 'entropy')


def check_draft_stop(draft_stop: Any, draft_threshold: Any
                     ) -> Optional[Tuple[str, float]]:
  """Checks the stop rule and its threshold.

  Args:
    draft_stop: None, 'confidence' or 'entropy'.
    draft_threshold: With 'confidence', a probability in (0, 1]: stop when
      the draft's largest probability is below it. With 'entropy', a number
      of nats >= 0: stop when the draft's entropy is above it. None (and
      only None) without a rule.

  Returns:
    None, or (rule, threshold as a float): hashable, for a static argument.

  Raises:
    TypeError, ValueError: The message names the offending argument.
  """
  if draft_stop is None:
    if draft_threshold is not None:
      raise ValueError(f'draft_threshold needs draft_stop (one of '
                       f"'confidence', 'entropy'), got draft_threshold="
                       f'{draft_threshold!r} with draft_stop=None.')
    return None
  if not isinstance(draft_stop, str) or draft_stop not in RULES:
    raise ValueError(f"draft_stop must be None, 'confidence' or 'entropy', "
                     f'got {draft_stop!r}.')
  if draft_threshold is None:
    raise ValueError(f'draft_threshold must be given with '
                     f'draft_stop={draft_stop!r}.')
  threshold = validation.check_float('draft_threshold', draft_threshold)
  if draft_stop == 'confidence' and not 0.0 < threshold <= 1.0:
    raise ValueError(f"draft_threshold must be in (0, 1] with draft_stop="
                     f"'confidence' (a probability), got {threshold}.")
  if draft_stop == 'entropy' and threshold < 0.0:
    raise ValueError(f"draft_threshold must be >= 0 with draft_stop="
                     f"'entropy' (nats), got {threshold}.")
  return draft_stop, threshold


def is_unsure(logits: Array, rule: Tuple[str, float]) -> Array:
  """Whether the draft stops before proposing from these logits.

  Args:
    logits: float [batch, vocab] the draft's raw logits.
    rule: (name, threshold) from `check_draft_stop`.

  Returns:
    bool [batch].
  """
  name, threshold = rule
  logprobs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  probs = jnp.exp(logprobs)
  if name == 'confidence':
    return jnp.max(probs, axis=-1) < threshold
  # 0 log 0 = 0: masked tokens (-inf logits) add nothing.
  entropy = -jnp.sum(jnp.where(probs > 0, probs * logprobs, 0.0), axis=-1)
  return entropy > threshold


def never_accept_past(uniforms: Array, count: Array) -> Array:
  """Uniforms of 1 after each row's proposals, so none is ever accepted.

  Both rules accept position i only when u_i < a number <= 1. With q = 0
  there (from `drafting.propose`), the position before is treated as the
  end of the block: the bonus token after it comes from p.

  Args:
    uniforms: float32 [batch, gamma] in [0, 1).
    count: int32 [batch] proposals per row.

  Returns:
    float32 [batch, gamma].
  """
  positions = jnp.arange(uniforms.shape[1], dtype=jnp.int32)
  return jnp.where(positions < count[:, None], uniforms, 1.0)
