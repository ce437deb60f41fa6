"""Reading and writing T5X checkpoints.

A T5X checkpoint is a folder `checkpoint_<step>/` holding a msgpack file named
`checkpoint` (flax serialization) with `{'version': 3, 'optimizer': {'target':
params, 'state': {...}}}`. Each parameter leaf is either an inline array
(msgpack ExtType 1) or a tensorstore spec dict pointing at a zarr v2 array in a
sibling folder such as `target.encoder.layers_0.mlp.wi_0.kernel/`. Older
checkpoints lack the `optimizer` wrapper. Local paths and `gs://` paths are
read through the same code (tensorstore key-value stores).

Checkpoints are data, never code: there is no pickle here. Saving writes a
temporary folder and renames it into place, so an interrupted save never
leaves a checkpoint that loads half-written.
"""

import functools
import math
import os
import shutil
import time
from typing import Any, Dict, Optional, Tuple

import flax
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from spec_decode import partitioning
from spec_decode.model import check_params
from spec_decode.model import param_shardings
from spec_decode.model import T5Config

Params = Dict[str, Any]

CHECKPOINT_FILE = 'checkpoint'
_MAX_CHUNK_BYTES = 64 * 1024 * 1024


class CheckpointError(ValueError):
  """A checkpoint exists but cannot be read as a T5X checkpoint."""


def _is_gcs(path: str) -> bool:
  return path.startswith('gs://')


def _join(*parts: str) -> str:
  if _is_gcs(parts[0]):
    return '/'.join(p.strip('/') if i else p.rstrip('/')
                    for i, p in enumerate(parts))
  return os.path.join(*parts)


def _gcs_kvstore(path: str) -> Dict[str, str]:
  bucket, _, prefix = path[len('gs://'):].partition('/')
  return {'driver': 'gcs', 'bucket': bucket, 'path': prefix}


def _exists(path: str) -> bool:
  if not _is_gcs(path):
    return os.path.exists(path)
  parent, _, name = path.rstrip('/').rpartition('/')
  return any(key.decode().split('/')[0] == name
             for key in _list(parent))


def _list(path: str):
  if not _is_gcs(path):
    return [name.encode() for name in os.listdir(path)]
  store = ts.KvStore.open(_gcs_kvstore(path.rstrip('/') + '/')).result()
  return store.list().result()


def _read_bytes(path: str) -> bytes:
  if not _is_gcs(path):
    with open(path, 'rb') as f:
      return f.read()
  directory, _, name = path.rpartition('/')
  store = ts.KvStore.open(_gcs_kvstore(directory + '/')).result()
  result = store.read(name).result()
  if result.state != 'value':
    raise FileNotFoundError(f'{path} does not exist.')
  return result.value


def checkpoint_step(name: str) -> Optional[int]:
  """The step of a `checkpoint_<step>` folder name, or None for other names.

  Args:
    name: A folder name (not a path), e.g. 'checkpoint_1000'.

  Returns:
    The step, or None when `name` is not `checkpoint_` followed by digits.
  """
  prefix = 'checkpoint_'
  if name.startswith(prefix) and name[len(prefix):].isdigit():
    return int(name[len(prefix):])
  return None


def resolve_checkpoint_file(path: str) -> str:
  """Finds the msgpack `checkpoint` file that `path` refers to.

  Args:
    path: The `checkpoint` file itself, a `checkpoint_<step>` folder, or a
      model folder holding `checkpoint_<step>` folders (the highest step wins).

  Returns:
    The path of the msgpack file.

  Raises:
    FileNotFoundError: `path` does not exist or holds no checkpoint.
  """
  path = os.fspath(path)
  if not _exists(path):
    raise FileNotFoundError(f'Checkpoint path {path!r} does not exist.')
  if not _is_gcs(path) and os.path.isfile(path):
    return path
  names = [n.decode().split('/')[0] for n in _list(path)]
  if CHECKPOINT_FILE in names:
    return _join(path, CHECKPOINT_FILE)
  steps = sorted({s for s in map(checkpoint_step, names) if s is not None})
  for step in reversed(steps):
    candidate = _join(path, f'checkpoint_{step}')
    if CHECKPOINT_FILE in [n.decode().split('/')[0]
                           for n in _list(candidate)]:
      return _join(candidate, CHECKPOINT_FILE)
  raise FileNotFoundError(
      f'Checkpoint path {path!r} holds neither a {CHECKPOINT_FILE!r} file nor '
      'checkpoint_<step> folders.')


def _is_tensorstore_spec(leaf: Any) -> bool:
  return isinstance(leaf, dict) and 'driver' in leaf and 'kvstore' in leaf


def _open_zarr(spec: Dict[str, Any], directory: str, key: str) -> Any:
  """Opens one zarr leaf whose kvstore path is relative to `directory`.

  Returns:
    The tensorstore array, not yet read (a mesh reads it shard by shard).
  """
  relative = spec['kvstore'].get('path', '')
  location = _join(directory, relative)
  spec = dict(spec)
  spec['kvstore'] = (_gcs_kvstore(location) if _is_gcs(location) else
                     {'driver': 'file', 'path': location})
  try:
    array = ts.open(spec, open=True, read=True).result()
    # Zarr reads missing chunks as fill values; a truncated copy of a
    # checkpoint must not load as zeros.
    shape, chunks = array.shape, array.chunk_layout.read_chunk.shape
    expected = math.prod(math.ceil(s / c) for s, c in zip(shape, chunks))
    store = ts.KvStore.open(spec['kvstore']).result()
    present = [k for k in store.list().result()
               if not k.decode().split('/')[-1].startswith('.')]
    if len(present) < expected:
      raise CheckpointError(
          f'{location}: parameter {key!r} has {len(present)} of its '
          f'{expected} zarr chunks; the checkpoint is incomplete.')
    return array
  except CheckpointError:
    raise
  except Exception as e:  # tensorstore raises ValueError subclasses.
    raise CheckpointError(
        f'{location}: cannot read parameter {key!r} as zarr: {e}') from e


def _unwrap_target(state: Any, source: str) -> Params:
  if not isinstance(state, dict):
    raise CheckpointError(f'{source}: expected a msgpack dict, got '
                          f'{type(state).__name__}.')
  if 'optimizer' in state:  # version 3 and later
    state = state['optimizer']
  if isinstance(state, dict) and 'target' in state:
    return state['target']
  if isinstance(state, dict) and ('token_embedder' in state
                                  or 'decoder' in state):
    return state  # A bare parameter tree.
  raise CheckpointError(
      f'{source}: no parameters found; expected key "optimizer/target", '
      f'"target" or a parameter tree, got keys {sorted(state)}.')


def _read_slice(source: Any, index: Tuple[slice, ...], dtype: Any,
                what: str) -> np.ndarray:
  """Reads `source[index]` (a numpy array or an open zarr array).

  Args:
    source: The parameter's numpy array or tensorstore array.
    index: One slice per dimension (the whole array, or a device's shard).
    dtype: Cast to this on read, or None.
    what: The file and parameter, for error messages.
  """
  if isinstance(source, np.ndarray):
    value = source[index]
  else:
    try:
      value = np.asarray(source[index].read().result())
    except Exception as e:  # tensorstore raises ValueError subclasses.
      raise CheckpointError(f'{what}: cannot read it as zarr: {e}') from e
  return value if dtype is None else np.asarray(jnp.asarray(value, dtype))


def _read_params(sources: Dict[Tuple[str, ...], Any], file: str,
                 config: Optional[T5Config], dtype: Any, mesh: Any,
                 rules: Any) -> Params:
  """Reads every parameter whole, or (with a mesh) each device's shard."""
  what = lambda key: f'{file}: parameter {"/".join(key)!r}'
  if mesh is None:
    return flax.traverse_util.unflatten_dict({
        key: _read_slice(source, (slice(None),) * source.ndim, dtype,
                         what(key)) for key, source in sources.items()})
  plan = partitioning.Partitioning.create(mesh, rules)
  shardings = flax.traverse_util.flatten_dict(
      param_shardings(config, plan))
  return flax.traverse_util.unflatten_dict({
      key: jax.make_array_from_callback(
          source.shape, shardings[key],
          functools.partial(lambda s, k, index: _read_slice(
              s, index, dtype, what(k)), source, key))
      for key, source in sources.items()})


def load_t5x_checkpoint(path: str, config: Optional[T5Config] = None,
                        dtype: Any = None, mesh: Any = None,
                        rules: Any = None) -> Params:
  """Loads the parameters of a T5X checkpoint.

  Args:
    path: A `checkpoint` file, a `checkpoint_<step>` folder or a folder of
      them (latest step), local or `gs://`.
    config: If given, the tree and every shape must fit it.
    dtype: If given, cast every parameter to it on read (e.g. 'bfloat16').
    mesh: If given (needs `config`), a ('data', 'model') mesh: each device
      reads only its own slice of every zarr parameter, so no device (and
      no host) ever holds a whole replicated copy of a large model; inline
      msgpack leaves, already in host memory, are split the same way.
    rules: Logical axis rules for `mesh` (default T5X's standard rules).

  Returns:
    A nested dict of numpy arrays with T5X's names; with a mesh, of
    `jax.Array`s sharded as `Model.shard` shards them (wrap them with
    `Model(config, params).shard(mesh, rules)`, which keeps the placement).

  Raises:
    FileNotFoundError: Nothing at `path`.
    CheckpointError: Unreadable or truncated file or zarr array (names the
      file and key).
    ValueError: Missing key, unexpected key or wrong shape for `config`.
  """
  path = os.fspath(path)
  if not _is_gcs(path):
    path = os.path.abspath(path)
  file = resolve_checkpoint_file(path)
  directory = file.rpartition('/')[0] if _is_gcs(file) else os.path.dirname(
      file)
  raw = _read_bytes(file)
  try:
    state = flax.serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several unrelated types.
    raise CheckpointError(
        f'{file}: not a readable T5X msgpack checkpoint ({type(e).__name__}: '
        f'{e}); the file may be truncated.') from e
  target = _unwrap_target(state, file)

  flat = flax.traverse_util.flatten_dict(target, keep_empty_nodes=False,
                                         is_leaf=lambda _, x: (
                                             _is_tensorstore_spec(x)))
  if mesh is not None and config is None:
    raise ValueError('load_t5x_checkpoint: mesh needs config (the logical '
                     'axes of each parameter come from it).')
  sources = {}
  for key_path, leaf in flat.items():
    key = '/'.join(key_path)
    if _is_tensorstore_spec(leaf):
      sources[key_path] = _open_zarr(leaf, directory, key)
    elif isinstance(leaf, (np.ndarray, jax.Array, np.generic)):
      sources[key_path] = np.asarray(leaf)
    else:
      raise CheckpointError(f'{file}: parameter {key!r} is neither an array '
                            f'nor a tensorstore spec: {leaf!r}.')
  if config is not None:
    check_params(config, flax.traverse_util.unflatten_dict(sources),
                 source=file)
  return _read_params(sources, file, config, dtype, mesh, rules)


def _zarr_spec(relative: str, array: np.ndarray) -> Dict[str, Any]:
  """The tensorstore spec T5X stores for a leaf, with chunks <= 64 MiB."""
  shape = list(array.shape)
  chunks = list(shape)
  if shape:
    row_bytes = array.itemsize * math.prod(shape[1:])
    chunks[0] = max(1, min(shape[0], _MAX_CHUNK_BYTES // max(row_bytes, 1)))
  return {
      'driver': 'zarr',
      'dtype': array.dtype.name,
      'kvstore': {'driver': 'file', 'path': relative + '/'},
      'metadata': {'chunks': chunks, 'compressor': {'id': 'gzip', 'level': 1},
                   'shape': shape},
  }


def save_t5x_checkpoint(path: str, params: Params, step: int = 0,
                        inline: bool = False) -> str:
  """Writes `params` as a T5X checkpoint folder (e.g. `.../checkpoint_100`).

  The layout is T5X's: a version-3 msgpack `checkpoint` file whose `target`
  leaves are tensorstore specs of gzip zarr arrays named `target.<path>`, or
  inline arrays when `inline` is set. The folder is written under a temporary
  name and renamed into place.

  Args:
    path: The checkpoint folder to create (replaced if it exists). Local only.
    params: Nested dict of arrays.
    step: The training step stored in the checkpoint.
    inline: Store arrays inside the msgpack file instead of zarr folders.

  Returns:
    `path`.
  """
  path = os.fspath(path)
  if _is_gcs(path):
    raise NotImplementedError('Saving to gs:// is not supported; save locally '
                              'and copy.')
  path = path.rstrip('/')
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = f'{path}.tmp-{int(time.time() * 1e6)}'
  os.makedirs(tmp)
  try:
    flat = flax.traverse_util.flatten_dict(params)
    target = {}
    for key_path, value in flat.items():
      array = np.asarray(value)
      if inline:
        target[key_path] = array
        continue
      relative = 'target.' + '.'.join(key_path)
      spec = _zarr_spec(relative, array)
      store = ts.open({**spec, 'kvstore': {'driver': 'file',
                                           'path': os.path.join(
                                               os.path.abspath(tmp),
                                               relative)}},
                      create=True, open=False).result()
      store.write(array).result()
      target[key_path] = spec
    state = {'version': 3, 'optimizer': {
        'target': flax.traverse_util.unflatten_dict(target),
        'state': {'step': np.int32(step), 'param_states': {}}}}
    with open(os.path.join(tmp, CHECKPOINT_FILE), 'wb') as f:
      f.write(flax.serialization.msgpack_serialize(state))
    if os.path.exists(path):
      old = f'{tmp}.old'
      os.rename(path, old)
      os.rename(tmp, path)
      shutil.rmtree(old)
    else:
      os.rename(tmp, path)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
  return path


def checkpoint_info(path: str) -> Tuple[str, int]:
  """Returns the resolved `checkpoint` file of `path` and its step."""
  file = resolve_checkpoint_file(path)
  state = flax.serialization.msgpack_restore(_read_bytes(file))
  step = state.get('optimizer', state).get('state', {}).get('step', 0)
  return file, int(np.asarray(step))
