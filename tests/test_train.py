"""Training: the loss, reproducible bucketed batches, resumable runs."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_decode import checkpoints
from spec_decode import pretrained
from spec_decode import train
from spec_decode.data import tasks
from spec_decode.model import T5Config


def test_cross_entropy_with_z_loss():
  logits = jnp.asarray(np.random.RandomState(0).randn(2, 3, 5), jnp.float32)
  targets = jnp.asarray([[1, 2, 0], [4, 0, 0]])
  weights = (targets > 0).astype(jnp.float32)
  loss, metrics = train.cross_entropy_with_z_loss(logits, targets, weights,
                                                  z_loss=1e-4)
  logz = jax.nn.logsumexp(logits, -1)
  nll = logz - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
  expected = jnp.sum((nll + 1e-4 * logz**2) * weights) / 3
  np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6)
  assert float(metrics['token_count']) == 3
  # Soft targets equal to the one-hot hard targets change nothing.
  soft_ids = targets[..., None]
  soft_probs = jnp.ones_like(soft_ids, jnp.float32)
  soft, _ = train.cross_entropy_with_z_loss(logits, targets, weights, 1e-4,
                                            soft_ids, soft_probs, 0.5)
  np.testing.assert_allclose(float(soft), float(loss), rtol=1e-6)


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
                     dtype='float32'),
      model_dir=str(tmp_path / name), data_dir=data_dir,
      mixture={'translate_en_de': 1.0}, batch_tokens=512, num_steps=steps,
      learning_rate=0.05, warmup_steps=2, eval_examples=16, eval_every=4,
      checkpoint_every=3, log_every=2)


def test_batches_are_bucketed_and_reproducible(tmp_path):
  data_dir = _tiny_data(tmp_path)
  split = tasks.TokenizedSplit.load(
      tasks.tokenized_path(data_dir, 'translate_en_de', 'train'))
  sampler = train.BatchSampler({'translate_en_de': split},
                               {'translate_en_de': 1.0}, 512, seed=3)
  first, again = sampler.batch(7), sampler.batch(7)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  shape = first['inputs'].shape + first['targets'].shape[1:]
  assert shape in [tuple(s) for s in sampler.shapes()]
  assert first['inputs'].shape[1] in train.INPUT_BUCKETS
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
