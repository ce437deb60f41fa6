"""The shipped vocabulary: T5's special ids, lossless round trips."""

import pytest

from spec_decode import pretrained
from spec_decode.data import tokenizer


@pytest.fixture(scope='module')
def vocabulary():
  return pretrained.vocabulary()


def test_special_ids(vocabulary):
  assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
  assert 7000 <= vocabulary.vocab_size <= 9000
  assert 1 not in vocabulary.encode('Hallo Welt')  # No EOS appended.


def test_round_trip_with_byte_fallback(vocabulary):
  for text in ['translate English to German: The house is small.',
               'Das Haus ist klein, aber schön.', 'ÿ→ 漢字 ünïcödé 🙂']:
    ids = vocabulary.encode(text)
    assert tokenizer.UNK_ID not in ids
    assert vocabulary.decode(ids) == text


def test_decode_stops_at_eos_and_skips_padding(vocabulary):
  ids = vocabulary.encode('Guten Morgen')
  assert vocabulary.decode([0] + ids + [1] + ids + [0, 0]) == 'Guten Morgen'


def test_missing_model_file():
  with pytest.raises(FileNotFoundError, match='does not exist'):
    tokenizer.Vocabulary('/nonexistent/spm.model')


def test_train_tokenizer(tmp_path):
  texts = [f'Satz Nummer {i} ist ein Beispiel.' for i in range(300)] + [
      f'sentence number {i} is an example.' for i in range(300)]
  path = tokenizer.train_tokenizer(texts, str(tmp_path / 'spm'),
                                   vocab_size=300)
  vocabulary = tokenizer.Vocabulary(path)
  assert vocabulary.vocab_size == 300
  assert vocabulary.decode(vocabulary.encode('Satz Nummer 5')) == (
      'Satz Nummer 5')
