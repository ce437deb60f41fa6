r"""Builds the En->De and summarization data from Debian's archive alone.

  python scripts/prepare_data.py --data_dir=data            # fetch, split, tokenize
  python scripts/prepare_data.py --train_tokenizer          # also retrain the vocabulary
  python scripts/prepare_data.py --write_samples            # refresh committed samples
  python scripts/prepare_data.py --data_dir=data_catalogs --message_catalogs=default
      # also the whole sentences of packages' German message catalogs, added
      # to the En->De training split only (validation and test unchanged)

Writes <data_dir>/<task>/{train,validation,test}.tsv and
<data_dir>/tokenized/<task>_<split>.npz. Raw downloads go to <data_dir>/raw.
"""

import glob
import json
import os
import random
import time

from absl import app
from absl import flags
from absl import logging

from spec_decode import pretrained
from spec_decode import report
from spec_decode.data import corpora
from spec_decode.data import debian
from spec_decode.data import tasks
from spec_decode.data import tokenizer

FLAGS = flags.FLAGS
flags.DEFINE_string('data_dir', 'data', 'Output folder (git-ignored).')
flags.DEFINE_bool('train_tokenizer', False,
                  'Train a new SentencePiece model into --vocabulary.')
flags.DEFINE_string('vocabulary', pretrained.VOCABULARY_PATH,
                    'SentencePiece model to tokenize with (or to write).')
flags.DEFINE_integer('vocab_size', 8000, 'Pieces of a newly trained model.')
flags.DEFINE_bool('write_samples', False,
                  'Rewrite the committed samples in spec_decode/data/samples.')
flags.DEFINE_integer('sample_size', 64, 'Examples per committed sample.')
flags.DEFINE_list('message_catalogs', [],
                  'Debian packages whose German gettext catalogs add their '
                  'whole-sentence messages to the En->De training split '
                  '(validation and test stay as without them); "default" is '
                  'spec_decode.data.debian.CATALOG_PACKAGES.')


def build_pairs(raw_dir):
  """All cleaned, de-duplicated pairs per task."""
  dictionary = debian.fetch_dictionary(raw_dir)
  with open(dictionary, encoding='utf-8', errors='replace') as f:
    ding = corpora.ding_sentence_pairs(f)
  files = debian.fetch_description_translations(raw_dir)
  indexes = {}
  for lang, paths in files.items():
    indexes[lang] = {}
    for path in paths:
      with open(path, encoding='utf-8', errors='replace') as f:
        indexes[lang].update(corpora.parse_translation_index(f))
  summaries, paragraphs = corpora.description_pairs(indexes['en'],
                                                    indexes['de'])
  counts = {'dictionary_sentences': len(ding),
            'description_summaries': len(summaries),
            'description_paragraphs': len(paragraphs)}
  translate = corpora.deduplicate(ding + summaries + paragraphs)
  summarize = corpora.deduplicate(corpora.summarization_pairs(indexes['en']))
  # No summarization source may be a translation source of another split.
  logging.info('raw pair counts: %s', counts)
  return {'translate_en_de': translate, 'summarize': summarize}, counts


def add_catalog_sentences(raw_dir, packages, task_splits):
  """Adds message-catalog sentence pairs to `task_splits['train']`.

  Returns:
    How many sentence pairs the catalogs held, and how many were added (the
    rest repeat a training source or touch a held-out pair).
  """
  catalogs = debian.fetch_message_catalogs(raw_dir, packages)
  messages = []
  for paths in catalogs.values():
    for path in paths:
      with open(path, 'rb') as f:
        messages.extend(corpora.parse_message_catalog(f.read(), path))
  sentences = corpora.deduplicate(corpora.catalog_sentence_pairs(messages))
  held_out = task_splits['validation'] + task_splits['test']
  train = task_splits['train']
  task_splits['train'] = corpora.deduplicate(
      train + corpora.held_out_free(sentences, held_out))
  return len(sentences), len(task_splits['train']) - len(train)


def main(argv):
  del argv
  started = time.time()
  stage = lambda name: print(f'[{time.time() - started:.0f} s] {name}',
                             flush=True)
  raw_dir = os.path.join(FLAGS.data_dir, 'raw')
  stage('fetching and parsing the Debian sources')
  pairs, counts = build_pairs(raw_dir)
  stage('splitting and writing the task splits')
  stats = {'raw': counts, 'splits': {}}
  splits = {}
  for task, task_pairs in pairs.items():
    splits[task] = corpora.split_pairs(task_pairs)
  if FLAGS.message_catalogs:
    packages = (debian.CATALOG_PACKAGES if FLAGS.message_catalogs == ['default']
                else FLAGS.message_catalogs)
    stage(f'adding the sentences of {len(packages)} message catalog packages')
    found, added = add_catalog_sentences(raw_dir, packages,
                                         splits['translate_en_de'])
    counts.update(catalog_sentences=found, catalog_sentences_added=added)
  for task in splits:
    stats['splits'][task] = {s: len(p) for s, p in splits[task].items()}
    for split, split_pairs in splits[task].items():
      path = tasks.tsv_path(FLAGS.data_dir, task, split)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'w', encoding='utf-8') as f:
        f.writelines(corpora.to_tsv_line(p) for p in split_pairs)
  print(json.dumps(stats['splits'], indent=1), flush=True)

  if FLAGS.train_tokenizer or not os.path.isfile(FLAGS.vocabulary):
    texts = []
    for task, task_splits in splits.items():
      for source, target in task_splits['train']:
        texts.extend([tasks.model_input(task, source), target])
    random.Random(0).shuffle(texts)
    prefix = os.path.splitext(FLAGS.vocabulary)[0]
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    stage(f'training a {FLAGS.vocab_size}-piece vocabulary')
    tokenizer.train_tokenizer(texts, prefix, FLAGS.vocab_size)
    for extra in glob.glob(prefix + '.vocab'):
      os.remove(extra)
    print(f'trained {FLAGS.vocabulary}', flush=True)
  vocabulary = tokenizer.Vocabulary(FLAGS.vocabulary)
  stage('tokenizing')
  progress = report.Progress('tokenized splits',
                             sum(len(s) for s in splits.values()))
  for task, task_splits in splits.items():
    for split, split_pairs in task_splits.items():
      tokenized = tasks.tokenize_pairs(vocabulary, task, split_pairs)
      tokenized.save(tasks.tokenized_path(FLAGS.data_dir, task, split))
      stats['splits'][task][split] = tasks.split_summary(tokenized)
      print(task, split, stats['splits'][task][split], flush=True)
      progress.step()
  with open(os.path.join(FLAGS.data_dir, 'stats.json'), 'w') as f:
    json.dump(stats, f, indent=1)

  if FLAGS.write_samples:
    for task, task_splits in splits.items():
      for split, split_pairs in task_splits.items():
        # Short examples keep the samples (and the tests) small.
        chosen = [p for p in split_pairs if len(p[0]) < 400][
            :FLAGS.sample_size]
        with open(tasks.sample_path(task, split), 'w', encoding='utf-8') as f:
          f.writelines(corpora.to_tsv_line(p) for p in chosen)
    print('wrote samples to', tasks.SAMPLES_DIR)


if __name__ == '__main__':
  app.run(main)
