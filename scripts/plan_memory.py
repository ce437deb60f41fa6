r"""Per-device memory of each paper row at several model-parallel sizes.

  python scripts/plan_memory.py --rows=configs/paper --num_partitions=1,4,8
  python scripts/plan_memory.py --rows=configs/paper/ende_t0_small.gin \
      --num_partitions=8 --gin.reproduce.ComparisonRow.batch_size=32

Compiles the speculative loop of every row on abstract shapes (no weights,
no checkpoint read) over a (1, num_partitions) mesh and prints, per device:
target and draft parameter bytes, cache bytes, XLA's temporaries and the
total, and which chips (TPU v4 32 GB, v5e 16 GB, v5p 95 GB, H100 80 GB,
H200 141 GB) it fits. On a CPU host the devices are host-platform CPU devices
(the script asks for enough of them); there XLA:CPU also keeps float32 copies
of bfloat16 weights, shown apart and not counted against a chip. On a TPU VM
run it as it is: the TPU compiler's plan is then the one printed.

Writes <output_dir>/memory_plan.{json,csv,md}, after every plan. An XXL
compile takes ~1 min and a few GB of host memory on a 2-core machine.
"""

import os
import sys


def _request_host_devices(argv) -> None:
  """Asks XLA for enough host CPU devices before JAX starts."""
  count = 8
  for arg in argv:
    if arg.startswith('--num_partitions='):
      count = max(int(n) for n in arg.split('=', 1)[1].split(','))
  flags_now = os.environ.get('XLA_FLAGS', '')
  if 'xla_force_host_platform_device_count' not in flags_now:
    os.environ['XLA_FLAGS'] = (
        f'{flags_now} --xla_force_host_platform_device_count={count}').strip()


_request_host_devices(sys.argv)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags

from spec_decode import gin_utils
from spec_decode import memory_plan
from spec_decode import report
from spec_decode import reproduce
from spec_decode.model import param_shapes
from spec_decode.model import parameter_count

FLAGS = flags.FLAGS
flags.DEFINE_multi_string('rows', ['configs/paper'],
                          'Row gin files, or folders of them.')
flags.DEFINE_list('num_partitions', ['1', '4', '8'],
                  'Model-parallel sizes to plan for.')
flags.DEFINE_string('output_dir', 'output/memory_plan', 'Where to write.')
gin_utils.define_gin_flags()

COLUMNS = ['row', 'num_partitions', 'target_params_gb', 'draft_params_gb',
           'cache_gb', 'xla_temp_gb', 'cpu_weight_copy_gb', 'total_gb',
           'target_params_over_ideal', 'fits', 'backend', 'compile_seconds']


def _gb(count: int) -> float:
  return round(count / 1e9, 3)


def plan_row(row, num_partitions: int, cache: dict) -> dict:
  """One row at one model-parallel size (compiles shared across rows)."""
  target = row.target.model_config()
  draft = row.draft.model_config()
  key = (target, draft, row.batch_size, row.data.input_length,
         row.max_decode_len, row.gamma, row.temperature > 0, num_partitions)
  if key not in cache:
    cache[key] = memory_plan.plan_speculative(
        target, draft, batch_size=row.batch_size,
        input_length=row.data.input_length,
        max_decode_len=row.max_decode_len, gamma=row.gamma,
        num_partitions=num_partitions, params_dtype=row.target.dtype,
        temperature=row.temperature)
  plan = cache[key]
  ideal = (parameter_count(param_shapes(target))
           * (2 if row.target.dtype == 'bfloat16' else 4) / num_partitions)
  return {
      'row': row.name, 'num_partitions': num_partitions,
      'target_params_gb': _gb(plan['target_param_bytes']),
      'draft_params_gb': _gb(plan['draft_param_bytes']),
      'cache_gb': _gb(plan['cache_bytes']),
      'xla_temp_gb': _gb(plan['device_temp_bytes']),
      'cpu_weight_copy_gb': _gb(plan['cpu_weight_copy_bytes']),
      'total_gb': _gb(plan['total_bytes']),
      'target_params_over_ideal': round(plan['target_param_bytes'] / ideal,
                                        4),
      'fits': ', '.join(chip for chip, fits in plan['fits'].items() if fits)
              or 'none',
      'backend': plan['backend'],
      'compile_seconds': round(plan['compile_seconds'], 1),
  }


def main(argv):
  del argv
  sizes = [int(n) for n in FLAGS.num_partitions]
  rows, cache = [], {}
  for path in gin_utils.row_files(FLAGS.rows):
    row = gin_utils.load_row(path, reproduce.ComparisonRow,
                             modules=['reproduce', 'specs'])
    print(row.describe(), flush=True)
    if FLAGS.gin_dry_run:
      continue
    for size in sizes:
      result = plan_row(row, size, cache)
      rows.append(result)
      print(f"  model parallel {size}: total {result['total_gb']} GB per "
            f"device (params {result['target_params_gb']} + "
            f"{result['draft_params_gb']}, caches {result['cache_gb']}, "
            f"XLA temp {result['xla_temp_gb']}); fits {result['fits']}",
            flush=True)
      # Written after every plan: a long run that dies keeps what it had.
      report.write_rows(rows, FLAGS.output_dir, 'memory_plan', COLUMNS)
  if rows:
    print(report.markdown_table(rows, COLUMNS))


if __name__ == '__main__':
  gin_utils.run(main)
