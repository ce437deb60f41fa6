"""Text in, text out: encoding task inputs, decoding outputs, scoring them."""

from typing import Dict, List, Sequence

import numpy as np

from spec_decode.data import tasks


def encode_inputs(vocabulary, task: str, sources: Sequence[str],
                  length: int) -> np.ndarray:
  """int32 [len(sources), length]: prefixed, tokenized, EOS, 0-padded.

  Inputs longer than `length` are truncated and keep their EOS, as in
  training.
  """
  rows = []
  for source in sources:
    ids = vocabulary.encode(tasks.model_input(task, source))
    rows.append(ids[:length - 1] + [vocabulary.eos_id])
  return tasks.pad_batch(rows, length)


def trim_padding(encoder_input_tokens: np.ndarray,
                 multiple: int = 16) -> np.ndarray:
  """Drops padding columns beyond the longest row, rounded up to `multiple`.

  Padding is masked, so outputs do not change; but the encoder (and the
  cross-attention) cost grows with the padded length, which at batch 1 on a
  CPU is a noticeable share of a short output's latency. Rounding to a
  multiple bounds how many shapes get compiled.

  Args:
    encoder_input_tokens: int [batch, length], 0-padded on the right.
    multiple: Round the kept length up to this (>= 1).

  Returns:
    int [batch, kept_length] with kept_length <= length.
  """
  tokens = np.asarray(encoder_input_tokens)
  # 1 + the last column holding a token in any row (at least 1).
  used = int(np.max(np.flatnonzero(tokens.any(axis=0)), initial=0)) + 1
  kept = min(tokens.shape[1], max(multiple, -(-used // multiple) * multiple))
  return tokens[:, :kept]


def decode_outputs(vocabulary, tokens: np.ndarray) -> List[str]:
  """Texts of output rows (stopping at EOS)."""
  return [vocabulary.decode(row) for row in np.asarray(tokens)]


def translation_scores(hypotheses: Sequence[str],
                       references: Sequence[str]) -> Dict[str, float]:
  """Corpus chrF and BLEU (sacrebleu, from the `[data]`/`[test]` extras)."""
  import sacrebleu  # pylint: disable=g-import-not-at-top
  refs = [list(references)]
  return {'chrf': float(sacrebleu.corpus_chrf(list(hypotheses), refs).score),
          'bleu': float(sacrebleu.corpus_bleu(list(hypotheses), refs).score)}
