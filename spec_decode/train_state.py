"""A training run's saved state: checkpoints to resume from, models to load.

A training folder (`TrainConfig.model_dir`) holds `config.json` and
`checkpoint_<step>/` folders. Each checkpoint is a T5X checkpoint of the
parameters (`checkpoints.save_t5x_checkpoint`) plus `train_state.msgpack`,
the optimizer state, which resuming needs and loading a model does not.
"""

import json
import os
import shutil
from typing import Any, List, Optional, Tuple

import flax
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checkpoints
from spec_decode.model import Model
from spec_decode.model import T5Config

Array = jax.Array

OPTIMIZER_STATE_FILE = 'train_state.msgpack'


@flax.struct.dataclass
class TrainState:
  step: Array
  params: Any
  opt_state: Any


def _checkpoint_folders(model_dir: str) -> List[Tuple[int, str]]:
  """(step, folder name) of every `checkpoint_<step>` folder, by step."""
  steps = ((checkpoints.checkpoint_step(name), name)
           for name in os.listdir(model_dir))
  return sorted((step, name) for step, name in steps if step is not None)


def _latest_checkpoint(model_dir: str) -> Optional[Tuple[int, str]]:
  """The newest checkpoint that has an optimizer state: (step, path)."""
  if not os.path.isdir(model_dir):
    return None
  steps = []
  for step, name in _checkpoint_folders(model_dir):
    path = os.path.join(model_dir, name)
    if os.path.isfile(os.path.join(path, OPTIMIZER_STATE_FILE)):
      steps.append((step, path))
  return max(steps) if steps else None


def save_train_state(model_dir: str, state: TrainState, keep: int) -> str:
  """Writes params (T5X format) and the optimizer state; prunes old ones.

  Args:
    model_dir: The training folder.
    state: The state to save, as `checkpoint_<state.step>`.
    keep: Newest checkpoints kept; older ones are deleted.

  Returns:
    The checkpoint folder written.
  """
  step = int(state.step)
  path = os.path.join(model_dir, f'checkpoint_{step}')
  params = jax.tree_util.tree_map(np.asarray, state.params)
  checkpoints.save_t5x_checkpoint(path, params, step=step)
  opt_bytes = flax.serialization.msgpack_serialize(
      flax.serialization.to_state_dict(
          jax.tree_util.tree_map(np.asarray, state.opt_state)))
  tmp = os.path.join(path, OPTIMIZER_STATE_FILE + '.tmp')
  with open(tmp, 'wb') as f:
    f.write(opt_bytes)
  os.replace(tmp, os.path.join(path, OPTIMIZER_STATE_FILE))
  for _, name in _checkpoint_folders(model_dir)[:-keep]:
    shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)
  return path


def restore_latest(model_dir: str, config: T5Config, initial: TrainState
                   ) -> Optional[Tuple[TrainState, str]]:
  """The newest saved state of a training folder, to resume from.

  Args:
    model_dir: The training folder.
    config: The architecture the parameters must fit.
    initial: A fresh state; its optimizer state gives the saved one's tree.

  Returns:
    The restored state (on the device) and its checkpoint folder, or None
    when the folder holds no checkpoint with an optimizer state.
  """
  latest = _latest_checkpoint(model_dir)
  if latest is None:
    return None
  step, path = latest
  params = jax.tree_util.tree_map(jnp.asarray, checkpoints.load_t5x_checkpoint(
      path, config, dtype='float32'))
  with open(os.path.join(path, OPTIMIZER_STATE_FILE), 'rb') as f:
    opt_state = flax.serialization.from_state_dict(
        initial.opt_state, flax.serialization.msgpack_restore(f.read()))
  state = TrainState(jnp.asarray(step, jnp.int32), params,
                     jax.tree_util.tree_map(jnp.asarray, opt_state))
  return state, path


def load_trained(path: str, eos_id: int = 1) -> Model:
  """A float32 model from a training folder (or one of its checkpoints).

  Args:
    path: A `model_dir` written by `train.train`, or a `checkpoint_<step>`
      folder inside one; a folder loads its newest checkpoint.
    eos_id: The vocabulary's EOS id.

  Returns:
    The model, with the architecture the run's config.json records.
  """
  path = path.rstrip('/')
  run_dir = (os.path.dirname(path)
             if os.path.basename(path).startswith('checkpoint_') else path)
  config_path = os.path.join(run_dir, 'config.json')
  if not os.path.isfile(config_path):
    raise FileNotFoundError(f'{config_path} does not exist: expected a '
                            'training folder written by scripts/train_model.py.')
  with open(config_path) as f:
    fields = json.load(f)['model']
  config = T5Config(**{**fields, 'dtype': 'float32'})
  params = checkpoints.load_t5x_checkpoint(path, config, dtype='float32')
  return Model(config, params, eos_id=eos_id)
