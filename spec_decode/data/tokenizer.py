"""The SentencePiece vocabulary every shipped model shares.

T5's ids: pad 0, eos 1, unk 2, no bos; byte fallback so no text is unknown.
"""

import os
from typing import Iterable, List, Sequence

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


class Vocabulary:
  """A SentencePiece model with T5's special ids.

  Attributes:
    path: The `.model` file.
    vocab_size: Number of ids.
    pad_id, eos_id, unk_id: T5's special ids (0, 1, 2).
  """

  pad_id = PAD_ID
  eos_id = EOS_ID
  unk_id = UNK_ID

  def __init__(self, path: str):
    import sentencepiece  # pylint: disable=g-import-not-at-top
    if not os.path.isfile(path):
      raise FileNotFoundError(f'SentencePiece model {path!r} does not exist.')
    self.path = path
    self._processor = sentencepiece.SentencePieceProcessor(model_file=path)
    if (self._processor.pad_id(), self._processor.eos_id(),
        self._processor.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f'{path}: expected pad/eos/unk ids 0/1/2, got '
                       f'{self._processor.pad_id()}/'
                       f'{self._processor.eos_id()}/'
                       f'{self._processor.unk_id()}.')

  @property
  def vocab_size(self) -> int:
    return self._processor.get_piece_size()

  def encode(self, text: str) -> List[int]:
    """Token ids of `text`, without EOS."""
    return self._processor.encode(text)

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`, stopping at the first EOS and skipping padding."""
    kept = []
    for token in ids:
      token = int(token)
      if token == EOS_ID:
        break
      if token != PAD_ID:
        kept.append(token)
    return self._processor.decode(kept)

  def __repr__(self) -> str:
    return f'Vocabulary({self.path!r}, vocab_size={self.vocab_size})'


def train_tokenizer(texts: Iterable[str], model_prefix: str,
                    vocab_size: int = 8000, seed_sentences: int = 400000
                    ) -> str:
  """Trains a unigram SentencePiece model with T5's special ids.

  Args:
    texts: Training text, one segment each.
    model_prefix: Output path without extension.
    vocab_size: Number of pieces.
    seed_sentences: At most this many segments are used.

  Returns:
    The path of the written `.model` file.
  """
  import sentencepiece  # pylint: disable=g-import-not-at-top
  sentencepiece.SentencePieceTrainer.train(
      sentence_iterator=iter(list(texts)[:seed_sentences]),
      model_prefix=model_prefix, vocab_size=vocab_size, model_type='unigram',
      pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
      byte_fallback=True, character_coverage=0.9995, num_threads=2,
      input_sentence_size=seed_sentences, shuffle_input_sentence=True,
      normalization_rule_name='nmt_nfkc',
      minloglevel=2)
  return model_prefix + '.model'
