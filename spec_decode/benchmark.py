"""Timing helpers: interleaved, warmed-up, medians.

These machines are shared and noisy, so comparisons are ratios measured in one
run: every variant is compiled and run once first, then the variants take
turns, and each call waits for its result (`block_until_ready`).
"""

import statistics
import time
from typing import Any, Callable, Dict, List, Mapping

import jax

from spec_decode.model import Model


def time_call(fn: Callable[[], Any]) -> float:
  """Seconds one call takes, waiting until its device arrays are ready."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def interleaved_timings(fns: Mapping[str, Callable[[], Any]], repeats: int,
                        warmup: int = 1) -> Dict[str, List[float]]:
  """Times several variants in turn after warming each up.

  Args:
    fns: Name -> zero-argument callable returning device arrays.
    repeats: Timed calls per variant.
    warmup: Untimed calls per variant first (compilation).

  Returns:
    Name -> list of seconds per call.
  """
  for fn in fns.values():
    for _ in range(warmup):
      time_call(fn)
  timings = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      timings[name].append(time_call(fn))
  return timings


def median(values: List[float]) -> float:
  return float(statistics.median(values))


def truncated_model(model: Model, num_decoder_layers: int,
                    num_encoder_layers: int = None) -> Model:
  """A draft that shares `model`'s weights but keeps only its first layers.

  Args:
    model: The target.
    num_decoder_layers: Decoder layers to keep.
    num_encoder_layers: Encoder layers to keep (default: all).

  Returns:
    A `Model` with the same vocabulary, embeddings and output layer.
  """
  config = model.config
  if num_encoder_layers is None:
    num_encoder_layers = config.num_encoder_layers
  small = config.replace(num_decoder_layers=num_decoder_layers,
                         num_encoder_layers=num_encoder_layers)
  keep = {'encoder': num_encoder_layers, 'decoder': num_decoder_layers}
  params = {'token_embedder': model.params['token_embedder']}
  for stack, count in keep.items():
    params[stack] = {
        name: value for name, value in model.params[stack].items()
        if not name.startswith('layers_') or int(name.split('_')[1]) < count}
    if not count:
      params[stack].pop('relpos_bias', None)
  return Model(small, params, eos_id=model.eos_id)
