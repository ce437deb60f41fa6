"""Shared test helpers: fixture paths, tiny models, statistics."""

import contextlib
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import spec_decode as sd
from spec_decode import cost_cache
from spec_decode import costs

# ../shared/fixtures relative to the project root: ground truth computed by
# T5X itself. Tests skip only when the whole folder is absent.
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), '..', 'shared', 'fixtures')
T5X_TINY = os.path.join(FIXTURES, 't5x_tiny')
T5X_TINY_PERTURBED = os.path.join(FIXTURES, 't5x_tiny_perturbed')

# Statistical tests reject at this false-alarm rate (each is seeded, so a
# given checkout either always passes or always fails).
FALSE_ALARM_RATE = 1e-3


# tests/sharded needs 8 host devices, fixed when JAX starts; it runs in its
# own process (started by tests/test_partitioning.py) unless this one has
# them.
if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS',
                                                                ''):
  collect_ignore = ['sharded']


@pytest.fixture(autouse=True, scope='session')
def _own_cost_cache(tmp_path_factory):
  """gamma='auto' keeps measured costs and each pair's acceptance in a file
  (`cost_cache`); tests keep theirs apart from the user's, so a local run
  neither reads what the user's decoding measured nor moves its priors (as
  in CI, where no such file exists)."""
  variable = cost_cache.CACHE_DIR_ENV
  before = os.environ.get(variable)
  os.environ[variable] = str(tmp_path_factory.mktemp('cost_cache'))
  yield
  if before is None:
    os.environ.pop(variable, None)
  else:
    os.environ[variable] = before


@contextlib.contextmanager
def decoder_compiles():
  """Yields the names of the decoders' programs compiled inside the block
  (read from the persistent compilation cache too: a program loaded from
  it is still a compile in the middle of a run)."""
  names = []
  programs = ('jit(baseline_generate)', 'jit(_speculative_generate)',
              'jit(_baseline_as_auto)')

  def listener(event, duration, **kwargs):
    del duration
    if (event == '/jax/core/compile/backend_compile_duration'
        and kwargs.get('fun_name') in programs):
      names.append(kwargs['fun_name'])

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'slow: statistical or end-to-end tests; run with -m slow')


requires_fixtures = pytest.mark.skipif(
    not os.path.isdir(FIXTURES),
    reason='../shared/fixtures (T5X ground truth) is not present')


def tiny_config(**overrides) -> sd.T5Config:
  """The T5X test model's shape, in float32."""
  return sd.t5_config('t5_1_1_tiny', dtype='float32', **overrides)


@functools.lru_cache(maxsize=None)
def t5x_model(name: str) -> sd.Model:
  """A T5X fixture model: 't5x_tiny' (msgpack) or 't5x_tiny_perturbed'."""
  path = {'t5x_tiny': os.path.join(T5X_TINY, 'checkpoint_0'),
          't5x_tiny_perturbed': os.path.join(T5X_TINY_PERTURBED,
                                             'checkpoint_1')}[name]
  config = tiny_config()
  return sd.Model(config, sd.load_t5x_checkpoint(path, config))


@functools.lru_cache(maxsize=None)
def golden(name: str):
  folder = {'t5x_tiny': T5X_TINY, 't5x_tiny_perturbed': T5X_TINY_PERTURBED}
  return dict(np.load(os.path.join(folder[name], 'golden.npz')))


@functools.lru_cache(maxsize=None)
def random_model(seed: int = 0, **overrides) -> sd.Model:
  """A random-weight float32 model; small by default."""
  fields = dict(vocab_size=512, emb_dim=32, num_heads=4, head_dim=8,
                mlp_dim=64, num_encoder_layers=2, num_decoder_layers=2,
                dtype='float32')
  fields.update(overrides)
  config = sd.T5Config(**fields)
  return sd.Model(config, sd.init_params(config, jax.random.PRNGKey(seed)))


@functools.lru_cache(maxsize=None)
def bfloat16_valued(model: sd.Model) -> sd.Model:
  """`model` with every weight rounded to a bfloat16 value, kept float32:
  what the shipped models hold (their products then run on AMX tiles where
  the CPU has them)."""
  return sd.Model(model.config, jax.tree_util.tree_map(
      lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)),
      model.params), eos_id=model.eos_id)


def saved_model(folder: str, seed: int, **overrides):
  """A random model with the shipped vocabulary's size, saved as a T5X
  checkpoint under `folder`; returns its `specs.ModelSpec`."""
  from spec_decode import specs  # pylint: disable=g-import-not-at-top
  fields = dict(vocab_size=8000, emb_dim=32, num_heads=2, head_dim=8,
                mlp_dim=48, num_encoder_layers=1, num_decoder_layers=2,
                dtype='float32')
  fields.update(overrides)
  config = sd.T5Config(**fields)
  path = os.path.join(folder, f'model_{seed}')
  sd.save_t5x_checkpoint(path, sd.init_params(config,
                                              jax.random.PRNGKey(seed)))
  return specs.ModelSpec(label=f'random {seed}', config=config,
                         checkpoint=path)


def perturbed(model: sd.Model, scale: float, seed: int) -> sd.Model:
  """`model` with Gaussian noise of relative size `scale` on every weight."""
  leaves, treedef = jax.tree_util.tree_flatten(model.params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [np.asarray(x) + scale * np.std(np.asarray(x)) * np.asarray(
      jax.random.normal(k, np.shape(x))) for x, k in zip(leaves, keys)]
  return sd.Model(model.config, jax.tree_util.tree_unflatten(treedef, noisy),
                  eos_id=model.eos_id)


def random_inputs(batch: int, length: int, vocab: int, seed: int,
                  min_length: int = 1) -> np.ndarray:
  """0-padded encoder inputs of different lengths per row."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(2, vocab, size=(batch, length)).astype(np.int32)
  lengths = rng.randint(min_length, length + 1, size=batch)
  tokens[np.arange(length)[None, :] >= lengths[:, None]] = 0
  return tokens


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
  """Pearson chi-square p-value, pooling outcomes expected < 5 times."""
  counts = np.asarray(counts, np.float64)
  expected = np.asarray(probs, np.float64) * counts.sum()
  assert np.all(counts[expected == 0] == 0), (
      'an outcome of probability 0 was sampled')
  small = expected < 5
  observed = np.append(counts[~small], counts[small].sum())
  expected = np.append(expected[~small], expected[small].sum())
  keep = expected > 0
  observed, expected = observed[keep], expected[keep]
  expected *= observed.sum() / expected.sum()  # float rounding only
  return float(stats.chisquare(observed, expected).pvalue)


def cost_profile_from_curve(verify, c: float = 0.05):
  """A `costs.CostProfile` whose whole iterations cost what their calls do:
  a target call on g + 1 tokens (verify[g] steps) and g draft steps; a
  plain step of the speculative loop costs a baseline step, a call one step
  once, and speculating nothing more."""
  counts = costs.iteration_counts(len(verify) - 1)
  return costs.CostProfile(
      1.0, c, tuple(verify), counts,
      tuple(1.0 if g == 0 else verify[g] + g * c for g in counts),
      tuple(1.0 if g == 0 else verify[g] + g * c for g in counts),
      plain_iteration_seconds=1.0, greedy_plain_iteration_seconds=1.0,
      call_seconds=1.0, call_extra_seconds=0.0)
