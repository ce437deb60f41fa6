"""Parsing, cleaning, de-duplicating and splitting the Debian corpora."""

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
