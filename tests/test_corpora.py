"""Parsing, cleaning, de-duplicating and splitting the Debian corpora."""

import struct

import pytest

from spec_decode.data import corpora
from spec_decode.data import tasks

DING = [
    '# Version :: devel 2023-01-30',
    'Leidenschaft {f} | Leidenschaften {pl} | Es war purer Zufall. | Das ist '
    'blanker Unsinn. :: passion | passions | It was sheer coincidence. | '
    'That is sheer nonsense.',
    'Das ist die Höhe!; Das schießt den Vogel ab! [übtr.] :: That takes the '
    'cake! [fig.]',
    'Er kommt morgen. {adv} | Sie geht :: He comes tomorrow. | She goes | '
    'extra',
    'Ich muss leider gehen. :: I\u2019m sorry I have to leave.',
]


def test_dictionary_sentences_are_aligned_and_cleaned():
  pairs = corpora.ding_sentence_pairs(DING)
  assert pairs == [
      ('It was sheer coincidence.', 'Es war purer Zufall.'),
      ('That is sheer nonsense.', 'Das ist blanker Unsinn.'),
      ('I\u2019m sorry I have to leave.', 'Ich muss leider gehen.'),
  ]


TRANSLATION_EN = """Package: apt
Description-md5: 111
Description-en: commandline package manager
 This package provides commandline tools for searching and
 managing packages.
 .
 It also has a second paragraph here.

Package: foo
Description-md5: 222
Description-en: a foo tool
 Lists:
  * one
  * two
 .
 The foo tool does foo things for the user all day long.
"""

TRANSLATION_DE = """Package: apt
Description-md5: 111
Description-de: Paketverwaltung für die Befehlszeile
 Dieses Paket stellt Werkzeuge zum Suchen und Verwalten
 von Paketen bereit.
 .
 Es hat auch einen zweiten Absatz.
"""


def test_translation_index_parsing_and_pairing():
  english = corpora.parse_translation_index(TRANSLATION_EN.splitlines(True))
  german = corpora.parse_translation_index(TRANSLATION_DE.splitlines(True))
  assert sorted(english) == ['111', '222']
  summary, paragraphs = corpora.description_parts(english['222'])
  assert summary == 'a foo tool'
  assert paragraphs == [None, 'The foo tool does foo things for the user all '
                        'day long.']
  summaries, pairs = corpora.description_pairs(english, german)
  assert summaries == [('commandline package manager',
                        'Paketverwaltung für die Befehlszeile')]
  assert pairs[0] == (
      'This package provides commandline tools for searching and managing '
      'packages.',
      'Dieses Paket stellt Werkzeuge zum Suchen und Verwalten von Paketen '
      'bereit.')
  assert len(pairs) == 2
  summarize = corpora.summarization_pairs(english)
  assert summarize[0][1] == 'commandline package manager'
  assert summarize[0][0].startswith('This package provides')


def test_deduplication_keeps_first_source():
  pairs = [('Hello  world', 'a'), ('hello world', 'b'), ('Other', 'c')]
  assert corpora.deduplicate(pairs) == [('Hello  world', 'a'), ('Other', 'c')]


def test_splits_are_deterministic_disjoint_and_mostly_train():
  sources = [f'sentence number {i}' for i in range(5000)]
  first = corpora.split_pairs((s, s) for s in sources)
  second = corpora.split_pairs((s, s) for s in reversed(sources))
  for name in corpora.SPLITS:
    assert sorted(first[name]) == sorted(second[name])
  assert 0.9 < len(first['train']) / 5000 < 0.99
  assert first['test'] and first['validation']
  # The split depends on the source text only (case and spaces folded).
  assert corpora.split_of('Sentence  number 7') == corpora.split_of(
      'sentence number 7')


def test_committed_samples_match_their_split():
  for task in tasks.TASKS:
    for split in corpora.SPLITS:
      pairs = tasks.load_pairs(task, split)
      assert len(pairs) >= 32, (task, split)
      assert all(corpora.split_of(source) == split for source, _ in pairs)
      assert all(source and target for source, target in pairs)


def test_tsv_round_trip():
  line = corpora.to_tsv_line(('a\tb  c', 'd\ne'))
  assert list(corpora.read_tsv([line])) == [('a b c', 'd e')]


def _mo_file(messages, charset='UTF-8', byte_order='<'):
  """A compiled gettext catalog of (msgid bytes, msgstr bytes), as msgfmt."""
  header = (b'Content-Type: text/plain; charset=' + charset.encode() +
            b'\n')
  entries = sorted([(b'', header)] + list(messages))
  count = len(entries)
  originals, translations = 28, 28 + 8 * count
  offset = 28 + 16 * count
  tables, blob = [b'', b''], b''
  for column in (0, 1):
    for entry in entries:
      text = entry[column]
      tables[column] += struct.pack(byte_order + '2I', len(text),
                                    offset + len(blob))
      blob += text + b'\x00'
  head = struct.pack(byte_order + '7I', 0x950412de, 0, count, originals,
                     translations, 0, 0)
  return head + tables[0] + tables[1] + blob


CATALOG = [
    (b'Saves the current document under a new name.',
     'Speichert das aktuelle Dokument unter einem neuen Namen.'.encode()),
    (b'tooltip\x04Closes the window without saving.',
     'Schließt das Fenster, ohne zu speichern.'.encode()),
    (b'One file was deleted.\x00%d files were deleted.',
     'Eine Datei wurde gelöscht.\x00%d Dateien wurden gelöscht.'.encode()),
    (b'Untranslated message stays out.', b''),
    (b'Save _As', b'Speichern _unter'),
    (b'Cannot open %s for writing.', b'Kann %s nicht zum Schreiben '
     b'\xc3\xb6ffnen.'),
    (b'Open the file in a new window...', b'Die Datei in einem neuen Fenster '
     b'\xc3\xb6ffnen...'),
    (b'Print', b'Drucken'),
]


@pytest.mark.parametrize('byte_order', ['<', '>'])
def test_message_catalog_messages_contexts_and_plurals(byte_order):
  messages = corpora.parse_message_catalog(_mo_file(CATALOG,
                                                    byte_order=byte_order))
  assert ('Closes the window without saving.',
          'Schließt das Fenster, ohne zu speichern.') in messages
  assert ('One file was deleted.', 'Eine Datei wurde gelöscht.') in messages
  assert len(messages) == len(CATALOG) - 1  # The untranslated one.
  assert not any(english == 'Untranslated message stays out.'
                 for english, _ in messages)


def test_message_catalog_charset_comes_from_its_header():
  latin = [(b'The file was saved.', 'Die Datei wurde gespeichert: Größe.'
            .encode('latin-1'))]
  messages = corpora.parse_message_catalog(_mo_file(latin, 'ISO-8859-1'))
  assert messages == [('The file was saved.',
                       'Die Datei wurde gespeichert: Größe.')]


def test_catalog_sentences_keep_prose_only():
  pairs = corpora.catalog_sentence_pairs(
      corpora.parse_message_catalog(_mo_file(CATALOG)))
  assert sorted(pairs) == sorted([
      ('Saves the current document under a new name.',
       'Speichert das aktuelle Dokument unter einem neuen Namen.'),
      ('Closes the window without saving.',
       'Schließt das Fenster, ohne zu speichern.'),
      ('One file was deleted.', 'Eine Datei wurde gelöscht.'),
  ])


def test_malformed_catalogs_are_named_errors():
  with pytest.raises(ValueError, match=r'x\.mo: not a gettext \.mo file'):
    corpora.parse_message_catalog(b'\x00' * 40, 'x.mo')
  with pytest.raises(ValueError, match='too short'):
    corpora.parse_message_catalog(b'\xde\x12\x04\x95', 'x.mo')
  truncated = _mo_file(CATALOG)[:60]
  with pytest.raises(ValueError, match=r'x\.mo: string table ends at byte'):
    corpora.parse_message_catalog(truncated, 'x.mo')


def test_held_out_free_pairs_leave_validation_and_test_untouched():
  sources = [f'This is sentence number {i}.' for i in range(400)]
  pairs = [(s, s.upper()) for s in sources]
  splits = corpora.split_pairs(pairs)
  held_out = splits['validation'] + splits['test']
  # Catalog pairs: every held-out source again, a held-out target under a new
  # source, and new sources.
  extra = held_out + [('A brand new source sentence.', held_out[0][1])] + [
      (f'Another new sentence, number {i}.', 'Neu.') for i in range(200)]
  kept = corpora.held_out_free(extra, held_out)
  assert kept and all(corpora.split_of(s) == 'train' for s, _ in kept)
  assert not set(kept) & set(held_out)
  assert all(t != held_out[0][1] for _, t in kept)
  # Adding them changes no held-out split.
  resplit = corpora.split_pairs(splits['train'] + kept + held_out)
  assert resplit['validation'] == splits['validation']
  assert resplit['test'] == splits['test']
