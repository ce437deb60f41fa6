"""Task inputs are T5-style; tokenized splits round-trip."""

import numpy as np
import pytest

from spec_decode import pretrained
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
