"""The on-disk cache of measured costs and of each pair's acceptance.

One small JSON file (`cache_path()`): {'format': CACHE_FORMAT, 'entries':
{key: cost profile}, 'acceptance': {key: {'beta_sum', 'beta_count'}}}. The
file is never trusted blindly: an unreadable, malformed or wrong-version
file, or an entry that does not hold what it should, reads as missing;
writes go to a temporary file renamed into place, so two processes writing
at once leave one whole file, never a torn one. `costs` says what the keys
and entries mean.
"""

import json
import os
import tempfile
from typing import Any, Dict, List, Optional, Tuple

CACHE_DIR_ENV = 'SPEC_DECODE_CACHE_DIR'
# 2: profiles also hold the measured cost of a whole decoding iteration.
# 3: iterations measured with inverse-CDF sampling and without the copies
#    a conditional used to make of the caches (cheaper than format 2 said),
#    greedy iterations beside sampled ones.
# 4: speculative iterations timed in gamma='auto''s own program (the one
#    its rule's choices run in), not in fixed-gamma loops.
# 5: every width of the K-curve timed over one cache length (the widest
#    call's), not a cache per width.
# 6: every width's calls cover the same positions (the attention kernel
#    skips the masked tail of the cache, so a call costs what its position
#    makes it attend).
CACHE_FORMAT = 6
# The kept acceptance halves its weight past this many positions, so it
# follows the pair's recent use.
_ACCEPTANCE_HORIZON = 20000


def cache_path() -> str:
  """$SPEC_DECODE_CACHE_DIR, else $XDG_CACHE_HOME/spec_decode, else ~/.cache."""
  folder = os.environ.get(CACHE_DIR_ENV) or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.join(
          os.path.expanduser('~'), '.cache'), 'spec_decode')
  return os.path.join(folder, 'costs.json')


def _read_file(path: str) -> Dict[str, Any]:
  """The whole cache file; {} for a missing, unreadable or malformed one."""
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return {}
  if not isinstance(data, dict) or data.get('format') != CACHE_FORMAT:
    return {}
  return data


def _section(data: Dict[str, Any], name: str) -> Dict[str, Any]:
  section = data.get(name)
  return section if isinstance(section, dict) else {}


def _update_file(path: str, name: str, key: str, value: Any) -> None:
  """Sets data[name][key] = value, replacing the file atomically."""
  data = _read_file(path)
  sections = {section: _section(data, section)
              for section in ('entries', 'acceptance')}
  sections[name][key] = value
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  handle, tmp = tempfile.mkstemp(dir=folder, prefix='.costs.',
                                 suffix='.tmp')
  try:
    with os.fdopen(handle, 'w') as f:
      json.dump({'format': CACHE_FORMAT, **sections}, f, indent=1)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def read_cache(path: str) -> Dict[str, Any]:
  """The cache's cost entries; {} for a missing, unreadable or malformed
  file."""
  return _section(_read_file(path), 'entries')


def write_entry(path: str, key: str, entry: Dict[str, Any]) -> None:
  """Adds one cost entry, replacing the file atomically."""
  _update_file(path, 'entries', key, entry)


# (path, key) -> [beta_sum, beta_count, count when last written].
_ACCEPTANCE: Dict[Tuple[str, str], List[float]] = {}


def _acceptance(path: str, key: str) -> List[float]:
  if (path, key) not in _ACCEPTANCE:
    entry = _section(_read_file(path), 'acceptance').get(key)
    figures = [0.0, 0]
    if (isinstance(entry, dict)
        and isinstance(entry.get('beta_sum'), (int, float))
        and isinstance(entry.get('beta_count'), int)
        and entry['beta_count'] > 0
        and 0.0 <= entry['beta_sum'] <= entry['beta_count']):
      figures = [float(entry['beta_sum']), entry['beta_count']]
    _ACCEPTANCE[(path, key)] = figures + [figures[1]]
  return _ACCEPTANCE[(path, key)]


def acceptance(key: str, path: Optional[str] = None) -> Optional[float]:
  """The mean beta kept under `key`, or None (none yet, or a stale or
  corrupt entry: not a pair of numbers with 0 <= sum <= count)."""
  figures = _acceptance(path or cache_path(), key)
  return figures[0] / figures[1] if figures[1] else None


def add_acceptance(key: str, beta_sum: float, beta_count: int,
                   path: Optional[str] = None) -> None:
  """Adds betas to the figures kept under `key`.

  The file is rewritten when the positions counted grew by a quarter since
  the last write (not after every call: a notebook's loop of calls stays
  cheap); a read-only home keeps the figures in memory only.
  """
  path = path or cache_path()
  figures = _acceptance(path, key)
  figures[0] += beta_sum
  figures[1] += beta_count
  if figures[1] > _ACCEPTANCE_HORIZON:
    figures[0] /= 2
    figures[1] //= 2
    figures[2] = 0
  if figures[1] and figures[1] >= 1.25 * figures[2]:
    try:
      _update_file(path, 'acceptance', key,
                   {'beta_sum': figures[0], 'beta_count': figures[1]})
      figures[2] = figures[1]
    except OSError:
      pass


def forget_acceptance() -> None:
  """Drops the acceptance figures read into memory (the file stays)."""
  _ACCEPTANCE.clear()
