"""The two tasks (En->De translation, summarization) as files and arrays.

Layout of a data folder (built by `scripts/prepare_data.py`):
  <data_dir>/<task>/<split>.tsv          source<TAB>target text
  <data_dir>/tokenized/<task>_<split>.npz  token ids (see `TokenizedSplit`)
Small samples of every split are committed under `spec_decode/data/samples/`
so tests and the main job run without fetching anything.
"""

import dataclasses
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from spec_decode.data import corpora

TASKS = {
    'translate_en_de': corpora.TRANSLATE_PREFIX,
    'summarize': corpora.SUMMARIZE_PREFIX,
}
SAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           'samples')
# T5 truncates inputs; targets longer than this are dropped from training.
MAX_INPUT_LENGTH = 128
MAX_TARGET_LENGTH = 96


def check_task(task: str) -> str:
  if task not in TASKS:
    raise ValueError(f'task must be one of {sorted(TASKS)}, got {task!r}.')
  return task


def check_split(split: str) -> str:
  if split not in corpora.SPLITS:
    raise ValueError(f'split must be one of {corpora.SPLITS}, got {split!r}.')
  return split


def tsv_path(data_dir: str, task: str, split: str) -> str:
  return os.path.join(data_dir, check_task(task), f'{check_split(split)}.tsv')


def sample_path(task: str, split: str) -> str:
  return os.path.join(SAMPLES_DIR,
                      f'{check_task(task)}_{check_split(split)}.tsv')


def read_pairs(path: str) -> List[corpora.Pair]:
  """Reads (source, target) pairs from a task TSV file."""
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'{path} does not exist; run scripts/prepare_data.py to build the '
        'data, or use the committed samples (data_dir=None).')
  with open(path, encoding='utf-8') as f:
    return list(corpora.read_tsv(f))


def load_pairs(task: str, split: str, data_dir: Optional[str] = None
               ) -> List[corpora.Pair]:
  """A split of a task from `data_dir`, or the committed sample if None."""
  if data_dir is None:
    return read_pairs(sample_path(task, split))
  return read_pairs(tsv_path(data_dir, task, split))


def model_input(task: str, source: str) -> str:
  """The T5 input text: the task prefix, then the source."""
  return TASKS[check_task(task)] + source


@dataclasses.dataclass
class TokenizedSplit:
  """Ragged token arrays of one split: example i is inputs[offsets[i]:...].

  Token ids end with EOS (1). Stored as uint16 (vocabularies < 65536).
  """
  inputs: np.ndarray
  input_offsets: np.ndarray
  targets: np.ndarray
  target_offsets: np.ndarray

  def __len__(self) -> int:
    return len(self.input_offsets) - 1

  def input(self, index: int) -> np.ndarray:
    return self.inputs[self.input_offsets[index]:
                       self.input_offsets[index + 1]].astype(np.int32)

  def target(self, index: int) -> np.ndarray:
    return self.targets[self.target_offsets[index]:
                        self.target_offsets[index + 1]].astype(np.int32)

  @property
  def input_lengths(self) -> np.ndarray:
    return np.diff(self.input_offsets)

  @property
  def target_lengths(self) -> np.ndarray:
    return np.diff(self.target_offsets)

  def save(self, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + '.tmp.npz'
    np.savez(tmp, **dataclasses.asdict(self))
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> 'TokenizedSplit':
    if not os.path.isfile(path):
      raise FileNotFoundError(f'{path} does not exist; run '
                              'scripts/prepare_data.py first.')
    with np.load(path) as arrays:
      return cls(**{f.name: arrays[f.name] for f in dataclasses.fields(cls)})

  @classmethod
  def from_sequences(cls, inputs: Sequence[Sequence[int]],
                     targets: Sequence[Sequence[int]]) -> 'TokenizedSplit':
    def ragged(seqs):
      offsets = np.zeros(len(seqs) + 1, np.int64)
      offsets[1:] = np.cumsum([len(s) for s in seqs])
      flat = (np.concatenate([np.asarray(s, np.uint16) for s in seqs])
              if seqs else np.zeros(0, np.uint16))
      return flat, offsets
    inputs, input_offsets = ragged(inputs)
    targets, target_offsets = ragged(targets)
    return cls(inputs, input_offsets, targets, target_offsets)


def tokenize_pairs(vocabulary, task: str, pairs: Sequence[corpora.Pair],
                   max_input_length: int = MAX_INPUT_LENGTH,
                   max_target_length: int = MAX_TARGET_LENGTH,
                   drop_long_targets: bool = True) -> TokenizedSplit:
  """Tokenizes pairs T5-style: prefix + source -> ids + EOS (truncated).

  Args:
    vocabulary: Has `encode(str) -> list[int]` and `eos_id`.
    task: A key of `TASKS`.
    pairs: (source, target) texts.
    max_input_length: Inputs are truncated to this many ids (EOS included).
    max_target_length: Longer targets are dropped (or truncated if
      `drop_long_targets` is False).
    drop_long_targets: See above.

  Returns:
    The tokenized split.
  """
  inputs, targets = [], []
  for source, target in pairs:
    input_ids = vocabulary.encode(model_input(task, source))
    input_ids = input_ids[:max_input_length - 1] + [vocabulary.eos_id]
    target_ids = vocabulary.encode(target) + [vocabulary.eos_id]
    if len(target_ids) > max_target_length:
      if drop_long_targets:
        continue
      target_ids = target_ids[:max_target_length - 1] + [vocabulary.eos_id]
    inputs.append(input_ids)
    targets.append(target_ids)
  return TokenizedSplit.from_sequences(inputs, targets)


def tokenized_path(data_dir: str, task: str, split: str) -> str:
  return os.path.join(data_dir, 'tokenized',
                      f'{check_task(task)}_{check_split(split)}.npz')


def pad_batch(sequences: Sequence[np.ndarray], length: int) -> np.ndarray:
  """0-pads (and truncates) int sequences into an int32 [batch, length]."""
  batch = np.zeros((len(sequences), length), np.int32)
  for row, sequence in enumerate(sequences):
    sequence = np.asarray(sequence)[:length]
    batch[row, :len(sequence)] = sequence
  return batch


def truncate_keeping_eos(tokens: np.ndarray, length: int,
                         eos_id: int) -> np.ndarray:
  """Cuts a sequence that ends with EOS to `length` tokens, as T5 does.

  Args:
    tokens: int [n] token ids.
    length: The most tokens kept.
    eos_id: The vocabulary's EOS id, which a cut sequence ends with.

  Returns:
    `tokens` itself if it fits; else its first `length - 1` tokens, then EOS.
  """
  if len(tokens) <= length:
    return tokens
  return np.append(tokens[:length - 1], eos_id)


def pad_rows(batch: np.ndarray, rows: int) -> np.ndarray:
  """Appends all-0 rows up to `rows`, so a short last batch keeps the shape.

  Args:
    batch: [n, ...] with n <= rows.
    rows: The batch size every call is compiled for.

  Returns:
    [rows, ...] of `batch`'s dtype: `batch`, then 0 rows (padding).
  """
  if len(batch) >= rows:
    return batch
  padding = np.zeros((rows - len(batch),) + batch.shape[1:], batch.dtype)
  return np.concatenate([batch, padding])


def register_seqio_tasks(data_dir: str, vocabulary_path: str,
                         task_suffix: str = '') -> List[str]:
  """Registers both tasks with seqio (needs the `[data]` extra).

  Each task reads `<data_dir>/<task>/<split>.tsv`, prefixes the source as T5
  does, tokenizes with `seqio.SentencePieceVocabulary` and appends EOS, so a
  T5X user can train or evaluate on them with `MIXTURE_OR_TASK_NAME`.

  Args:
    data_dir: Folder written by `scripts/prepare_data.py`.
    vocabulary_path: The SentencePiece model.
    task_suffix: Appended to the task names (to register several copies).

  Returns:
    The registered task names.
  """
  import functools  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  vocabulary = seqio.SentencePieceVocabulary(vocabulary_path)
  features = {
      'inputs': seqio.Feature(vocabulary, add_eos=True, required=True),
      'targets': seqio.Feature(vocabulary, add_eos=True, required=True),
  }

  def parse_tsv(dataset, prefix):
    def parse(line):
      fields = tf.strings.split(line, '\t', maxsplit=1)
      return {'inputs': tf.strings.join([prefix, fields[0]]),
              'targets': fields[1]}
    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)

  names = []
  for task, prefix in TASKS.items():
    name = task + task_suffix
    if name in seqio.TaskRegistry.names():
      seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource(
            {split: tsv_path(data_dir, task, split)
             for split in corpora.SPLITS}),
        preprocessors=[
            functools.partial(parse_tsv, prefix=prefix),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=features,
        metric_fns=[])
    names.append(name)
  return names


def split_summary(split: TokenizedSplit) -> Dict[str, float]:
  """Counts and token totals, for logs."""
  return {'examples': len(split),
          'input_tokens': int(split.input_lengths.sum()),
          'target_tokens': int(split.target_lengths.sum())}
