r"""Reproduces the paper's tables: one command per table.

  # Table 2 at CPU scale (shipped models) and on a TPU VM (T5X checkpoints):
  python scripts/reproduce_paper.py --table=2 --rows=configs/local
  python scripts/reproduce_paper.py --table=2 --rows=configs/paper \
      --gin.T5_1_1_XXL_CHECKPOINT="'gs://...'"
  # Table 3 (alpha of every draft) and the lenience trade-off (Table 5):
  python scripts/reproduce_paper.py --table=3 --gin_file=local/table3.gin
  python scripts/reproduce_paper.py --table=lenience --gin_file=local/sweep.gin
  # Token vs block verification x fixed vs adaptive draft length (+ PNG):
  python scripts/reproduce_paper.py --table=verification \
      --gin_file=local/verification.gin
  # Block vs token verification, tokens per target call seed by seed
  # (counts only, so more inputs and seeds than the timed comparison):
  python scripts/reproduce_paper.py --table=block_gain \
      --gin_file=local/verification.gin
  # k candidate continuations per row x gamma, against the analysis (+ PNG):
  python scripts/reproduce_paper.py --table=candidates \
      --gin_file=local/candidates.gin
  # Any of them with --gin_dry_run prints what would be loaded and stops.

Writes <output_dir>/table<N>.{json,csv,md} and prints the Markdown table.
"""

import os

from absl import flags

from spec_decode import costs
from spec_decode import gin_utils
from spec_decode import report
from spec_decode import reproduce
from spec_decode import sweeps

FLAGS = flags.FLAGS
flags.DEFINE_enum('table', '2',
                  ['2', '3', 'lenience', 'verification', 'block_gain',
                   'candidates'],
                  'Which table.')
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

VERIFICATION_COLUMNS = [
    'task', 'temperature', 'batch_size', 'verification', 'draft_length',
    'alpha', 'tokens_per_target_call', 'measured_speedup',
    'predicted_speedup_at_lengths', 'identical_rows', 'rows']
CANDIDATE_COLUMNS = [
    'task', 'temperature', 'batch_size', 'gamma', 'num_candidates', 'width',
    'alpha_beta', 'first_token_acceptance', 'accepted_per_target_call',
    'predicted_tokens_per_call', 'predicted_over_measured_tokens',
    'seed_tokens_mean', 'seed_tokens_std', 'seed_predicted_mean',
    'tokens_per_target_call', 'c',
    'verify_cost', 'measured_speedup', 'predicted_speedup_candidates',
    'identical_rows', 'rows']
BLOCK_GAIN_COLUMNS = [
    'task', 'temperature', 'batch_size', 'draft_length', 'seed', 'token',
    'block', 'block_gain', 'block_gain_std', 'seeds_block_ahead']


def load_row(path):
  return gin_utils.load_row(path, reproduce.ComparisonRow,
                            modules=['reproduce', 'specs'])


def table_2():
  results = []
  files = gin_utils.row_files(FLAGS.rows)
  progress = report.Progress('rows', len(files))
  for path in files:
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
    progress.step()
  return results, TABLE2_COLUMNS


def main(argv):
  del argv
  if FLAGS.table == '2':
    results, columns = table_2()
  else:
    gin_utils.parse_gin_flags(modules=['reproduce', 'sweeps', 'specs'])
    if FLAGS.table == '3':
      table = gin_utils.build(reproduce.AcceptanceTable)
      print(table.describe())
      if FLAGS.gin_dry_run:
        return
      results, columns = reproduce.acceptance_table(table), TABLE3_COLUMNS
    elif FLAGS.table == 'verification':
      comparison = gin_utils.build(sweeps.VerificationComparison)
      print(comparison.describe())
      if FLAGS.gin_dry_run:
        return
      progress = report.Progress('settings', len(comparison.settings()))

      def on_row(r):
        print(f"  {r['task']} T={r['temperature']} batch {r['batch_size']} "
              f"{r['verification']} {r['draft_length']}: "
              f"{r['tokens_per_target_call']:.2f} tokens/call, "
              f"{r['measured_speedup']:.2f}x", flush=True)
        progress.step()

      results = sweeps.verification_comparison(comparison, on_row)
      columns = VERIFICATION_COLUMNS
    elif FLAGS.table == 'candidates':
      comparison = gin_utils.build(sweeps.CandidateComparison)
      print(comparison.describe())
      if FLAGS.gin_dry_run:
        return
      progress = report.Progress('settings', len(comparison.settings()))

      def on_candidates(r):
        print(f"  {r['task']} T={r['temperature']} batch {r['batch_size']} "
              f"gamma {r['gamma']} k={r['num_candidates']}: "
              f"{r['accepted_per_target_call']:.2f} tokens/call (predicted "
              f"{r['predicted_tokens_per_call']:.2f}), "
              f"{r['measured_speedup']:.2f}x", flush=True)
        progress.step()

      results = sweeps.candidate_comparison(comparison, on_candidates)
      columns = CANDIDATE_COLUMNS
    elif FLAGS.table == 'block_gain':
      comparison = gin_utils.build(sweeps.VerificationComparison)
      print(comparison.describe())
      if FLAGS.gin_dry_run:
        return
      sampled = sum(row.temperature > 0 for row in comparison.rows)
      progress = report.Progress('seeds', 2 * sampled * len(comparison.seeds))

      def on_seed(r):
        print(f"  {r['task']} T={r['temperature']} {r['draft_length']} "
              f"seed {r['seed']}: token {r['token']:.3f}, block "
              f"{r['block']:.3f} tokens/call ({r['block_gain']:+.3f})",
              flush=True)
        progress.step()

      results = sweeps.block_gain(comparison, on_seed)
      columns = BLOCK_GAIN_COLUMNS
    else:
      sweep = gin_utils.build(sweeps.Sweep)
      print(sweep.describe())
      if FLAGS.gin_dry_run:
        return
      progress = report.Progress('lenience values', len(sweep.leniences))
      results = sweeps.lenience_sweep(sweep, progress.step)
      columns = LENIENCE_COLUMNS
  if FLAGS.gin_dry_run:
    return
  paths = report.write_rows(results, FLAGS.output_dir,
                            f'table{FLAGS.table}', columns)
  if FLAGS.table == 'verification' and paths:
    paths['png'] = os.path.join(FLAGS.output_dir, 'tableverification.png')
    plot_verification(results, paths['png'])
  if FLAGS.table == 'candidates' and paths:
    paths['png'] = os.path.join(FLAGS.output_dir, 'tablecandidates.png')
    plot_candidates(results, paths['png'])
  print()
  print(report.markdown_table(results, columns))
  # Timings depend on the CPU's vector units: printed beside every table.
  print(costs.machine_line())
  print('\nwrote', ', '.join(paths.values()))


def plot_verification(results, path):
  """Bars of measured speedup per setting, one panel per batch size."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  batch_sizes = sorted({r['batch_size'] for r in results})
  cases = sorted({(r['task'], r['temperature']) for r in results})
  settings = sorted({(r['verification'], r['draft_length']) for r in results})
  fig, axes = plt.subplots(1, len(batch_sizes), figsize=(
      6 * len(batch_sizes), 4), squeeze=False)
  width = 0.8 / len(settings)
  for ax, batch_size in zip(axes[0], batch_sizes):
    for index, setting in enumerate(settings):
      heights = [next((r['measured_speedup'] for r in results
                       if (r['task'], r['temperature']) == case
                       and (r['verification'], r['draft_length']) == setting
                       and r['batch_size'] == batch_size), 0.0)
                 for case in cases]
      ax.bar([i + index * width for i in range(len(cases))], heights, width,
             label=f'{setting[0]}, {setting[1]}')
    ax.axhline(1.0, color='gray', linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))])
    ax.set_xticklabels([f'{t}\nT={temp:g}' for t, temp in cases])
    ax.set_ylabel('measured speedup over baseline')
    ax.set_title(f'batch {batch_size}')
  axes[0][0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def plot_candidates(results, path):
  """Tokens per call (measured and predicted) and measured speedup against
  k, one line per (task, temperature, gamma), one panel pair per batch."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  batch_sizes = sorted({r['batch_size'] for r in results})
  fig, axes = plt.subplots(2, len(batch_sizes), figsize=(
      6 * len(batch_sizes), 7), squeeze=False)
  lines = sorted({(r['task'], r['temperature'], r['gamma']) for r in results})
  for column, batch_size in enumerate(batch_sizes):
    for line in lines:
      points = sorted((r['num_candidates'], r) for r in results
                      if (r['task'], r['temperature'], r['gamma']) == line
                      and r['batch_size'] == batch_size)
      ks = [k for k, _ in points]
      label = f'{line[0]} T={line[1]:g} gamma {line[2]}'
      drawn = axes[0][column].plot(
          ks, [r['accepted_per_target_call'] for _, r in points], 'o-',
          label=label)
      axes[0][column].plot(ks, [r['predicted_tokens_per_call']
                                for _, r in points], 'x--',
                           color=drawn[0].get_color())
      axes[1][column].plot(ks, [r['measured_speedup'] for _, r in points],
                           'o-', label=label)
    axes[0][column].set_title(f'batch {batch_size}: tokens per target call '
                              '(o measured, x predicted)')
    axes[1][column].axhline(1.0, color='gray', linewidth=0.8)
    axes[1][column].set_title(f'batch {batch_size}: measured speedup')
    for row in axes:
      row[column].set_xlabel('candidates per row (k)')
  axes[0][0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


if __name__ == '__main__':
  gin_utils.run(main)
