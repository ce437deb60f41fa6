"""gin at the edges, T5X style: `--gin_file=...` and `--gin.NAME=VALUE`.

Scripts call `define_gin_flags()` at import, run with `run(main)` (which turns
`--gin.X=V` into a gin binding before absl parses the flags), then
`parse_gin_flags()` and `build(SomeConfig)`. Library code never reads gin.
"""

import glob
import os
import sys
from typing import Any, Callable, List, Optional, Sequence

from absl import app
from absl import flags
import gin
from gin import resource_reader

from spec_decode import device_mesh


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')


def _tolerate_namespace_folders() -> None:
  """Lets gin look past folders that Python sees as namespace packages.

  gin also looks for an `include 'runs/x.gin'` inside a Python package
  `runs`; a plain folder of that name in the working directory (our own
  training output is `runs/`) is a namespace package without a file, and gin
  then fails with a TypeError instead of trying its next search path.
  """
  parse = resource_reader._parse_config_path  # pylint: disable=protected-access
  if getattr(parse, 'tolerates_namespace_folders', False):
    return

  def parse_or_not_found(config_path: str) -> str:
    try:
      return parse(config_path)
    except TypeError as e:
      raise ValueError('Package not found', config_path) from e

  parse_or_not_found.tolerates_namespace_folders = True
  resource_reader._parse_config_path = parse_or_not_found  # pylint: disable=protected-access


_tolerate_namespace_folders()


def build(cls: Any, **overrides) -> Any:
  """Instantiates `cls` with its gin bindings, if a gin file bound any.

  gin files use T5X's `from __gin__ import dynamic_registration` style and
  bind the class by its import path (e.g. `train.TrainConfig.num_steps`).
  """
  try:
    configurable = gin.get_configurable(cls)
  except ValueError:  # Nothing bound it.
    configurable = cls
  return configurable(**overrides)


def define_gin_flags() -> None:
  # Registered as the running program's own flags, so `--help` lists them.
  main = {'module_name': sys.argv[0]}
  flags.DEFINE_multi_string(
      'gin_file', [], 'gin files to parse, in order (paths relative to the '
      'working directory or to configs/).', **main)
  flags.DEFINE_multi_string(
      'gin_bindings', [], 'Individual gin bindings; `--gin.X=V` is the same '
      'as `--gin_bindings="X = V"`.', **main)
  flags.DEFINE_bool('gin_dry_run', False,
                    'Print the parsed configuration and what it would load, '
                    'then stop.', **main)
  flags.DEFINE_bool('multiprocess', False,
                    'Multi-host TPU VM slice: call '
                    'jax.distributed.initialize() first; every host runs '
                    'the same command, only process 0 prints and writes.',
                    **main)


def rewrite_gin_args(args: Sequence[str]) -> List[str]:
  """Turns T5X's `--gin.NAME=VALUE` into `--gin_bindings=NAME = VALUE`."""
  rewritten = []
  for arg in args:
    if arg.startswith('--gin.'):
      name, sep, value = arg[len('--gin.'):].partition('=')
      if not sep:
        raise ValueError(f'{arg!r}: expected --gin.NAME=VALUE.')
      rewritten.append(f'--gin_bindings={name} = {value}')
    else:
      rewritten.append(arg)
  return rewritten


def config_search_paths(files: Sequence[str]) -> List[str]:
  """Folders that gin `include`s are resolved against, most specific first.

  configs/ next to the package only exists in a source checkout; with a
  regular (non-editable) install the repository's configs/ is found through
  the files being parsed (`configs/paper/row.gin` includes
  `models/t5_1_1_xxl.gin`) or through the working directory.

  Args:
    files: gin files about to be parsed.

  Returns:
    Existing folders, without repeats.
  """
  candidates = []
  for path in files:
    folder = os.path.dirname(os.path.abspath(path))
    candidates += [folder, os.path.dirname(folder)]
  candidates += [CONFIGS_DIR, os.path.join(os.getcwd(), 'configs'),
                 os.getcwd()]
  paths = []
  for folder in candidates:
    if os.path.isdir(folder) and folder not in paths:
      paths.append(folder)
  return paths


def parse_gin_flags(modules: Sequence[str] = (),
                    extra_files: Sequence[str] = (),
                    extra_bindings: Sequence[str] = ()) -> None:
  """Parses --gin_file and --gin_bindings (configs/ is on the search path).

  Args:
    modules: `spec_decode` submodules to register for bindings given on the
      command line alone (e.g. 'main' makes `--gin.main.MainConfig.X=V`
      work without a gin file; 'model.config' makes `--gin.config.X=V`
      work).
    extra_files: gin files parsed before --gin_file.
    extra_bindings: Bindings parsed before --gin_bindings.
  """
  files = list(extra_files) + list(flags.FLAGS.gin_file)
  for path in config_search_paths(files):
    gin.add_config_file_search_path(path)
  preamble = ''.join(
      'from {} import {}\n'.format(*f'spec_decode.{m}'.rsplit('.', 1))
      for m in modules)
  if preamble:
    preamble = 'from __gin__ import dynamic_registration\n' + preamble
  bindings = ([preamble] if preamble else []) + list(extra_bindings) + list(
      flags.FLAGS.gin_bindings)
  gin.parse_config_files_and_bindings(files, bindings,
                                      finalize_config=False)


def run(main: Callable[[List[str]], Any],
        argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run` that understands `--gin.NAME=VALUE` and
  `--multiprocess`."""
  argv = rewrite_gin_args(sys.argv if argv is None else argv)

  def setup_then_main(args: List[str]) -> Any:
    if getattr(flags.FLAGS, 'multiprocess', False):
      start_multiprocess()
    return main(args)

  app.run(setup_then_main, argv=argv)


def start_multiprocess() -> None:
  """Joins the slice's processes; silences every process but the first.

  Every host runs the same command on the same inputs; `generate` places
  each host's rows on its own devices and gathers the results, so
  process 0 alone prints and (`report.is_writer`) writes files.
  """
  if device_mesh.initialize_multiprocess() != 0:
    sys.stdout = open(os.devnull, 'w')  # pylint: disable=consider-using-with


# Files in a folder of row configs that are not rows themselves.
NOT_ROWS = ('common.gin', 'table3.gin', 'sweep.gin', 'verification.gin',
            'candidates.gin')


def row_files(entries: Sequence[str]) -> List[str]:
  """Row gin files: the files given, and every row file in folders given.

  Args:
    entries: gin files or folders of them (e.g. configs/paper).

  Returns:
    Paths in order (each folder's rows sorted), without shared includes.

  Raises:
    ValueError: Nothing named a row file.
  """
  files = []
  for entry in entries:
    if os.path.isdir(entry):
      files.extend(sorted(
          f for f in glob.glob(os.path.join(entry, '*.gin'))
          if os.path.basename(f) not in NOT_ROWS))
    else:
      files.append(entry)
  if not files:
    raise ValueError('--rows names no row gin files.')
  return files


def load_row(path: str, cls: Any, modules: Sequence[str]) -> Any:
  """Builds `cls` from one row file plus the command line's gin flags."""
  gin.clear_config()
  parse_gin_flags(modules=modules, extra_files=[path])
  return build(cls)
