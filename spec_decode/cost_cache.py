"""The on-disk cache of measured costs and of each pair's acceptance.

One small JSON file (`cache_path()`): {'format': CACHE_FORMAT, 'entries':
{key: cost profile}, 'acceptance': {key: {'beta_sum', 'beta_count',
'tokens', 'rows'}}}. The file is never trusted blindly: an unreadable,
malformed or wrong-version file, or an entry that does not hold what it
should, reads as missing; writes go to a temporary file renamed into place,
so two processes writing at once leave one whole file, never a torn one.
`costs` and `acceptance` say what the keys and entries mean.
"""

import json
import os
import tempfile
from typing import Any, Dict, Optional, Tuple

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
# 7: plain steps of gamma='auto''s loop and what a call spends once; the
#    kept acceptance also keeps the rows' output lengths.
# 8: gamma='auto''s loop runs each call width as a loop of its own, without
#    a conditional at every iteration: its iterations cost less than format
#    7 measured.
CACHE_FORMAT = 8
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


class _Kept:
  """A pair's kept figures at one sampling setting, as read and added to."""

  def __init__(self, entry: Any):
    self.beta_sum, self.beta_count, self.tokens, self.rows = 0.0, 0, 0.0, 0
    if (isinstance(entry, dict)
        and isinstance(entry.get('beta_sum'), (int, float))
        and isinstance(entry.get('beta_count'), int)
        and entry['beta_count'] > 0
        and 0.0 <= entry['beta_sum'] <= entry['beta_count']):
      self.beta_sum, self.beta_count = (float(entry['beta_sum']),
                                        entry['beta_count'])
      if (isinstance(entry.get('tokens'), (int, float))
          and isinstance(entry.get('rows'), int) and entry['rows'] > 0
          and entry['tokens'] >= entry['rows']):
        self.tokens, self.rows = float(entry['tokens']), entry['rows']
    self.written = self.beta_count  # beta_count when last written

  def to_json(self) -> Dict[str, Any]:
    return {'beta_sum': self.beta_sum, 'beta_count': self.beta_count,
            'tokens': self.tokens, 'rows': self.rows}


_ACCEPTANCE: Dict[Tuple[str, str], _Kept] = {}


def _kept(path: str, key: str) -> _Kept:
  if (path, key) not in _ACCEPTANCE:
    _ACCEPTANCE[(path, key)] = _Kept(
        _section(_read_file(path), 'acceptance').get(key))
  return _ACCEPTANCE[(path, key)]


def acceptance(key: str, path: Optional[str] = None) -> Optional[float]:
  """The mean beta kept under `key`, or None (none yet, or a stale or
  corrupt entry: not a pair of numbers with 0 <= sum <= count)."""
  kept = _kept(path or cache_path(), key)
  return kept.beta_sum / kept.beta_count if kept.beta_count else None


def output_length(key: str, path: Optional[str] = None) -> Optional[float]:
  """The mean output length (tokens per row) kept under `key`, or None
  (none yet, or no lengths a corrupt entry could not account for)."""
  kept = _kept(path or cache_path(), key)
  return kept.tokens / kept.rows if kept.rows else None


def add_acceptance(key: str, beta_sum: float, beta_count: int,
                   tokens: float = 0.0, rows: int = 0,
                   path: Optional[str] = None) -> None:
  """Adds a call's betas (and its rows' output lengths) to the figures
  kept under `key`.

  The file is rewritten when the positions counted grew by a quarter since
  the last write (not after every call: a notebook's loop of calls stays
  cheap); a read-only home keeps the figures in memory only.
  """
  path = path or cache_path()
  kept = _kept(path, key)
  kept.beta_sum += beta_sum
  kept.beta_count += beta_count
  kept.tokens += tokens
  kept.rows += rows
  if kept.beta_count > _ACCEPTANCE_HORIZON:
    kept.beta_sum /= 2
    kept.beta_count //= 2
    kept.tokens /= 2
    kept.rows = max(kept.rows // 2, 1) if kept.rows else 0
    kept.written = 0
  if kept.beta_count and kept.beta_count >= 1.25 * kept.written:
    try:
      _update_file(path, 'acceptance', key, kept.to_json())
      kept.written = kept.beta_count
    except OSError:
      pass


def forget_acceptance() -> None:
  """Drops the acceptance figures read into memory (the file stays)."""
  _ACCEPTANCE.clear()
