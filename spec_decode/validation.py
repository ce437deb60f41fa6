"""Argument checks that fail early with the argument's name and the rule.

Bad input should never surface as a stack trace from inside XLA or, worse, as a
silently wrong answer (XLA clamps out-of-range gathers and slices).
"""

from typing import Any, Optional

import jax
import numpy as np


def check_tokens(name: str, tokens: Any, vocab_size: Optional[int] = None
                 ) -> np.ndarray:
  """Checks a token-id array and returns it as int32 numpy.

  Args:
    name: The argument's name, used in error messages.
    tokens: A [batch, length] integer array (numpy, jax or nested lists).
    vocab_size: If given, every id must lie in [0, vocab_size).

  Returns:
    The ids as an int32 numpy array.

  Raises:
    TypeError: Not an integer array.
    ValueError: Not 2-D, empty, or ids outside the vocabulary.
  """
  if isinstance(tokens, jax.core.Tracer):
    raise TypeError(f'{name} must be a concrete array, not a traced value; '
                    'call this function outside jax.jit.')
  array = np.asarray(tokens)
  if array.dtype == object or not np.issubdtype(array.dtype, np.integer):
    raise TypeError(
        f'{name} must be an integer array of token ids (int32 [batch, '
        f'length]), got dtype {array.dtype}.')
  if array.ndim != 2:
    raise ValueError(f'{name} must be 2-D [batch, length], got shape '
                     f'{array.shape}.')
  if array.shape[0] < 1 or array.shape[1] < 1:
    raise ValueError(f'{name} must have at least one row and one column, got '
                     f'shape {array.shape}.')
  if vocab_size is not None:
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= vocab_size:
      bad = low if low < 0 else high
      raise ValueError(f'{name} holds id {bad}, outside [0, vocab_size='
                       f'{vocab_size}).')
  return array.astype(np.int32)


def check_int(name: str, value: Any, minimum: int) -> int:
  """Checks that `value` is an integer >= `minimum` and returns it."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (int, np.integer)):
    raise TypeError(f'{name} must be an integer >= {minimum}, got {value!r}.')
  if value < minimum:
    raise ValueError(f'{name} must be an integer >= {minimum}, got {value}.')
  return int(value)


def check_float(name: str, value: Any) -> float:
  """Checks that `value` is a finite real number and returns it."""
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f'{name} must be a number, got {value!r}.')
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise TypeError(f'{name} must be a number, got {value!r}.') from None
  if not np.isfinite(number):
    raise ValueError(f'{name} must be finite, got {number}.')
  return number
