"""The tutorial notebook is committed clean and runs top to bottom."""

import os
import time

import nbclient
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, 'scripts', 'notebooks',
                        'speculative_decoding.ipynb')


def read_notebook() -> nbformat.NotebookNode:
  """The notebook as committed, validated against the nbformat schema."""
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbformat.validate(notebook)
  return notebook


def test_notebook_is_committed_without_outputs():
  code_cells = [cell for cell in read_notebook().cells
                if cell.cell_type == 'code']
  assert code_cells
  for index, cell in enumerate(code_cells):
    assert cell.outputs == [], f'code cell {index} has outputs'
    assert cell.execution_count is None, (
        f'code cell {index} has an execution count')


@pytest.mark.slow
def test_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
  # The kernel inherits this environment: no display for matplotlib, and the
  # costs gamma='auto' measures go to a fresh cache, not the user's.
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  monkeypatch.setenv('SPEC_DECODE_CACHE_DIR', str(tmp_path / 'cost_cache'))
  work_dir = tmp_path / 'work'
  work_dir.mkdir()
  notebook = read_notebook()
  client = nbclient.NotebookClient(
      notebook, timeout=600, kernel_name='python3',
      resources={'metadata': {'path': str(work_dir)}})
  start = time.time()
  client.execute()  # Raises CellExecutionError, naming the cell, on error.
  print(f'notebook ran in {time.time() - start:.0f} s')
  # Nothing was written next to the kernel (the checkpoint goes to a
  # temporary folder the notebook removes).
  assert not list(work_dir.iterdir())
