"""Fetching the raw corpora with apt's own tools (no dataset host).

`apt-get download` + `dpkg-deb -x` bring the Ding dictionary and, when asked
for, packages' German message catalogs; `apt-get update` with a private
configuration (own lists folder, the machine's own sources,
`Acquire::Languages { "en"; "de"; }`) brings the description translations.
Nothing here needs root or touches the machine's own apt state.
"""

import glob
import os
import subprocess
from typing import Dict, List, Sequence

DICTIONARY_PACKAGE = 'trans-de-en'
DICTIONARY_FILE = 'usr/share/trans/de-en'
# Packages (Debian 12 names) whose German catalogs hold the most whole-sentence
# messages: tooltips, help lines and option descriptions, ~15k sentence pairs
# in all (`scripts/prepare_data.py --message_catalogs=default`).
CATALOG_PACKAGES = (
    'libreoffice-l10n-de', 'gcc-12-locales', 'digikam-data', 'vlc-l10n',
    'gimp-data', 'evolution-common', 'kstars-data', 'gramps',
    'filezilla-common', 'inkscape', 'k3b-i18n', 'pidgin-data',
    'audacity-data', 'gnome-control-center-data', 'plasma-workspace-data',
    'nautilus-data', 'util-linux-locales', 'aptitude-common',
    'shotwell-common')


def _run(command: List[str], env=None, cwd=None) -> None:
  result = subprocess.run(command, env=env, cwd=cwd, capture_output=True,
                          text=True, check=False)
  if result.returncode:
    raise RuntimeError(f'{" ".join(command)} failed ({result.returncode}):\n'
                       f'{result.stdout}\n{result.stderr}')


def _unpack_package(workdir: str, package: str) -> str:
  """`apt-get download`s and unpacks `package` once; returns its folder."""
  folder = os.path.join(workdir, package)
  done = os.path.join(folder, '.unpacked')
  if os.path.isfile(done):
    return folder
  os.makedirs(folder, exist_ok=True)
  _run(['apt-get', 'download', package], cwd=folder)
  debs = glob.glob(os.path.join(folder, f'{package}_*.deb'))
  if not debs:
    raise RuntimeError(f'apt-get download {package} wrote no .deb')
  _run(['dpkg-deb', '-x', sorted(debs)[-1], folder])
  for deb in debs:
    os.remove(deb)
  open(done, 'w').close()
  return folder


def fetch_dictionary(workdir: str) -> str:
  """Downloads and unpacks `trans-de-en`; returns the dictionary's path."""
  path = os.path.join(workdir, DICTIONARY_PACKAGE, DICTIONARY_FILE)
  if os.path.isfile(path):
    return path
  _unpack_package(workdir, DICTIONARY_PACKAGE)
  if not os.path.isfile(path):
    raise RuntimeError(f'{DICTIONARY_PACKAGE} has no {DICTIONARY_FILE}')
  return path


def fetch_message_catalogs(workdir: str, packages: Sequence[str],
                           language: str = 'de') -> Dict[str, List[str]]:
  """The compiled gettext catalogs of `language` that `packages` ship.

  Args:
    workdir: Folder the packages are unpacked into (one subfolder each).
    packages: Debian package names (e.g. `CATALOG_PACKAGES`).
    language: Locale folder name.

  Returns:
    package -> its `<...>/<language>/LC_MESSAGES/*.mo` files (sorted).

  Raises:
    RuntimeError: A package cannot be downloaded, or ships no catalog of
      `language`.
  """
  found = {}
  for package in packages:
    folder = _unpack_package(os.path.join(workdir, 'catalogs'), package)
    found[package] = sorted(glob.glob(os.path.join(
        folder, '**', language, 'LC_MESSAGES', '*.mo'), recursive=True))
    if not found[package]:
      raise RuntimeError(f'package {package!r} ships no {language} message '
                         f'catalog (<...>/{language}/LC_MESSAGES/*.mo)')
  return found


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
