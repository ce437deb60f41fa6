"""Task inputs are T5-style; tokenized splits round-trip."""

import os

import numpy as np
import pytest

from spec_decode import pretrained
from spec_decode.data import corpora
from spec_decode.data import tasks


def test_tokenize_pairs_prefixes_and_appends_eos():
  vocabulary = pretrained.vocabulary()
  pairs = tasks.load_pairs('translate_en_de', 'train')[:5]
  split = tasks.tokenize_pairs(vocabulary, 'translate_en_de', pairs)
  assert len(split) == 5
  for i, (source, target) in enumerate(pairs):
    assert split.input(i)[-1] == 1 and split.target(i)[-1] == 1
    assert vocabulary.decode(split.input(i)) == (
        'translate English to German: ' + source)
    assert vocabulary.decode(split.target(i)) == target


def test_long_inputs_are_truncated_and_long_targets_dropped():
  vocabulary = pretrained.vocabulary()
  pairs = [('word ' * 400, 'kurz'), ('short', 'lang ' * 400)]
  split = tasks.tokenize_pairs(vocabulary, 'summarize', pairs,
                               max_input_length=32, max_target_length=16)
  assert len(split) == 1
  assert len(split.input(0)) == 32 and split.input(0)[-1] == 1


def test_tokenized_split_round_trip(tmp_path):
  split = tasks.TokenizedSplit.from_sequences([[5, 6, 1], [7, 1]],
                                              [[8, 1], [9, 10, 11, 1]])
  path = str(tmp_path / 'x.npz')
  split.save(path)
  loaded = tasks.TokenizedSplit.load(path)
  np.testing.assert_array_equal(loaded.target(1), [9, 10, 11, 1])
  np.testing.assert_array_equal(loaded.input_lengths, [3, 2])


def test_bad_task_or_split():
  with pytest.raises(ValueError, match='task must be one of'):
    tasks.load_pairs('translate_en_fr', 'test')
  with pytest.raises(ValueError, match='split must be one of'):
    tasks.load_pairs('summarize', 'dev')
  with pytest.raises(FileNotFoundError, match='prepare_data.py'):
    tasks.load_pairs('summarize', 'test', data_dir='/nonexistent')


def test_pad_batch():
  np.testing.assert_array_equal(tasks.pad_batch([[1, 2, 3], [4]], 2),
                                [[1, 2], [4, 0]])


def test_truncation_keeps_eos():
  tokens = np.array([5, 6, 7, 9], np.int32)
  assert tasks.truncate_keeping_eos(tokens, 4, eos_id=9) is tokens
  np.testing.assert_array_equal(
      tasks.truncate_keeping_eos(tokens, 3, eos_id=9), [5, 6, 9])


def test_pad_rows_keeps_the_compiled_batch_size():
  batch = np.array([[3, 4]], np.int32)
  padded = tasks.pad_rows(batch, 3)
  np.testing.assert_array_equal(padded, [[3, 4], [0, 0], [0, 0]])
  assert padded.dtype == np.int32
  assert tasks.pad_rows(batch, 1) is batch


@pytest.mark.slow
def test_seqio_tasks_tokenize_like_ours(tmp_path):
  # Needs the [data] extra (seqio, TensorFlow): the slow suite installs it.
  import seqio  # pylint: disable=g-import-not-at-top
  for task in tasks.TASKS:
    for split in corpora.SPLITS:
      path = tasks.tsv_path(str(tmp_path), task, split)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as f:
        f.writelines(corpora.to_tsv_line(p)
                     for p in tasks.load_pairs(task, split))
  names = tasks.register_seqio_tasks(str(tmp_path),
                                     pretrained.VOCABULARY_PATH, '_test')
  assert names == ['translate_en_de_test', 'summarize_test']
  vocabulary = pretrained.vocabulary()
  for name, task in zip(names, tasks.TASKS):
    dataset = seqio.get_mixture_or_task(name).get_dataset(
        sequence_length={'inputs': 512, 'targets': 512}, split='test',
        shuffle=False)
    examples = list(dataset.take(3).as_numpy_iterator())
    ours = tasks.tokenize_pairs(vocabulary, task,
                                tasks.load_pairs(task, 'test')[:3],
                                max_input_length=512, max_target_length=512)
    for index, example in enumerate(examples):
      np.testing.assert_array_equal(example['inputs'], ours.input(index))
      np.testing.assert_array_equal(example['targets'], ours.target(index))
