"""Decoding raw text with gin-configured models (spec_decode.infer)."""

import os

import jax
import pytest

import spec_decode as sd
from spec_decode import infer

from conftest import saved_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ['The house is small.', 'Open the file, then close it.',
           'A command line tool to convert images.']


def test_speculative_run_gives_the_baseline_text(tmp_path):
  target = saved_model(str(tmp_path), 0)
  draft = saved_model(str(tmp_path), 1, num_decoder_layers=1)
  baseline = infer.infer(infer.InferConfig(target=target, batch_size=2,
                                           max_decode_len=12), SOURCES)
  fast = infer.infer(infer.InferConfig(target=target, draft=draft, gamma=3,
                                       batch_size=2, max_decode_len=12),
                     SOURCES)
  assert [r['input'] for r in fast] == SOURCES
  assert [r['tokens'] for r in fast] == [r['tokens'] for r in baseline]
  assert [r['output'] for r in fast] == [r['output'] for r in baseline]
  assert all('draft_tokens_accepted' in r for r in fast)
  assert all('draft_tokens_accepted' not in r for r in baseline)
  assert all(1 <= len(r['tokens']) <= 12 for r in baseline)


def test_bad_input_is_named(tmp_path):
  with pytest.raises(ValueError, match='sources'):
    infer.infer(infer.InferConfig(), [])
  with pytest.raises(ValueError, match='batch_size'):
    infer.infer(infer.InferConfig(batch_size=0), ['x'])


def test_a_vocabulary_larger_than_the_model_is_refused(tmp_path):
  small = saved_model(str(tmp_path), 2, vocab_size=512)
  with pytest.raises(ValueError, match='vocabulary has 8000 pieces'):
    infer.infer(infer.InferConfig(target=small), SOURCES)


def test_run_configs_build_offline(monkeypatch):
  import gin  # pylint: disable=g-import-not-at-top
  from spec_decode import gin_utils  # pylint: disable=g-import-not-at-top
  from spec_decode import main  # pylint: disable=g-import-not-at-top
  for name in ('baseline', 'speculative'):
    gin.clear_config()
    path = os.path.join(ROOT, 'configs', 'runs', f'{name}.gin')
    for folder in gin_utils.config_search_paths([path]):
      gin.add_config_file_search_path(folder)
    gin.parse_config_files_and_bindings([path], [], finalize_config=False)
    config = gin_utils.build(infer.InferConfig)
    assert config.target.pretrained == 't5_local_target'
    assert (config.draft is None) == (name == 'baseline')
  gin.clear_config()
  path = os.path.join(ROOT, 'configs', 'runs', 'main.gin')
  gin.parse_config_files_and_bindings([path], [], finalize_config=False)
  assert gin_utils.build(main.MainConfig) == main.MainConfig()
  gin.clear_config()


@pytest.mark.slow
def test_cli_decodes_stdin_with_the_shipped_pair(tmp_path):
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  outputs = {}
  for name in ('baseline', 'speculative'):
    path = tmp_path / f'{name}.jsonl'
    result = subprocess.run(
        [sys.executable, '-m', 'spec_decode.infer',
         f'--gin_file=configs/runs/{name}.gin',
         '--gin.infer.InferConfig.max_decode_len=16',
         f'--output_file={path}'],
        input='\n'.join(SOURCES[:2]) + '\n', capture_output=True, text=True,
        cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    outputs[name] = [json.loads(line) for line in open(path)]
  assert [r['input'] for r in outputs['baseline']] == SOURCES[:2]
  assert ([r['output'] for r in outputs['speculative']] ==
          [r['output'] for r in outputs['baseline']])


HF_V1_1 = os.path.join(ROOT, '..', 'shared', 'fixtures', 'hf_t5_v1_1_tiny')


@pytest.mark.skipif(not os.path.isdir(HF_V1_1),
                    reason='../shared/fixtures is not present')
def test_hugging_face_folder_as_the_gin_target(monkeypatch):
  """configs/models/hf_checkpoint.gin: an HF folder as target and draft;
  speculative text equals baseline text."""
  import gin  # pylint: disable=g-import-not-at-top
  from spec_decode import gin_utils  # pylint: disable=g-import-not-at-top
  del monkeypatch
  gin.clear_config()
  for folder in gin_utils.config_search_paths([]):
    gin.add_config_file_search_path(folder)
  gin.parse_config_files_and_bindings(
      ['runs/speculative.gin', 'models/hf_checkpoint.gin'],
      [f"HF_TARGET = '{HF_V1_1}'", f"HF_DRAFT = '{HF_V1_1}'",
       'infer.InferConfig.target = %HF_TARGET_MODEL',
       'infer.InferConfig.draft = %HF_DRAFT_MODEL',
       'infer.InferConfig.gamma = 2', 'infer.InferConfig.batch_size = 2',
       'infer.InferConfig.max_decode_len = 8'], finalize_config=False)
  config = gin_utils.build(infer.InferConfig)
  gin.clear_config()
  assert config.target.model_config().vocab_size == 384
  # The fixture has no spiece.model and only 384 embeddings: the shipped
  # 8000-piece vocabulary is refused with the clear error...
  with pytest.raises(ValueError, match='vocabulary has 8000 pieces'):
    infer.infer(config, SOURCES)
  # ... and the model itself decodes speculatively as the baseline does.
  target = config.target.load()
  tokens = [[5, 17, 300, 1, 0], [9, 1, 0, 0, 0]]
  np_tokens = sd.generate(target, tokens, max_decode_len=8).tokens
  fast = sd.generate(target, tokens, max_decode_len=8,
                     draft=config.draft.load(), gamma=2).tokens
  assert (jax.numpy.asarray(np_tokens) == fast).all()
