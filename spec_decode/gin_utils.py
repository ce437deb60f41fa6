"""gin at the edges, T5X style: `--gin_file=...` and `--gin.NAME=VALUE`.

Scripts call `define_gin_flags()` at import, run with `run(main)` (which turns
`--gin.X=V` into a gin binding before absl parses the flags), then
`parse_gin_flags()` and `build(SomeConfig)`. Library code never reads gin.
"""

import os
import sys
from typing import Any, Callable, List, Optional, Sequence

from absl import app
from absl import flags
import gin


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'configs')


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
  flags.DEFINE_multi_string(
      'gin_file', [], 'gin files to parse, in order (paths relative to the '
      'working directory or to configs/).')
  flags.DEFINE_multi_string(
      'gin_bindings', [], 'Individual gin bindings; `--gin.X=V` is the same '
      'as `--gin_bindings="X = V"`.')
  flags.DEFINE_bool('gin_dry_run', False,
                    'Print the parsed configuration and what it would load, '
                    'then stop.')


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


def parse_gin_flags(modules: Sequence[str] = (),
                    extra_files: Sequence[str] = (),
                    extra_bindings: Sequence[str] = ()) -> None:
  """Parses --gin_file and --gin_bindings (configs/ is on the search path).

  Args:
    modules: `spec_decode` submodules to register for bindings given on the
      command line alone (e.g. 'main' makes `--gin.main.MainConfig.X=V`
      work without a gin file).
    extra_files: gin files parsed before --gin_file.
    extra_bindings: Bindings parsed before --gin_bindings.
  """
  gin.add_config_file_search_path(CONFIGS_DIR)
  gin.add_config_file_search_path(os.getcwd())
  files = list(extra_files) + list(flags.FLAGS.gin_file)
  preamble = ''.join(f'from spec_decode import {m}\n' for m in modules)
  if preamble:
    preamble = 'from __gin__ import dynamic_registration\n' + preamble
  bindings = ([preamble] if preamble else []) + list(extra_bindings) + list(
      flags.FLAGS.gin_bindings)
  gin.parse_config_files_and_bindings(files, bindings,
                                      finalize_config=False)


def run(main: Callable[[List[str]], Any],
        argv: Optional[Sequence[str]] = None) -> None:
  """`absl.app.run` that understands `--gin.NAME=VALUE`."""
  argv = rewrite_gin_args(sys.argv if argv is None else argv)
  app.run(main, argv=argv)
