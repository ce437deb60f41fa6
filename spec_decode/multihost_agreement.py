"""What every process of a multi-host slice must decide alike: process 0's.

gamma='auto' chooses its program and the rule's inputs from figures each
process keeps on its own disk: the measured costs (`costs.cost_profile`)
and the pair's kept acceptance (`acceptance.kept_figures`). On a slice every
process runs the same collective programs, so if one process chose another
program, fed the loop other costs, or measured the costs while another did
not, the slice would hang or its rows would disagree. So the figures of
process 0 count on every process. With one process nothing is sent and
everything is returned as it is.
"""

import dataclasses
from typing import Any, Sequence, TypeVar

import jax
from jax.experimental import multihost_utils
import numpy as np

Profile = TypeVar('Profile')


def is_multihost() -> bool:
  return jax.process_count() > 1


def process_zero_values(values: Sequence[float]) -> np.ndarray:
  """float [n] process 0's `values` on every process (the same n on all).

  Sent as float32 (jax's default): every process, process 0 included, gets
  the same rounded values.
  """
  values = np.asarray(values, np.float32)
  if not is_multihost():
    return values
  return np.asarray(multihost_utils.broadcast_one_to_all(values))


def process_zero_flag(flag: bool) -> bool:
  """Process 0's `flag` on every process."""
  return bool(process_zero_values([float(flag)])[0] > 0.5)


def process_zero_profile(profile: Profile) -> Profile:
  """Process 0's copy of a dataclass of numbers and tuples of numbers
  (`costs.CostProfile`), whose tuples have the same lengths on every
  process, on every process."""
  if not is_multihost():
    return profile
  fields = dataclasses.fields(profile)
  parts = [np.atleast_1d(np.asarray(getattr(profile, f.name), np.float64))
           for f in fields]
  agreed = process_zero_values(np.concatenate(parts))
  values = {}
  start = 0
  for field, part in zip(fields, parts):
    own = getattr(profile, field.name)
    chunk = agreed[start:start + part.size]
    start += part.size
    values[field.name] = (tuple(_like(v, own[0]) for v in chunk)
                          if isinstance(own, tuple) else _like(chunk[0], own))
  return dataclasses.replace(profile, **values)


def _like(value: Any, example: Any) -> Any:
  """`value` as the Python type of `example` (int counts stay ints)."""
  return int(round(float(value))) if isinstance(example, int) else float(
      value)
