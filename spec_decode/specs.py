"""Where a model and held-out inputs come from, as gin-bindable values.

`ModelSpec` names a shipped model or a T5X config and checkpoint; `DataSpec`
a local task split or a seqio task. Decoding (`infer`), the paper's
comparisons (`reproduce`) and the gin files in `configs/models/`,
`configs/local/` and `configs/paper/` share them.
"""

import dataclasses
from typing import List, Optional, Tuple

import numpy as np

from spec_decode import checkpoints
from spec_decode import evaluation
from spec_decode import pretrained
from spec_decode.data import tasks
from spec_decode.model import Model
from spec_decode.model import T5Config


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Where a model comes from: a shipped name, or a config and checkpoint.

  Attributes:
    label: Name shown in tables (e.g. 'T5-small').
    pretrained: A `spec_decode.pretrained.available()` name, or None.
    config: Architecture, when loading from `checkpoint`.
    checkpoint: T5X checkpoint path (local or gs://), when not `pretrained`.
    dtype: Activation dtype; parameters are cast to it on read.
    eos_id: The vocabulary's EOS id.
  """
  label: str
  pretrained: Optional[str] = None
  config: Optional[T5Config] = None
  checkpoint: Optional[str] = None
  dtype: str = 'float32'
  eos_id: int = 1

  def describe(self) -> str:
    if self.pretrained:
      return f'{self.label}: shipped model {self.pretrained!r} ({self.dtype})'
    return (f'{self.label}: T5X checkpoint {self.checkpoint!r}, config '
            f'{self.config}')

  def load(self) -> Model:
    if self.pretrained:
      return pretrained.load(self.pretrained, dtype=self.dtype)
    if self.config is None or self.checkpoint is None:
      raise ValueError(f'{self.label}: give pretrained=..., or both config '
                       'and checkpoint.')
    config = self.config.replace(dtype=self.dtype)
    params = checkpoints.load_t5x_checkpoint(self.checkpoint, config,
                                             dtype=self.dtype)
    return Model(config, params, eos_id=self.eos_id)


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
