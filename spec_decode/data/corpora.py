"""Parsing, cleaning, de-duplicating and splitting the offline corpora.

Debian's archive gives real parallel and summarization text without any
dataset host:
- the Ding German-English dictionary (package `trans-de-en`), whose entries
  carry example sentences: `german :: english`, with aligned alternatives
  separated by ` | ` and annotations in {}, [], <> and ();
- Debian's package-description translations (`Translation-en`,
  `Translation-de`), paired by `Description-md5`: one-line summaries and
  paragraphs for En->De, and long description -> summary for summarization;
- optionally, the German gettext catalogs (`.mo`) that packages ship: each
  English message next to its German translation, of which the whole
  sentences are kept (`catalog_sentence_pairs`).

Splits are a deterministic function of the source text (a hash), so every
rebuild gives the same split and no source text lands in two splits.
"""

import codecs
import collections
import hashlib
import re
import struct
from typing import Dict, Iterable, Iterator, List, Tuple

Pair = Tuple[str, str]

TRANSLATE_PREFIX = 'translate English to German: '
SUMMARIZE_PREFIX = 'summarize: '
SPLITS = ('train', 'validation', 'test')
# Percent of source texts held out for each evaluation split.
HELD_OUT_PERCENT = {'validation': 2, 'test': 2}

_ANNOTATION = re.compile(r'\{[^}]*\}|\[[^\]]*\]|<[^>]*>|\([^)]*\)')
_SPACES = re.compile(r'\s+')
_SENTENCE_END = ('.', '!', '?')


def normalize_space(text: str) -> str:
  return _SPACES.sub(' ', text).strip()


def split_of(source: str) -> str:
  """The split a source text belongs to, from a hash of its text."""
  bucket = int(hashlib.md5(normalize_space(source).lower().encode(
      'utf-8')).hexdigest(), 16) % 100
  if bucket < HELD_OUT_PERCENT['test']:
    return 'test'
  if bucket < HELD_OUT_PERCENT['test'] + HELD_OUT_PERCENT['validation']:
    return 'validation'
  return 'train'


def _is_sentence(text: str, min_words: int = 3) -> bool:
  return (len(text.split()) >= min_words and text[0].isupper()
          and text.endswith(_SENTENCE_END) and ';' not in text
          and '/' not in text and '~' not in text)


def parse_ding_line(line: str) -> List[Pair]:
  """Aligned (english, german) full-sentence pairs of one dictionary entry.

  Args:
    line: `german :: english`, alternatives separated by ` | `.

  Returns:
    The aligned alternatives that are whole sentences on both sides, with
    annotations removed. Entries whose sides do not align yield nothing.
  """
  line = line.strip()
  if not line or line.startswith('#') or ' :: ' not in line:
    return []
  german, english = line.split(' :: ', 1)
  german_parts = german.split(' | ')
  english_parts = english.split(' | ')
  if len(german_parts) != len(english_parts):
    return []
  pairs = []
  for de, en in zip(german_parts, english_parts):
    de = normalize_space(_ANNOTATION.sub(' ', de))
    en = normalize_space(_ANNOTATION.sub(' ', en))
    de = re.sub(r'\s+([.,!?])', r'\1', de)
    en = re.sub(r'\s+([.,!?])', r'\1', en)
    if _is_sentence(de) and _is_sentence(en):
      pairs.append((en, de))
  return pairs


def ding_sentence_pairs(lines: Iterable[str]) -> List[Pair]:
  """All (english, german) sentence pairs of the dictionary file's lines."""
  pairs = []
  for line in lines:
    pairs.extend(parse_ding_line(line))
  return pairs


def parse_translation_index(lines: Iterable[str]) -> Dict[str, str]:
  """Reads a Debian `Translation-<lang>` index.

  Args:
    lines: The file's lines (deb822 records with `Description-md5` and
      `Description-<lang>`, the long part indented, paragraphs split by ` .`).

  Returns:
    md5 -> raw description (summary line, then the long lines).
  """
  descriptions = {}
  md5, body = None, None

  def flush():
    if md5 is not None and body is not None:
      descriptions[md5] = '\n'.join(body)

  for line in lines:
    line = line.rstrip('\n')
    if not line.strip():
      flush()
      md5, body = None, None
    elif line.startswith('Description-md5:'):
      md5 = line.split(':', 1)[1].strip()
    elif line.startswith('Description-'):
      body = [line.split(':', 1)[1].strip()]
    elif line.startswith(' ') and body is not None:
      body.append(line[1:])
    else:
      body = None if not line.startswith(' ') else body
  flush()
  return descriptions


def description_parts(description: str) -> Tuple[str, List[str]]:
  """Splits a raw description into its summary and prose paragraphs.

  Paragraphs holding list items, tables or URLs-only lines are dropped as
  they are not prose; the rest are joined into single lines.
  """
  lines = description.split('\n')
  summary = normalize_space(lines[0])
  paragraphs, current = [], []
  for line in lines[1:] + ['.']:
    if line.strip() == '.':
      if current:
        paragraphs.append(current)
      current = []
    else:
      current.append(line)
  prose = []
  for paragraph in paragraphs:
    if any(l.startswith((' ', '*', '-', '+', 'o ')) or not l.strip()
           for l in paragraph):
      prose.append(None)  # Keep the index so paragraphs stay aligned.
    else:
      prose.append(normalize_space(' '.join(paragraph)))
  return summary, prose


def description_pairs(english: Dict[str, str], german: Dict[str, str]
                      ) -> Tuple[List[Pair], List[Pair]]:
  """(english, german) summary pairs and paragraph pairs, paired by md5."""
  summaries, paragraphs = [], []
  for md5 in sorted(set(english) & set(german)):
    en_summary, en_paragraphs = description_parts(english[md5])
    de_summary, de_paragraphs = description_parts(german[md5])
    if en_summary and de_summary and en_summary != de_summary:
      summaries.append((en_summary, de_summary))
    if len(en_paragraphs) == len(de_paragraphs):
      for en, de in zip(en_paragraphs, de_paragraphs):
        if en and de and en != de:
          paragraphs.append((en, de))
  return summaries, paragraphs


def summarization_pairs(english: Dict[str, str]) -> List[Pair]:
  """(long description, summary) pairs of the English descriptions."""
  pairs = []
  for md5 in sorted(english):
    summary, paragraphs = description_parts(english[md5])
    body = ' '.join(p for p in paragraphs if p)
    if summary and len(body.split()) >= 8:
      pairs.append((body, summary))
  return pairs


_MO_MAGIC = 0x950412de
# Markup, placeholders and accelerator marks: such messages are not prose.
_CATALOG_MARKUP = re.compile(r'[%$&_~<>{}\\|@#]|\.\.\.')


def parse_message_catalog(data: bytes, name: str = '<catalog>'
                          ) -> List[Pair]:
  """(english, translation) messages of a compiled gettext catalog (`.mo`).

  Args:
    data: The file's bytes.
    name: The file's name, for errors.

  Returns:
    One pair per translated message: contexts (`msgctxt`) dropped, the
    singular form of plural messages, untranslated messages and the header
    left out.

  Raises:
    ValueError: `data` is not a `.mo` file, or its tables point outside it.
  """
  if len(data) < 20:
    raise ValueError(f'{name}: {len(data)} bytes is too short for a .mo file')
  for order in '<>':
    magic, _, count, originals, translations = struct.unpack(
        order + '5I', data[:20])
    if magic == _MO_MAGIC:
      break
  else:
    raise ValueError(f'{name}: not a gettext .mo file (magic {magic:#x})')

  def strings(table: int) -> List[bytes]:
    end = table + 8 * count
    if end > len(data):
      raise ValueError(f'{name}: string table ends at byte {end}, past the '
                       f'file\'s {len(data)} bytes')
    found = []
    for i in range(count):
      length, offset = struct.unpack(order + '2I',
                                     data[table + 8 * i:table + 8 * i + 8])
      if offset + length > len(data):
        raise ValueError(f'{name}: message {i} ends past the file')
      found.append(data[offset:offset + length])
    return found

  messages = list(zip(strings(originals), strings(translations)))
  header = dict(messages).get(b'', b'').decode('ascii', 'replace')
  charset = re.search(r'charset=([\w-]+)', header)
  charset = charset.group(1) if charset else 'utf-8'
  try:
    codecs.lookup(charset)
  except LookupError:  # e.g. an unfilled template's 'CHARSET'.
    charset = 'utf-8'
  pairs = []
  for original, translation in messages:
    if not original:
      continue  # The header.
    english = original.split(b'\x00')[0].split(b'\x04')[-1]
    german = translation.split(b'\x00')[0]
    if german:
      # msgids are ASCII or UTF-8; the header names the msgstrs' charset.
      pairs.append((english.decode('utf-8', 'replace'),
                    german.decode(charset, 'replace')))
  return pairs


def catalog_sentence_pairs(messages: Iterable[Pair]) -> List[Pair]:
  """The messages that are whole prose sentences on both sides.

  Labels, menu entries, messages with placeholders (`%s`, `$(ARG1)`),
  markup, accelerator marks or line breaks are dropped; what remains reads
  like the dictionary's and the descriptions' sentences.
  """
  pairs = []
  for english, german in messages:
    if '\n' in english or '\n' in german:
      continue
    english, german = normalize_space(english), normalize_space(german)
    if (english != german and _is_sentence(english, 4)
        and _is_sentence(german, 3)
        and not _CATALOG_MARKUP.search(english + german)):
      pairs.append((english, german))
  return pairs


def held_out_free(pairs: Iterable[Pair], held_out: Iterable[Pair]
                  ) -> List[Pair]:
  """Pairs that may join a training split without touching held-out ones.

  A pair is kept only if its source text hashes to 'train' (so validation
  and test stay exactly as they were) and neither side repeats a held-out
  pair's source or target text.
  """
  held = set()
  for source, target in held_out:
    held.add(normalize_space(source).lower())
    held.add(normalize_space(target).lower())
  return [(s, t) for s, t in pairs
          if split_of(s) == 'train'
          and normalize_space(s).lower() not in held
          and normalize_space(t).lower() not in held]


def deduplicate(pairs: Iterable[Pair]) -> List[Pair]:
  """Keeps the first pair of each source text (case- and space-folded)."""
  seen, kept = set(), []
  for source, target in pairs:
    key = normalize_space(source).lower()
    if key not in seen:
      seen.add(key)
      kept.append((source, target))
  return kept


def split_pairs(pairs: Iterable[Pair]) -> Dict[str, List[Pair]]:
  """Assigns each pair to train/validation/test by its source text."""
  splits = collections.OrderedDict((name, []) for name in SPLITS)
  for pair in pairs:
    splits[split_of(pair[0])].append(pair)
  return splits


def read_tsv(lines: Iterable[str]) -> Iterator[Pair]:
  """Reads `source<TAB>target` lines (tabs and newlines never occur inside)."""
  for line in lines:
    line = line.rstrip('\n')
    if line:
      source, target = line.split('\t')
      yield source, target


def to_tsv_line(pair: Pair) -> str:
  source, target = (normalize_space(t.replace('\t', ' ')) for t in pair)
  return f'{source}\t{target}\n'
