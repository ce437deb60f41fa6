"""One of two processes decoding over one mesh of 2 x 4 host CPU devices.

  python tests/sharded/multiprocess_worker.py PORT PROCESS_ID

Started by tests/test_partitioning.py. Each process builds the same model
and inputs, decodes them unsharded on its own first device, then over the
global (2, 4) mesh (rows split across the processes) and prints OK when
both agree token for token.
"""

import os
import sys

os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=4'

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
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
  print('OK', jax.process_index(), flush=True)


if __name__ == '__main__':
  main(*sys.argv[1:])
