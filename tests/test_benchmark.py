"""Timing helpers the cost profile is built from (what they compute, not
how fast anything is: the clock is replaced by a model of it)."""

import collections

import numpy as np
import pytest

from spec_decode import benchmark

from conftest import random_inputs
from conftest import random_model

STEP = 0.001     # Seconds per emitted position in the modelled clock.
SET_UP = 0.005   # Seconds every run pays once.


def _modelled_clock(fns, repeats, warmup=1):
  """Each run 'takes' SET_UP plus STEP per position it decoded."""
  del warmup
  return {name: [SET_UP + STEP * np.asarray(fn()).shape[1]] * repeats
          for name, fn in fns.items()}


# Sampled rows are the case that can go wrong (greedy rows in the slow suite).
@pytest.mark.parametrize('temperature', [
    pytest.param(0.0, marks=pytest.mark.slow), 1.0])
def test_loop_iterations_are_differenced_over_every_row(temperature,
                                                        monkeypatch):
  # At a temperature the rows of a batch sample different tokens: a short
  # run that stopped on one row's token would run as long as the full one,
  # and the difference would be noise (or nothing) instead of iterations.
  monkeypatch.setattr(benchmark, 'interleaved_timings', _modelled_clock)
  target = random_model(0, vocab_size=256)
  draft = random_model(1, vocab_size=256, num_decoder_layers=1)
  timed = benchmark.loop_iteration_seconds(
      target, draft, random_inputs(4, 8, 256, seed=0), counts=(0, 3),
      max_gamma=3, repeats=1, length=16, temperature=temperature,
      plain=True)
  # Baseline: one position per iteration, so exactly one step, and the
  # set-up is what the call spends once.
  assert timed[0].iteration_seconds == pytest.approx(STEP)
  assert timed[0].call_seconds == pytest.approx(SET_UP)
  # Speculative: 12 positions over fewer iterations (each emits 1..4).
  assert STEP <= timed[3].iteration_seconds <= 4 * STEP + 1e-12
  # gamma='auto''s loop with every row plain: one position per iteration.
  assert timed[benchmark.PLAIN].iteration_seconds == pytest.approx(STEP)
  assert timed[benchmark.PLAIN].call_seconds == pytest.approx(SET_UP)


@pytest.mark.parametrize('count', [1, 2, 3, 4, 5])
def test_each_variant_follows_every_other_equally_often(count):
  orders = benchmark.balanced_orders(count)
  assert all(sorted(row) == list(range(count)) for row in orders)
  follows = collections.Counter(
      (row[i], row[i + 1]) for row in orders for i in range(count - 1))
  pairs = [(a, b) for a in range(count) for b in range(count) if a != b]
  assert set(follows) == set(pairs)
  assert len(set(follows.values())) <= 1


def test_interleaved_timings_rotate_the_order():
  calls = []
  fns = {name: (lambda name=name: calls.append(name)) for name in 'abc'}
  timings = benchmark.interleaved_timings(fns, repeats=6, warmup=1)
  assert {name: len(seconds) for name, seconds in timings.items()} == {
      'a': 6, 'b': 6, 'c': 6}
  timed = calls[3:]  # After one warm-up call each.
  rows = [timed[i:i + 3] for i in range(0, 18, 3)]
  assert rows == [[list('abc')[i] for i in row]
                  for row in benchmark.balanced_orders(3)]
  # `start` continues the rotation where a previous input left it.
  calls.clear()
  benchmark.interleaved_timings(fns, repeats=1, warmup=0, start=7)
  assert calls == [list('abc')[i] for i in benchmark.balanced_orders(3)[1]]


def test_loop_iteration_length_is_checked():
  with pytest.raises(ValueError, match='length'):
    benchmark.loop_iteration_seconds(None, None, None, counts=(0,),
                                     max_gamma=1, length=4)


def test_every_width_of_the_k_curve_covers_the_same_positions(monkeypatch):
  # One decoding loop's calls attend one cache whatever their width, and a
  # K-token call replaces K one-token calls at the same positions: each
  # width makes as many calls as cover the widest width's span, in one
  # cache. Different spans would charge the wide calls for attending
  # further (the kernel skips the cache's masked tail).
  lengths, runs = [], []
  real_init_cache = benchmark.init_cache
  real_timed_calls = benchmark.timed_decoder_calls

  def recording_init_cache(config, batch, length, *args, **kwargs):
    lengths.append(length)
    return real_init_cache(config, batch, length, *args, **kwargs)

  def recording_timed_calls(model, inputs, chunk_len, position, steps,
                            **kwargs):
    runs.append((chunk_len, position, steps))
    return real_timed_calls(model, inputs, chunk_len, position, steps,
                            **kwargs)

  monkeypatch.setattr(benchmark, 'init_cache', recording_init_cache)
  monkeypatch.setattr(benchmark, 'timed_decoder_calls', recording_timed_calls)
  model = random_model(0, vocab_size=256, num_decoder_layers=1)
  variants = {width: (model, width, False) for width in (1, 4)}
  seconds = benchmark.decoder_call_seconds(
      variants, random_inputs(1, 8, 256, seed=0), repeats=1, steps=3,
      position=2)
  assert set(seconds) == {1, 4}
  assert len(lengths) == 4 and set(lengths) == {2 + 3 * 4 + 8}
  assert sorted(runs) == [(1, 2, 2), (1, 2, 12), (4, 2, 2), (4, 2, 3)]


def test_a_cache_shorter_than_the_calls_write_is_refused():
  model = random_model(0, vocab_size=256, num_decoder_layers=1)
  with pytest.raises(ValueError, match='cache_length'):
    benchmark.timed_decoder_calls(model, random_inputs(1, 8, 256, seed=0),
                                  chunk_len=4, position=2, steps=3,
                                  cache_length=13)
