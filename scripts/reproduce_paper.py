r"""Reproduces the paper's tables: one command per table.

  # Table 2 at CPU scale (shipped models) and on a TPU VM (T5X checkpoints):
  python scripts/reproduce_paper.py --table=2 --rows=configs/local
  python scripts/reproduce_paper.py --table=2 --rows=configs/paper \
      --gin.T5_1_1_XXL_CHECKPOINT="'gs://...'"
  # Table 3 (alpha of every draft) and the lenience trade-off (Table 5):
  python scripts/reproduce_paper.py --table=3 --gin_file=local/table3.gin
  python scripts/reproduce_paper.py --table=lenience --gin_file=local/sweep.gin
  # Any of them with --gin_dry_run prints what would be loaded and stops.

Writes <output_dir>/table<N>.{json,csv,md} and prints the Markdown table.
"""

import glob
import os

from absl import flags
import gin

from spec_decode import gin_utils
from spec_decode import report
from spec_decode import reproduce

FLAGS = flags.FLAGS
flags.DEFINE_enum('table', '2', ['2', '3', 'lenience'], 'Which table.')
flags.DEFINE_multi_string('rows', [],
                          'Table 2: row gin files, or folders of them.')
flags.DEFINE_string('output_dir', 'output/reproduce', 'Where to write.')
gin_utils.define_gin_flags()

TABLE2_COLUMNS = [
    'row', 'temperature', 'gamma', 'alpha', 'alpha_beta',
    'tokens_per_target_call', 'c', 'verify_cost', 'baseline_ms_per_token',
    'speculative_ms_per_token', 'measured_speedup', 'predicted_speedup',
    'measured_over_predicted', 'predicted_speedup_with_verify_cost',
    'measured_over_predicted_with_verify_cost',
    'predicted_speedup_at_lengths', 'measured_over_predicted_at_lengths',
    'identical_rows', 'rows',
    'paper_alpha', 'paper_speedup']
TABLE3_COLUMNS = ['task', 'draft', 'temperature', 'alpha', 'alpha_beta']
LENIENCE_COLUMNS = ['lenience', 'temperature', 'alpha', 'alpha_beta',
                    'tokens_per_target_call', 'measured_speedup',
                    'predicted_speedup_with_verify_cost',
                    'predicted_speedup_at_lengths']


def row_files():
  files = []
  for entry in FLAGS.rows:
    if os.path.isdir(entry):
      files.extend(sorted(
          f for f in glob.glob(os.path.join(entry, '*.gin'))
          if os.path.basename(f) not in ('common.gin', 'table3.gin',
                                         'sweep.gin')))
    else:
      files.append(entry)
  if not files:
    raise ValueError('--rows names no row gin files.')
  return files


def load_row(path):
  gin.clear_config()
  gin_utils.parse_gin_flags(modules=['reproduce', 'specs'],
                            extra_files=[path])
  return gin_utils.build(reproduce.ComparisonRow)


def table_2():
  results = []
  for path in row_files():
    row = load_row(path)
    print(row.describe(), flush=True)
    if FLAGS.gin_dry_run:
      continue
    result = reproduce.measure_row(row)
    results.append(result)
    print(f"  alpha {result['alpha']:.3f}, measured "
          f"{result['measured_speedup']:.2f}x, predicted "
          f"{result['predicted_speedup']:.2f}x (with verify cost "
          f"{result['predicted_speedup_with_verify_cost']:.2f}x, and at "
          f"the outputs' lengths {result['predicted_speedup_at_lengths']:.2f}x)",
          flush=True)
  return results, TABLE2_COLUMNS


def main(argv):
  del argv
  if FLAGS.table == '2':
    results, columns = table_2()
  else:
    gin_utils.parse_gin_flags(modules=['reproduce', 'specs'])
    if FLAGS.table == '3':
      table = gin_utils.build(reproduce.AcceptanceTable)
      print(table.describe())
      if FLAGS.gin_dry_run:
        return
      results, columns = reproduce.acceptance_table(table), TABLE3_COLUMNS
    else:
      sweep = gin_utils.build(reproduce.Sweep)
      print(sweep.describe())
      if FLAGS.gin_dry_run:
        return
      results, columns = reproduce.lenience_sweep(sweep), LENIENCE_COLUMNS
  if FLAGS.gin_dry_run:
    return
  paths = report.write_rows(results, FLAGS.output_dir,
                            f'table{FLAGS.table}', columns)
  print()
  print(report.markdown_table(results, columns))
  print('\nwrote', ', '.join(paths.values()))


if __name__ == '__main__':
  gin_utils.run(main)
