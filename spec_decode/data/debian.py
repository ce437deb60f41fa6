"""Fetching the raw corpora with apt's own tools (no dataset host).

`apt-get download` + `dpkg-deb -x` bring the Ding dictionary; `apt-get update`
with a private configuration (own lists folder, the machine's own sources,
`Acquire::Languages { "en"; "de"; }`) brings the description translations.
Nothing here needs root or touches the machine's own apt state.
"""

import glob
import os
import subprocess
from typing import Dict, List

DICTIONARY_PACKAGE = 'trans-de-en'
DICTIONARY_FILE = 'usr/share/trans/de-en'


def _run(command: List[str], env=None, cwd=None) -> None:
  result = subprocess.run(command, env=env, cwd=cwd, capture_output=True,
                          text=True, check=False)
  if result.returncode:
    raise RuntimeError(f'{" ".join(command)} failed ({result.returncode}):\n'
                       f'{result.stdout}\n{result.stderr}')


def fetch_dictionary(workdir: str) -> str:
  """Downloads and unpacks `trans-de-en`; returns the dictionary's path."""
  folder = os.path.join(workdir, DICTIONARY_PACKAGE)
  path = os.path.join(folder, DICTIONARY_FILE)
  if os.path.isfile(path):
    return path
  os.makedirs(folder, exist_ok=True)
  _run(['apt-get', 'download', DICTIONARY_PACKAGE], cwd=folder)
  debs = glob.glob(os.path.join(folder, f'{DICTIONARY_PACKAGE}_*.deb'))
  if not debs:
    raise RuntimeError(f'apt-get download {DICTIONARY_PACKAGE} wrote no .deb')
  _run(['dpkg-deb', '-x', sorted(debs)[-1], folder])
  return path


def fetch_description_translations(workdir: str,
                                   languages=('en', 'de')
                                   ) -> Dict[str, List[str]]:
  """Fetches the `Translation-<lang>` indexes of the machine's apt sources.

  Args:
    workdir: Folder for apt's private lists and cache.
    languages: Language codes to fetch.

  Returns:
    language -> list of index files (one per suite/component).
  """
  root = os.path.abspath(os.path.join(workdir, 'apt'))
  for sub in ('lists/partial', 'cache/archives/partial', 'parts'):
    os.makedirs(os.path.join(root, sub), exist_ok=True)
  config = os.path.join(root, 'apt.conf')
  quoted = ' '.join(f'"{lang}";' for lang in languages)
  with open(config, 'w') as f:
    # Own lists and cache; no conf.d parts (images often disable languages
    # there); the machine's own sources.list(.d) stay in use.
    f.write(f'Dir::State::Lists "{root}/lists";\n'
            f'Dir::Cache "{root}/cache";\n'
            f'Dir::Etc::Parts "{root}/parts";\n'
            f'Acquire::Languages {{ {quoted} }};\n')
  files = {lang: sorted(glob.glob(os.path.join(
      root, 'lists', f'*_i18n_Translation-{lang}'))) for lang in languages}
  if not all(files.values()):
    env = dict(os.environ, APT_CONFIG=config)
    _run(['apt-get', 'update', '-q'], env=env)
    files = {lang: sorted(glob.glob(os.path.join(
        root, 'lists', f'*_i18n_Translation-{lang}'))) for lang in languages}
  missing = [lang for lang, found in files.items() if not found]
  if missing:
    raise RuntimeError(f'apt-get update fetched no Translation-{missing} '
                       'index; are the machine\'s apt sources reachable?')
  return files
