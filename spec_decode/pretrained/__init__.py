"""The models and vocabulary shipped with the package.

`available()` lists model names; each says its role (`target` or `draft`, and
`unigram`/`bigram` for the paper's cheap n-gram drafts). `load(name)` returns a
`spec_decode.Model`; `vocabulary()` the shared SentencePiece vocabulary.
"""

import functools
import json
import os
from typing import Any, Dict, List

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          'assets')
VOCABULARY_PATH = os.path.join(ASSETS_DIR, 'spm.model')
MANIFEST_PATH = os.path.join(ASSETS_DIR, 'manifest.json')


@functools.lru_cache(maxsize=None)
def _manifest() -> Dict[str, Any]:
  if not os.path.isfile(MANIFEST_PATH):
    return {}
  with open(MANIFEST_PATH) as f:
    return json.load(f)


def available() -> List[str]:
  """Names of the shipped models."""
  return sorted(_manifest())


def info(name: str) -> Dict[str, Any]:
  """The manifest entry of `name`: config, role, training summary."""
  manifest = _manifest()
  if name not in manifest:
    raise ValueError(f'name must be one of {available()}, got {name!r}.')
  return manifest[name]


@functools.lru_cache(maxsize=None)
def vocabulary():
  """The shared SentencePiece vocabulary (`encode`, `decode`, `eos_id`)."""
  from spec_decode.data.tokenizer import Vocabulary  # pylint: disable=g-import-not-at-top
  return Vocabulary(VOCABULARY_PATH)


def load(name: str, dtype: str = 'float32'):
  """Loads a shipped model.

  Args:
    name: One of `available()`.
    dtype: Activation dtype and the dtype parameters are cast to on read
      (float32 runs fastest on CPUs; weights are stored in bfloat16).

  Returns:
    A `spec_decode.Model`.
  """
  from spec_decode import checkpoints  # pylint: disable=g-import-not-at-top
  from spec_decode.model import Model  # pylint: disable=g-import-not-at-top
  from spec_decode.model import T5Config  # pylint: disable=g-import-not-at-top
  entry = info(name)
  config = T5Config(**{**entry['config'], 'dtype': dtype})
  params = checkpoints.load_t5x_checkpoint(
      os.path.join(ASSETS_DIR, entry['checkpoint']), config, dtype=dtype)
  return Model(config, params, eos_id=vocabulary().eos_id)
