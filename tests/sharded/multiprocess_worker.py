"""One of two processes decoding over one mesh of 2 x 4 host CPU devices.

  python tests/sharded/multiprocess_worker.py PORT PROCESS_ID

Started by tests/test_partitioning.py. Each process builds the same model
and inputs, decodes them unsharded on its own first device, then over the
global (2, 4) mesh (rows split across the processes), and with gamma='auto'
from figures that differ per process, and prints OK when all agree token
for token.
"""

import os
import sys

os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from spec_decode import device_mesh


def main(port: str, process_id: str) -> None:
  device_mesh.initialize_multiprocess(f'localhost:{port}', 2,
                                       int(process_id))
  import spec_decode as sd
  from spec_decode.model import truncated_model
  config = sd.T5Config(vocab_size=256, emb_dim=32, num_heads=8, head_dim=4,
                       mlp_dim=64, num_encoder_layers=1, num_decoder_layers=2,
                       dtype='float32')
  params = sd.init_params(config, jax.random.PRNGKey(0))
  target = sd.Model(config, params)
  draft = truncated_model(target, 1)
  tokens = np.random.RandomState(0).randint(2, 256, size=(6, 7)).astype(
      np.int32)
  tokens[3:, 4:] = 0
  assert jax.device_count() == 8 and jax.local_device_count() == 4
  with jax.default_device(jax.local_devices()[0]):
    expected = [np.asarray(sd.generate(target, tokens, max_decode_len=8,
                                       **kwargs).tokens)
                for kwargs in (dict(), dict(draft=draft, gamma=3))]
  sharded = target.shard(device_mesh.make_mesh(num_partitions=4))
  for want, kwargs in zip(expected, (dict(), dict(draft=draft, gamma=3))):
    got = sd.generate(sharded, tokens, max_decode_len=8, **kwargs)
    np.testing.assert_array_equal(np.asarray(got.tokens), want)
  _auto_agrees_across_processes(sharded, draft, tokens, expected[0])
  print('OK', jax.process_index(), flush=True)


def _auto_agrees_across_processes(sharded, draft, tokens, want) -> None:
  """gamma='auto' with figures that differ per process, as each keeps its
  own on its disk: process 0's say speculate (flat costs, no acceptance
  kept), process 1's say do not (costly calls, acceptance 0). Process 0's
  count on both, so both run the same speculative program."""
  import tempfile
  import spec_decode as sd
  from spec_decode import acceptance
  from spec_decode import cost_cache
  from spec_decode import costs
  sys.path.insert(0, os.path.join(ROOT, 'tests'))
  from conftest import cost_profile_from_curve
  os.environ[cost_cache.CACHE_DIR_ENV] = tempfile.mkdtemp()
  first = jax.process_index() == 0
  verify = ([1.0, 1.0, 1.02, 1.02, 1.05, 1.05, 1.05, 1.05] if first
            else [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
  costs.measure_profile = lambda *args, **kwargs: cost_profile_from_curve(
      verify)
  acceptance.kept_figures = lambda *args: (None, None) if first else (0.0,
                                                                       8.0)
  got = sd.generate(sharded, tokens, max_decode_len=8, draft=draft,
                    gamma='auto')
  np.testing.assert_array_equal(np.asarray(got.tokens), want)
  assert got.gamma == 7, got.gamma
  assert np.asarray(got.proposal_counts)[:, 1:].sum() > 0


if __name__ == '__main__':
  main(*sys.argv[1:])
