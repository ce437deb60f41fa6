"""Tables of result rows: Markdown for reading, JSON and CSV for tools."""

import csv
import json
import os
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


def write_rows(rows: Sequence[Dict[str, Any]], output_dir: str, name: str,
               columns: Sequence[str]) -> Dict[str, str]:
  """Writes rows as JSON, CSV and Markdown.

  Args:
    rows: One dict per row.
    output_dir: Created if missing.
    name: File name without its extension.
    columns: The CSV and Markdown columns (JSON keeps every key).

  Returns:
    'json', 'csv' and 'md' -> the path written.
  """
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
