r"""Packs a training folder into a few small files, and unpacks it again.

  python scripts/pack_run.py pack --run_dir=runs/target --output_dir=/tmp/out
  python scripts/pack_run.py unpack --input_dir=/tmp/out --name=target \
      --run_dir=runs/target

For moving a model trained on a rented accelerator back to where it is
exported and measured, through a channel that takes files of limited size.
The newest checkpoint's parameters travel in bfloat16 (the form they are
shipped in): each value's high byte (sign, exponent: compressible) is
zlib-compressed, its low byte stored as is, and the stream is cut into parts
of at most --part_mib MiB. config.json and train_log.jsonl travel beside
them, so the unpacked folder is a training folder that
`train_state.load_trained` and scripts/export_models.py read (without
optimizer state: it cannot resume).
"""

import glob
import json
import os
import struct
import zlib

from absl import app
from absl import flags
import jax
import ml_dtypes
import numpy as np

from spec_decode import checkpoints
from spec_decode import train_state

FLAGS = flags.FLAGS
flags.DEFINE_string('run_dir', None, 'Training folder to pack / unpack into.')
flags.DEFINE_string('output_dir', None, 'pack: where the parts go.')
flags.DEFINE_string('input_dir', None, 'unpack: where the parts are.')
flags.DEFINE_string('name', None, 'File name prefix of the parts (default: '
                    "the run folder's name).")
flags.DEFINE_float('part_mib', 15.0, 'Largest part, MiB.')


def _flatten(tree, prefix=''):
  for key in sorted(tree):
    path = f'{prefix}/{key}' if prefix else key
    if isinstance(tree[key], dict):
      yield from _flatten(tree[key], path)
    else:
      yield path, tree[key]


def _set(tree, path, value):
  *parents, leaf = path.split('/')
  for key in parents:
    tree = tree.setdefault(key, {})
  tree[leaf] = value


def pack(run_dir: str, output_dir: str, name: str, part_mib: float) -> None:
  model = train_state.load_trained(run_dir)
  step = max(int(p.rsplit('_', 1)[1]) for p in
             glob.glob(os.path.join(run_dir, 'checkpoint_*')))
  leaves = [(path, np.asarray(value).astype(ml_dtypes.bfloat16))
            for path, value in _flatten(jax.device_get(model.params))]
  bits = np.concatenate([v.view(np.uint16).ravel() for _, v in leaves])
  high = zlib.compress((bits >> 8).astype(np.uint8).tobytes(), 6)
  low = (bits & 0xFF).astype(np.uint8).tobytes()
  header = json.dumps({'step': step, 'high_bytes': len(high),
                       'leaves': [[p, list(v.shape)] for p, v in leaves]})
  stream = (struct.pack('<Q', len(header)) + header.encode() + high + low)
  size = int(part_mib * 2**20)
  os.makedirs(output_dir, exist_ok=True)
  for index, start in enumerate(range(0, len(stream), size)):
    with open(os.path.join(output_dir, f'{name}.part{index}'), 'wb') as f:
      f.write(stream[start:start + size])
  for extra in ('config.json', 'train_log.jsonl'):
    with open(os.path.join(run_dir, extra)) as f:
      text = f.read()
    with open(os.path.join(output_dir, f'{name}.{extra}'), 'w') as f:
      f.write(text)
  print(f'{run_dir}: step {step}, {len(bits):,} parameters in '
        f'{len(stream) / 2**20:.1f} MiB', flush=True)


def unpack(input_dir: str, name: str, run_dir: str) -> None:
  parts = sorted(glob.glob(os.path.join(input_dir, f'{name}.part*')),
                 key=lambda p: int(p.rsplit('part', 1)[1]))
  if not parts:
    raise FileNotFoundError(f'no {name}.part* files in {input_dir}')
  stream = b''.join(open(p, 'rb').read() for p in parts)
  (header_len,) = struct.unpack('<Q', stream[:8])
  header = json.loads(stream[8:8 + header_len])
  body = stream[8 + header_len:]
  high = np.frombuffer(zlib.decompress(body[:header['high_bytes']]), np.uint8)
  low = np.frombuffer(body[header['high_bytes']:], np.uint8)
  if high.shape != low.shape:
    raise ValueError(f'{name}: truncated parts ({high.size} vs {low.size} '
                     'bytes)')
  bits = (high.astype(np.uint16) << 8) | low
  params, offset = {}, 0
  for path, shape in header['leaves']:
    count = int(np.prod(shape))
    value = bits[offset:offset + count].view(ml_dtypes.bfloat16)
    _set(params, path, value.reshape(shape))
    offset += count
  os.makedirs(run_dir, exist_ok=True)
  checkpoints.save_t5x_checkpoint(
      os.path.join(run_dir, f"checkpoint_{header['step']}"), params,
      step=header['step'])
  for extra in ('config.json', 'train_log.jsonl'):
    with open(os.path.join(input_dir, f'{name}.{extra}')) as f:
      text = f.read()
    with open(os.path.join(run_dir, extra), 'w') as f:
      f.write(text)
  print(f'{run_dir}: step {header["step"]}, {offset:,} parameters',
        flush=True)


def main(argv):
  if len(argv) != 2 or argv[1] not in ('pack', 'unpack'):
    raise app.UsageError('usage: pack_run.py pack|unpack --flags')
  if argv[1] == 'pack':
    pack(FLAGS.run_dir, FLAGS.output_dir,
         FLAGS.name or os.path.basename(FLAGS.run_dir.rstrip('/')),
         FLAGS.part_mib)
  else:
    unpack(FLAGS.input_dir, FLAGS.name, FLAGS.run_dir)


if __name__ == '__main__':
  app.run(main)
