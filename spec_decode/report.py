"""Tables of result rows: Markdown for reading, JSON and CSV for tools."""

import csv
import json
import os
import time
from typing import Any, Dict, Optional, Sequence


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str],
                   formats: Optional[Dict[str, str]] = None) -> str:
  """Rows of dicts as a Markdown table.

  Args:
    rows: One dict per row; a missing or None value prints as '-'.
    columns: The keys shown, in order (the header).
    formats: column -> format spec of its float values (default '.3f').

  Returns:
    The table, one line per row after the header lines, without a final
    newline.
  """
  formats = formats or {}

  def cell(row, column):
    value = row.get(column)
    if value is None:
      return '-'
    if isinstance(value, float):
      return format(value, formats.get(column, '.3f'))
    return str(value)

  lines = ['| ' + ' | '.join(columns) + ' |',
           '|' + '---|' * len(columns)]
  lines += ['| ' + ' | '.join(cell(r, c) for c in columns) + ' |'
            for r in rows]
  return '\n'.join(lines)


def is_writer() -> bool:
  """Whether this process writes output files (process 0 of a slice)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def write_rows(rows: Sequence[Dict[str, Any]], output_dir: str, name: str,
               columns: Sequence[str]) -> Dict[str, str]:
  """Writes rows as JSON, CSV and Markdown.

  Args:
    rows: One dict per row.
    output_dir: Created if missing.
    name: File name without its extension.
    columns: The CSV and Markdown columns (JSON keeps every key).

  Returns:
    'json', 'csv' and 'md' -> the path written (by process 0 only on a
    multi-host slice).
  """
  if not is_writer():
    return {}
  os.makedirs(output_dir, exist_ok=True)
  paths = {kind: os.path.join(output_dir, f'{name}.{kind}')
           for kind in ('json', 'csv', 'md')}
  with open(paths['json'], 'w') as f:
    json.dump(list(rows), f, indent=1)
  with open(paths['csv'], 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(columns),
                            extrasaction='ignore')
    writer.writeheader()
    writer.writerows(rows)
  with open(paths['md'], 'w') as f:
    f.write(markdown_table(rows, columns) + '\n')
  return paths


class Progress:
  """Prints a `progress_line` each time one of `total` items ends."""

  def __init__(self, label: str, total: int):
    self.label, self.total = label, total
    self.done, self.started = 0, time.time()

  def step(self, *unused) -> None:
    self.done += 1
    print(progress_line(self.label, self.done, self.total, self.started),
          flush=True)


def progress_line(label: str, done: int, total: int, started: float) -> str:
  """'label: 120/4000 (3%), 12 s so far, about 6.5 min left'.

  Args:
    label: What is being counted.
    done: Items finished.
    total: Items in all.
    started: `time.time()` when the work began.

  Returns:
    The line, with an estimate of the time left from the rate so far.
  """
  elapsed = time.time() - started
  line = f'{label}: {done}/{total} ({100.0 * done / max(total, 1):.0f}%), '
  line += f'{elapsed:.0f} s so far'
  if 0 < done < total:
    left = elapsed * (total - done) / done
    line += (f', about {left / 60:.1f} min left' if left >= 90
             else f', about {left:.0f} s left')
  return line
