r"""Figure-3-style sweeps: speedup against gamma and against batch size.

  python scripts/sweep.py --sweep=gamma --gin_file=local/sweep.gin
  python scripts/sweep.py --sweep=batch --gin_file=local/sweep.gin

Writes <output_dir>/sweep_<kind>.{json,csv,md} and a PNG plot: measured
points over the curve the analysis predicts (gamma), or speedup per batch size
with the batch size where speculation stops paying (batch).
"""

import os

from absl import flags
import numpy as np

from spec_decode import analysis
from spec_decode import gin_utils
from spec_decode import report
from spec_decode import sweeps

FLAGS = flags.FLAGS
flags.DEFINE_enum('sweep', 'gamma', ['gamma', 'batch'], 'What to vary.')
flags.DEFINE_string('output_dir', 'output/reproduce', 'Where to write.')
gin_utils.define_gin_flags()

COLUMNS = ['gamma', 'batch_size', 'alpha', 'tokens_per_target_call', 'c',
           'verify_cost', 'baseline_ms_per_token', 'speculative_ms_per_token',
           'measured_speedup', 'predicted_speedup',
           'predicted_speedup_with_verify_cost', 'predicted_speedup_at_lengths',
           'identical_rows', 'rows']


def plot_gamma(rows, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  gammas = np.array([r['gamma'] for r in rows])
  alpha = float(np.mean([r['alpha'] for r in rows]))
  c = float(np.median([r['c'] for r in rows]))
  grid = np.arange(1, max(gammas) + 1)
  verify = {r['gamma']: r['verify_cost'] for r in rows}
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(grid, analysis.walltime_improvement(alpha, grid, c), '-',
          label=f'Theorem 3.8 (alpha={alpha:.2f}, c={c:.3f})')
  ax.plot(gammas, [analysis.walltime_improvement(alpha, g, c, verify[g])
                   for g in gammas], '--',
          label='with measured verification cost')
  ax.plot(gammas, [r['predicted_speedup_at_lengths'] for r in rows], 'x',
          label='... and the outputs\' real lengths')
  ax.plot(gammas, [r['measured_speedup'] for r in rows], 'o',
          label='measured')
  ax.axhline(1.0, color='gray', lw=0.5)
  ax.set_xlabel('gamma (draft tokens per iteration)')
  ax.set_ylabel('speedup over baseline')
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def plot_batch(rows, crossing, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  sizes = [r['batch_size'] for r in rows]
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(sizes, [r['measured_speedup'] for r in rows], 'o-',
          label='measured')
  ax.axhline(1.0, color='gray', lw=0.5)
  if crossing:
    ax.axvline(crossing, color='red', lw=0.8, ls=':',
               label=f'no gain from batch {crossing}')
  ax.set_xscale('log', base=2)
  ax.set_xlabel('batch size')
  ax.set_ylabel('speedup over baseline')
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv):
  del argv
  gin_utils.parse_gin_flags(modules=['reproduce', 'sweeps', 'specs'])
  sweep = gin_utils.build(sweeps.Sweep)
  print(sweep.describe(), flush=True)
  if FLAGS.gin_dry_run:
    return
  points = sweep.gammas if FLAGS.sweep == 'gamma' else sweep.batch_sizes
  progress = report.Progress(f'{FLAGS.sweep} sweep points', len(points))

  def on_row(row):
    print(f"gamma {row['gamma']} batch {row['batch_size']}: alpha "
          f"{row['alpha']:.3f} measured {row['measured_speedup']:.2f}x "
          f"predicted {row['predicted_speedup']:.2f}x", flush=True)
    progress.step()

  if FLAGS.sweep == 'gamma':
    rows = sweeps.gamma_sweep(sweep, on_row)
  else:
    rows = sweeps.batch_sweep(sweep, on_row)
  name = f'sweep_{FLAGS.sweep}'
  paths = report.write_rows(rows, FLAGS.output_dir, name, COLUMNS)
  png = os.path.join(FLAGS.output_dir, name + '.png')
  if FLAGS.sweep == 'gamma':
    plot_gamma(rows, png)
  else:
    crossing = sweeps.crossing_batch_size(rows)
    plot_batch(rows, crossing, png)
    print(f'speculation stops paying at batch size {crossing}'
          if crossing else 'speculation pays at every batch size measured')
  print(report.markdown_table(rows, COLUMNS))
  print('wrote', ', '.join(list(paths.values()) + [png]))


if __name__ == '__main__':
  gin_utils.run(main)
