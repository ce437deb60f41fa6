"""The shipped models load, say their roles and agree under greedy."""

import numpy as np
import pytest

import spec_decode as sd
from spec_decode import evaluation
from spec_decode import pretrained
from spec_decode.data import tasks
from spec_decode.model import parameter_count

NAMES = pretrained.available()


def test_available_names_say_each_role():
  assert any('target' in n for n in NAMES)
  drafts = [n for n in NAMES if 'draft' in n]
  assert len([n for n in drafts if 'gram' not in n]) >= 2
  assert any('unigram' in n for n in drafts)
  assert any('bigram' in n for n in drafts)
  assert all(('target' in n) != ('draft' in n) for n in NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_every_shipped_model_loads(name):
  model = pretrained.load(name)
  assert model.config.vocab_size == pretrained.vocabulary().vocab_size
  assert model.eos_id == pretrained.vocabulary().eos_id
  info = pretrained.info(name)
  assert info['parameters'] == parameter_count(model.params)


def test_unknown_name():
  with pytest.raises(ValueError, match='name must be one of'):
    pretrained.load('t5_local_huge')


def test_shipped_weights_are_small():
  import os  # pylint: disable=g-import-not-at-top
  total = 0
  for root, _, files in os.walk(pretrained.ASSETS_DIR):
    total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
  assert total < 100 * 2**20


def test_short_end_to_end_decode_with_the_shipped_pair_is_identical():
  target = pretrained.load('t5_local_target')
  draft = pretrained.load('t5_local_draft_small')
  vocabulary = pretrained.vocabulary()
  pairs = tasks.load_pairs('translate_en_de', 'test')[:4]
  enc = evaluation.encode_inputs(vocabulary, 'translate_en_de',
                                 [s for s, _ in pairs], 32)
  baseline = sd.generate(target, enc, max_decode_len=24)
  fast = sd.generate(target, enc, max_decode_len=24, draft=draft, gamma=4)
  np.testing.assert_array_equal(np.asarray(fast.tokens),
                                np.asarray(baseline.tokens))
  assert np.asarray(fast.acceptance_rate).mean() > 0.3
  texts = evaluation.decode_outputs(vocabulary, baseline.tokens)
  assert all(texts)
