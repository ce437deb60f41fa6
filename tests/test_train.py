"""Training: the loss, reproducible bucketed batches, resumable runs."""

import glob
import json
import os
import shutil
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode import distill
from spec_decode import gin_utils
from spec_decode import pretrained
from spec_decode import train
from spec_decode import train_eval
from spec_decode import train_state
from spec_decode.data import batching
from spec_decode.data import tasks
from spec_decode.model import T5Config

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')


def _tiny_data(tmp_path):
  vocabulary = pretrained.vocabulary()
  for split in ('train', 'validation'):
    pairs = tasks.load_pairs('translate_en_de', split)
    tasks.tokenize_pairs(vocabulary, 'translate_en_de', pairs).save(
        tasks.tokenized_path(str(tmp_path), 'translate_en_de', split))
  return str(tmp_path)


def _config(tmp_path, data_dir, name, steps):
  return train.TrainConfig(
      model=T5Config(vocab_size=8000, emb_dim=16, num_heads=2, head_dim=8,
                     mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1,
                     dtype='float32', dropout_rate=0.1),
      model_dir=str(tmp_path / name), data_dir=data_dir,
      mixture={'translate_en_de': 1.0}, batch_tokens=512, num_steps=steps,
      learning_rate=0.05, warmup_steps=2, eval_examples=16, eval_every=4,
      checkpoint_every=3, log_every=2,
      # One batch shape: each train() call compiles its steps once.
      input_buckets=(64,), target_buckets=(64,))


def test_batches_are_bucketed_and_reproducible(tmp_path):
  data_dir = _tiny_data(tmp_path)
  split = tasks.TokenizedSplit.load(
      tasks.tokenized_path(data_dir, 'translate_en_de', 'train'))
  sampler = batching.BatchSampler({'translate_en_de': split},
                                  {'translate_en_de': 1.0}, 512, seed=3)
  first, again = sampler.batch(7), sampler.batch(7)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  shape = first['inputs'].shape + first['targets'].shape[1:]
  assert shape in [tuple(s) for s in sampler.shapes()]
  assert first['inputs'].shape[1] in batching.INPUT_BUCKETS
  assert (first['targets'] > 0).any(axis=1).all()


@pytest.mark.slow
def test_training_reduces_loss_and_resumes_exactly(tmp_path):
  data_dir = _tiny_data(tmp_path)
  straight = train.train(_config(tmp_path, data_dir, 'straight', 8))
  interrupted = _config(tmp_path, data_dir, 'resumed', 8)
  train.train(train.TrainConfig(**{**interrupted.__dict__, 'num_steps': 3}))
  resumed = train.train(interrupted)
  assert straight['step'] == resumed['step'] == 8
  a = checkpoints.load_t5x_checkpoint(str(tmp_path / 'straight'))
  b = checkpoints.load_t5x_checkpoint(str(tmp_path / 'resumed'))
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(x, y)
  log = [l for l in open(tmp_path / 'straight' / 'train_log.jsonl')]
  assert len(log) == 4
  assert straight['train_loss'] < 9.0  # Started near log(8000) = 9.0.
  assert os.path.isdir(tmp_path / 'straight' / 'checkpoint_8')


@pytest.mark.slow
def test_distilled_training_reports_agreement_with_the_teacher(tmp_path):
  data_dir = _tiny_data(tmp_path)
  distill_dir = tmp_path / 'distill'
  os.makedirs(distill_dir)
  # Stand-ins for the teacher's outputs: the sample's own targets.
  for split in ('train', 'validation'):
    tasks.TokenizedSplit.load(
        tasks.tokenized_path(data_dir, 'translate_en_de', split)).save(
            str(distill_dir / f'translate_en_de_{split}.npz'))
  outputs = tasks.TokenizedSplit.load(
      str(distill_dir / 'translate_en_de_train.npz'))
  distill.DistillationTargets(
      ids=outputs.targets[:, None].astype(np.uint16),
      probs=np.ones((len(outputs.targets), 1), np.float16)).save(
          str(distill_dir / 'translate_en_de_train_teacher.npz'))
  config = train.TrainConfig(**{
      **_config(tmp_path, data_dir, 'draft', 4).__dict__,
      'distillation_dir': str(distill_dir)})
  metrics = train.train(config)

  # The figure is the trained draft's teacher-forced argmax agreement with
  # the teacher's validation outputs, computed here without the trainer.
  draft = train_state.load_trained(str(tmp_path / 'draft'))
  assert draft.config == config.model
  validation = tasks.TokenizedSplit.load(
      str(distill_dir / 'translate_en_de_validation.npz'))
  agree = total = 0
  for index in range(config.eval_examples):
    target = validation.target(index)[None].astype(np.int32)
    logits = draft.logits(validation.input(index)[None].astype(np.int32),
                          np.pad(target, ((0, 0), (1, 0)))[:, :-1])
    agree += int(np.sum(np.argmax(logits, -1) == target))
    total += target.size
  reported = metrics['translate_en_de/target_agreement']
  assert abs(reported - agree / total) <= 1.0 / total
  # Agreement with the references would be the validation accuracy; here
  # the teacher's outputs are the references, so the two figures coincide.
  assert abs(reported - metrics['translate_en_de/accuracy']) <= 1.0 / total


def test_agreement_needs_validation_outputs_for_every_task(tmp_path):
  mixture = {'translate_en_de': 1.0, 'summarize': 1.0}
  assert train_eval.load_agreement_splits(str(tmp_path), mixture) is None
  tasks.TokenizedSplit.from_sequences([[5, 1]], [[6, 1]]).save(
      str(tmp_path / 'translate_en_de_validation.npz'))
  assert train_eval.load_agreement_splits(str(tmp_path), mixture) is None
  tasks.TokenizedSplit.from_sequences([[7, 1]], [[8, 1]]).save(
      str(tmp_path / 'summarize_validation.npz'))
  splits = train_eval.load_agreement_splits(str(tmp_path), mixture)
  assert sorted(splits) == ['summarize', 'translate_en_de']
  np.testing.assert_array_equal(splits['summarize'].target(0), [8, 1])
  assert train_eval.load_agreement_splits(None, mixture) is None


def test_load_trained_names_what_is_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match='config.json does not exist'):
    train_state.load_trained(str(tmp_path / 'checkpoint_5'))


def test_train_script_binds_model_fields_from_the_command_line(tmp_path):
  data_dir = _tiny_data(tmp_path)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = subprocess.run(
      [sys.executable, 'scripts/train_model.py',
       '--gin_file=configs/train/draft_tiny.gin',
       f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
       f"--gin.train.TrainConfig.data_dir='{data_dir}'",
       '--gin.train.TrainConfig.distillation_dir=None',
       "--gin.train.TrainConfig.mixture={'translate_en_de': 1.0}",
       '--gin.train.TrainConfig.num_steps=0',
       '--gin.config.T5Config.dropout_rate=0.2'],
      capture_output=True, text=True, cwd=root, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  with open(tmp_path / 'run' / 'config.json') as f:
    written = json.load(f)
  assert written['model']['dropout_rate'] == 0.2
  assert written['model']['emb_dim'] == 128  # The rest from the gin file.


def test_config_checks_on_policy_settings():
  with pytest.raises(ValueError, match='teacher_dir'):
    train.TrainConfig(on_policy_fraction=0.5)
  with pytest.raises(ValueError, match='on_policy_fraction'):
    train.TrainConfig(on_policy_fraction=1.5, teacher_dir='x')
  with pytest.raises(ValueError, match='on_policy_divergence'):
    train.TrainConfig(on_policy_divergence='js')


def test_buckets_set_the_compiled_shapes(tmp_path):
  data_dir = _tiny_data(tmp_path)
  split = tasks.TokenizedSplit.load(
      tasks.tokenized_path(data_dir, 'translate_en_de', 'train'))
  sampler = batching.BatchSampler({'translate_en_de': split},
                                  {'translate_en_de': 1.0}, 4096, seed=0,
                                  max_input_length=64, input_buckets=(64,),
                                  target_buckets=(32, 96))
  assert {s[1:] for s in sampler.shapes()} <= {(64, 32), (64, 96)}
  for step in range(5):
    batch = sampler.batch(step)
    assert batch['inputs'].shape[1] == 64
    assert batch['targets'].shape[1] in (32, 96)


@pytest.mark.slow
def test_time_limit_and_on_policy_distillation(tmp_path):
  """A teacher trains briefly; a draft mixes offline and on-policy steps."""
  data_dir = _tiny_data(tmp_path)
  teacher = _config(tmp_path, data_dir, 'teacher', 4)
  train.train(teacher)
  # Offline data for the draft: here, the references (any split will do).
  distill_dir = tmp_path / 'distill'
  split = tasks.TokenizedSplit.load(
      tasks.tokenized_path(data_dir, 'translate_en_de', 'train'))
  split.save(str(distill_dir / 'translate_en_de_train.npz'))
  total = int(split.target_offsets[-1])
  distill.DistillationTargets(
      ids=split.targets[:, None].astype(np.uint16),
      probs=np.ones((total, 1), np.float16)).save(
          str(distill_dir / 'translate_en_de_train_teacher.npz'))
  draft = train.TrainConfig(**{
      **_config(tmp_path, data_dir, 'draft', 1000).__dict__,
      'distillation_dir': str(distill_dir),
      'teacher_dir': teacher.model_dir, 'on_policy_fraction': 0.5,
      'time_limit_seconds': 0.0})
  metrics = train.train(draft)
  with open(os.path.join(draft.model_dir, 'train_log.jsonl')) as f:
    records = [json.loads(line) for line in f]
  # The time limit stops training at the first logging step.
  assert records[-1]['step'] == draft.log_every
  assert metrics['step'] == draft.log_every
  on_policy_steps = [s for s in range(draft.log_every)
                     if train._is_on_policy(draft, s)]  # pylint: disable=protected-access
  assert on_policy_steps  # Seed 0 makes step 1 an on-policy step.
  assert 0.0 <= records[-1]['on_policy_divergence'] <= 1.0
  assert os.path.isdir(os.path.join(draft.model_dir,
                                    f'checkpoint_{draft.log_every}'))


def test_evaluations_log_the_chrf_of_greedy_translations(tmp_path):
  data_dir = _tiny_data(tmp_path)
  # The references, beside the tokenized split (prepare_data.py writes both).
  references = tasks.tsv_path(data_dir, 'translate_en_de', 'validation')
  os.makedirs(os.path.dirname(references))
  shutil.copy(tasks.sample_path('translate_en_de', 'validation'), references)
  config = train.TrainConfig(**{
      **_config(tmp_path, data_dir, 'chrf', 2).__dict__,
      'eval_every': 2, 'chrf_examples': 3})
  metrics = train.train(config)
  pairs = tasks.load_pairs('translate_en_de', 'validation', data_dir)[:3]
  trained = train_state.load_trained(config.model_dir)
  scores = train_eval.translation_metrics(trained, pretrained.vocabulary(),
                                          pairs)
  # The logged figure is the chrF of this very model's greedy output.
  assert metrics['translate_en_de/chrf'] == pytest.approx(scores['chrf'])
  assert 0.0 <= scores['chrf'] <= 100.0
  assert scores['examples'] == 3 and len(scores['samples']) == 3
  assert scores['samples'][0]['reference'] == pairs[0][1]
  with pytest.raises(ValueError, match='pairs must hold at least one'):
    train_eval.translation_metrics(trained, pretrained.vocabulary(), [])


@pytest.mark.parametrize('name', sorted(
    os.path.basename(path)
    for path in glob.glob(os.path.join(CONFIGS, 'train', '*.gin'))))
def test_every_training_config_builds(name):
  gin.clear_config()
  gin.add_config_file_search_path(CONFIGS)
  gin.parse_config_files_and_bindings(
      [os.path.join(CONFIGS, 'train', name)], [], finalize_config=False)
  config = gin_utils.build(train.TrainConfig)
  gin.clear_config()
  assert config.model_dir.startswith('runs/') and config.num_steps > 0
  assert config.model.vocab_size == 8000
  if name.startswith('target'):
    # The target runs log the quality-against-steps curve, except the
    # 500-step run that shipped.
    assert config.chrf_examples > 0 or name == 'target.gin'
