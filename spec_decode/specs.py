"""Where a model and held-out inputs come from, as gin-bindable values.

`ModelSpec` names a shipped model or a T5X config and checkpoint; `DataSpec`
a local task split or a seqio task. Decoding (`infer`), the paper's
comparisons (`reproduce`) and the gin files in `configs/models/`,
`configs/local/` and `configs/paper/` share them.
"""

import dataclasses
import os
from typing import Any, List, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import checkpoints
from spec_decode import device_mesh
from spec_decode import evaluation
from spec_decode import hf_checkpoints
from spec_decode import partitioning
from spec_decode import pretrained
from spec_decode.data import tasks
from spec_decode.model import Model
from spec_decode.model import param_shapes
from spec_decode.model import parameter_count
from spec_decode.model import T5Config


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Where a model comes from: a shipped name, a T5X config and checkpoint,
  or a Hugging Face checkpoint folder.

  Attributes:
    label: Name shown in tables (e.g. 'T5-small').
    pretrained: A `spec_decode.pretrained.available()` name, or None.
    config: Architecture, when loading from `checkpoint`.
    checkpoint: T5X checkpoint path (local or gs://), when not `pretrained`.
    dtype: Activation dtype; parameters are cast to it on read.
    eos_id: The vocabulary's EOS id (a Hugging Face folder's config.json
      sets its own).
    hf_checkpoint: A Hugging Face T5 folder (config.json, safetensors);
      config and EOS id come from its config.json, and its spiece.model,
      when present, is its vocabulary (`vocabulary`).
  """
  label: str
  pretrained: Optional[str] = None
  config: Optional[T5Config] = None
  checkpoint: Optional[str] = None
  dtype: str = 'float32'
  eos_id: int = 1
  hf_checkpoint: Optional[str] = None

  def describe(self) -> str:
    if self.pretrained:
      return f'{self.label}: shipped model {self.pretrained!r} ({self.dtype})'
    if self.hf_checkpoint:
      return (f'{self.label}: Hugging Face checkpoint '
              f'{self.hf_checkpoint!r} ({self.dtype})')
    return (f'{self.label}: T5X checkpoint {self.checkpoint!r}, config '
            f'{self.config}')

  def model_config(self) -> T5Config:
    """The architecture, without reading any weights."""
    if self.pretrained:
      return T5Config(**{**pretrained.info(self.pretrained)['config'],
                         'dtype': self.dtype})
    if self.hf_checkpoint:
      return hf_checkpoints.hf_model_config(self.hf_checkpoint, self.dtype)
    if self.config is None or self.checkpoint is None:
      raise ValueError(f'{self.label}: give pretrained=..., or both config '
                       'and checkpoint.')
    return self.config.replace(dtype=self.dtype)

  def vocabulary(self, path: Optional[str] = None) -> Any:
    """The model's SentencePiece vocabulary (`data.tokenizer.Vocabulary`).

    Args:
      path: A SentencePiece model file; None is the `spiece.model` of a
        Hugging Face folder when it has one, else the shipped vocabulary
        (`spec_decode.pretrained.vocabulary()`). A T5X checkpoint of T5
        needs T5's own (`sentencepiece.model` of `cc_all.32000`), copied
        locally.
    """
    folder = self.hf_checkpoint
    if (path is None and folder
        and os.path.isfile(os.path.join(folder, 'spiece.model'))):
      path = os.path.join(folder, 'spiece.model')
    if path is None:
      return pretrained.vocabulary()
    from spec_decode.data.tokenizer import Vocabulary  # pylint: disable=g-import-not-at-top
    return Vocabulary(path)

  def load(self, plan: Optional[partitioning.Partitioning] = None) -> Model:
    """Loads the model; with `plan`, each device reads only its shards."""
    if self.pretrained:
      model = pretrained.load(self.pretrained, dtype=self.dtype)
    elif self.hf_checkpoint:
      model = hf_checkpoints.load_hf_checkpoint(self.hf_checkpoint,
                                                dtype=self.dtype)
    else:
      config = self.model_config()
      params = checkpoints.load_t5x_checkpoint(
          self.checkpoint, config, dtype=self.dtype,
          mesh=None if plan is None else plan.mesh,
          rules=None if plan is None else plan.rules)
      model = Model(config, params, eos_id=self.eos_id)
    # Params read into shards are already placed; shard() records the plan.
    return model if plan is None else model.shard(plan.mesh, plan.rules)


def check_vocabulary(vocabulary: Any, target: T5Config) -> None:
  """Refuses a vocabulary with more pieces than the target has embeddings.

  Models pad their embedding tables (T5's 32,100 pieces live in 32,128
  rows), so the vocabulary may be smaller than the model, never larger.
  Takes the config (`ModelSpec.model_config()`), so a mismatch is refused
  before any weights are read.
  """
  if vocabulary.vocab_size > target.vocab_size:
    raise ValueError(
        f'vocabulary has {vocabulary.vocab_size} pieces but the target only '
        f'{target.vocab_size} embeddings; set vocabulary to the '
        "target's SentencePiece model.")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """How models are laid out over devices (T5X's partitioner settings).

  Attributes:
    num_partitions: Model-parallel size (T5X's `num_partitions`); 'auto'
      picks the smallest that leaves the target's parameters a fair share
      of a device's memory (`device_mesh.choose_num_partitions`). With 1
      on a single device nothing is sharded.
    logical_axis_rules: (logical axis, mesh axis) pairs replacing T5X's
      standard rules; None keeps them.
    shard_draft: Split the draft over 'model' too (default: replicated,
      since a small draft split many ways costs more in collectives than it
      saves).
  """
  num_partitions: Union[int, str] = 1
  logical_axis_rules: Optional[Tuple[Tuple[str, Optional[str]], ...]] = None
  shard_draft: bool = False

  def build(self, target: T5Config, dtype: str
            ) -> Optional[partitioning.Partitioning]:
    """The mesh and rules for `target`, or None for one unsharded device."""
    count = self.num_partitions
    if count == 'auto':
      count = device_mesh.choose_num_partitions(
          parameter_count(param_shapes(target)) * np.dtype(
              jnp.dtype(dtype)).itemsize, target.num_heads)
    if (count == 1 and jax.device_count() == 1
        and self.logical_axis_rules is None):
      return None
    return partitioning.Partitioning.create(
        device_mesh.make_mesh(count), self.logical_axis_rules)

  def plans(self, target: ModelSpec
            ) -> Tuple[Optional[partitioning.Partitioning],
                       Optional[partitioning.Partitioning]]:
    """The target's partitioning and the draft's: the same one with
    `shard_draft`, else None (`generate` replicates the draft over the
    target's mesh)."""
    plan = self.build(target.model_config(), target.dtype)
    return plan, (plan if self.shard_draft else None)

  def load(self, target: ModelSpec, draft: Optional[ModelSpec]
           ) -> Tuple[Model, Optional[Model]]:
    """Loads both models, the target straight into its shards."""
    target_plan, draft_plan = self.plans(target)
    return (target.load(target_plan),
            None if draft is None else draft.load(draft_plan))


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Held-out inputs: a local task split, or a seqio task (TPU VMs).

  Attributes:
    task: A local task ('translate_en_de', 'summarize') or a seqio task name.
    split: Split to read.
    source: 'local' (committed samples, or `data_dir`) or 'seqio'.
    data_dir: Local data folder; None uses the committed samples.
    input_length: Inputs are truncated/padded to this many tokens.
    imports: Modules that register the seqio task (e.g. 't5.data.tasks').
  """
  task: str
  split: str = 'test'
  source: str = 'local'
  data_dir: Optional[str] = None
  input_length: int = 64
  imports: Tuple[str, ...] = ()

  def describe(self) -> str:
    where = ('committed samples' if self.data_dir is None else self.data_dir)
    if self.source == 'seqio':
      where = 'seqio TaskRegistry'
    return f'{self.task}/{self.split} from {where}'

  def load(self, count: int) -> Tuple[np.ndarray, List[str]]:
    """Returns int32 [count, input_length] inputs and reference texts."""
    if self.source == 'local':
      pairs = tasks.load_pairs(self.task, self.split, self.data_dir)[:count]
      enc = evaluation.encode_inputs(pretrained.vocabulary(), self.task,
                                     [s for s, _ in pairs], self.input_length)
      return enc, [t for _, t in pairs]
    if self.source == 'seqio':
      import importlib  # pylint: disable=g-import-not-at-top
      import seqio  # pylint: disable=g-import-not-at-top
      for module in self.imports:
        importlib.import_module(module)
      task = seqio.get_mixture_or_task(self.task)
      dataset = task.get_dataset(
          sequence_length={'inputs': self.input_length, 'targets': 256},
          split=self.split, shuffle=False)
      enc, refs = [], []
      for example in dataset.take(count).as_numpy_iterator():
        enc.append(example['inputs'][:self.input_length])
        refs.append(example.get('targets_pretokenized', b'').decode())
      return tasks.pad_batch(enc, self.input_length), refs
    raise ValueError(f"source must be 'local' or 'seqio', got "
                     f'{self.source!r}.')
