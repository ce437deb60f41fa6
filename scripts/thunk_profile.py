r"""Where a decoding loop's time goes, op by op, from XLA:CPU's own trace.

  python scripts/thunk_profile.py --decoder=speculative --temperature=1
  python scripts/thunk_profile.py --decoder=auto --gamma=1  # 'auto''s loop

Decodes one held-out En->De input with the shipped pair to --max_decode_len
tokens (no EOS, so every run has the same number of iterations), several
times under `jax.profiler.trace` with XLA:CPU's per-thunk trace events
switched on (`--xla_cpu_enable_xprof_traceme`), and prints each kind of
thunk's own time (its events' durations less those of events nested in
them) per loop iteration: the few-row kernel's calls (`ffi_call`: products
and attention), the fusions XLA emits around them, copies, control flow.
The decoders:

  baseline      plain decoding, one target step per iteration;
  speculative   a fixed --gamma, the draft proposing every iteration;
  auto          gamma='auto''s program at --max_gamma with costs that
                make every row propose --gamma at every iteration
                (`adaptive.forced_costs`; 0: plain steps in that loop,
                against `baseline`): against `speculative` at the
                same --gamma, what its per-width loops, catch-ups and
                rule cost.

  call          no decoding loop: the target's decoder calls alone, each
                scoring --chunks tokens per row, in a compiled loop of
                calls as `benchmark.decoder_call_seconds` times them
                (`--chunks=1,8`: what grows with the tokens a call
                scores, op by op; figures per call, not per iteration).

`--num_candidates=k` runs `speculative` with k candidates per row
(`spec_decode.candidates`): against k = 1, what the tree call, the draft's
k chains and the copies cost.

`--by_op` also groups the thunks' own time by the model op each came from
(the op names XLA keeps in the compiled programs' metadata, read from an
HLO dump): which product, attention or norm of which part of the loop
(target call, the draft's steps, verification) the time went to.

Read the per-iteration figures against each other (same run, same
machine); absolute times include the tracing's own cost (~1 us per thunk)
and move with the host. Also printed: thunks per iteration and how much
of the kernel calls' time other thunks ran beside them on another thread.
"""

import bisect
import collections
import glob
import gzip
import json
import os
import re
import shutil
import tempfile

from absl import app
from absl import flags
import jax
import numpy as np

from spec_decode import adaptive
from spec_decode import benchmark
from spec_decode import costs
from spec_decode import decoding
from spec_decode import evaluation
from spec_decode import kernels
from spec_decode import pretrained
from spec_decode import speculative
from spec_decode.data import tasks
from spec_decode.sampling import SamplingConfig

FLAGS = flags.FLAGS
flags.DEFINE_enum('decoder', 'speculative',
                  ['baseline', 'speculative', 'auto', 'call'], 'See above.')
flags.DEFINE_list('chunks', ['1', '8'],
                  'Tokens per row per decoder call (--decoder=call).')
flags.DEFINE_integer('calls', 24, 'Decoder calls per run (--decoder=call).')
flags.DEFINE_float('temperature', 0.0, 'Sampling temperature.')
flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.')
flags.DEFINE_integer('max_gamma', 7, "gamma='auto''s largest count (auto).")
flags.DEFINE_integer('num_candidates', 1,
                     'Candidates per row (speculative).')
flags.DEFINE_integer('max_decode_len', 48, 'Tokens decoded per run.')
flags.DEFINE_integer('runs', 5, 'Traced runs (after two untraced ones).')
flags.DEFINE_integer('top', 25, 'Kinds of thunk printed.')
flags.DEFINE_enum('product_inputs', kernels.product_inputs(),
                  list(kernels.PRODUCT_INPUTS), 'The kernel\'s product inputs.')
flags.DEFINE_bool('by_op', False,
                  'Also group the thunks\' own time by the model op they '
                  'came from (from the compiled programs\' HLO metadata).')
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_string('draft', 't5_local_draft_tiny', 'Shipped draft.')

# Trace events that are not thunks: Python frames, runtime bookkeeping.
_NOT_THUNKS = ('$', 'Pjit', 'ThunkExecutor', 'Threadpool', 'end: ',
               'CommonPjRt', 'ParseArguments', 'DevicePut', 'Wait for')


def _decode_function(target, draft, enc):
  key = jax.random.PRNGKey(0)
  sampling = SamplingConfig(FLAGS.temperature)
  length = FLAGS.max_decode_len
  if FLAGS.decoder == 'baseline':
    return lambda: decoding.baseline_generate(
        target.config, target.device_params, enc, key, length, sampling, -1,
        None, target.decode_kernels)
  gamma, costs_arg = FLAGS.gamma, None
  if FLAGS.decoder == 'auto':
    gamma = FLAGS.max_gamma
    costs_arg = adaptive.forced_costs(FLAGS.gamma, FLAGS.max_gamma)
  return lambda: speculative.speculative_generate(
      target, draft, enc, rng=key, max_decode_len=length, sampling=sampling,
      eos_id=-1, gamma=gamma, lenience=1.0, proposal_costs=costs_arg,
      num_candidates=FLAGS.num_candidates)


def _traced_thunks(run) -> list:
  """The thunk events of --runs traced runs of `run` (compiled and warm)."""
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      for _ in range(FLAGS.runs):
        jax.block_until_ready(run())
    (path,) = glob.glob(os.path.join(folder, '**', 'perfetto_trace.json.gz'),
                        recursive=True)
    with gzip.open(path) as f:
      events = [e for e in json.load(f)['traceEvents']
                if e.get('ph') == 'X' and 'dur' in e]
  return [e for e in events if not e['name'].startswith(_NOT_THUNKS)]


def _profile_calls(target, enc, dump: str) -> None:
  """--decoder=call: own time per decoder call at each --chunks width, by
  kind of thunk and by op, side by side, and each width's over the first."""
  chunks = [int(k) for k in FLAGS.chunks]
  span = FLAGS.calls * max(chunks)
  per_kind, per_op, thunk_counts = {}, {}, {}
  for chunk in chunks:
    calls = span // chunk
    run = benchmark.timed_decoder_calls(target, enc, chunk, 8, calls,
                                        cache_length=8 + span + 8)
    for _ in range(2):  # Compile, warm up.
      jax.block_until_ready(run())
    thunks = _traced_thunks(run)
    own = _self_times(thunks)
    scale = 1e3 * FLAGS.runs * calls  # us -> ms per call
    kinds = collections.Counter()
    for event in thunks:
      kinds[event['name'].split('.')[0]] += own[id(event)] / scale
    per_kind[chunk] = kinds
    thunk_counts[chunk] = len(thunks) / FLAGS.runs / calls
    if FLAGS.by_op:
      per_op[chunk] = collections.Counter(
          {op: spent / scale
           for op, spent in _by_op(thunks, own, _op_names(dump)).items()})
  first, last = chunks[0], chunks[-1]
  header = ''.join(f'{f"K={k}":>10s}' for k in chunks)
  totals = {k: sum(per_kind[k].values()) for k in chunks}
  print('target decoder calls, own time per call (ms); thunks per call: '
        + ', '.join(f'K={k} {thunk_counts[k]:.0f}' for k in chunks))
  print(f'  {"total":44s}' + ''.join(f'{totals[k]:10.4f}' for k in chunks)
        + f'   (K={last} over K={first}: {totals[last] / totals[first]:.2f})')
  for title, table in (('by kind of thunk', per_kind), ('by op', per_op)):
    if not table:
      continue
    print(f'{title}:{" " * (44 - len(title))}{header}')
    growth = collections.Counter({name: table[last][name]
                                  - table[first][name]
                                  for name in set().union(*table.values())})
    for name, _ in sorted(growth.items(), key=lambda item: -abs(item[1])
                          )[:FLAGS.top]:
      print(f'  {name[-44:]:44s}'
            + ''.join(f'{table[k][name]:10.4f}' for k in chunks))


def _self_times(events):
  """Each event's duration less its directly nested events', per thread."""
  by_thread = collections.defaultdict(list)
  for event in events:
    by_thread[(event.get('pid'), event.get('tid'))].append(event)
  for thread_events in by_thread.values():
    thread_events.sort(key=lambda e: (e['ts'], -e['dur']))
    stack = []
    for event in thread_events:
      while stack and stack[-1]['ts'] + stack[-1]['dur'] <= event['ts']:
        stack.pop()
      if stack:
        stack[-1]['nested'] = stack[-1].get('nested', 0) + event['dur']
      stack.append(event)
  return {id(e): e['dur'] - e.get('nested', 0) for e in events}


def main(argv):
  del argv
  # XLA reads its flags when the backend starts, at the first computation.
  dump = tempfile.mkdtemp(prefix='thunk_profile_hlo_')
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + ' --xla_cpu_enable_xprof_traceme=true'
      + (f' --xla_dump_to={dump} --xla_dump_hlo_as_text' if FLAGS.by_op
         else '')).strip()
  kernels.set_product_inputs(FLAGS.product_inputs)
  print(costs.machine_line())
  print(f'decoder products: {kernels.available()}')
  target = pretrained.load(FLAGS.target)
  draft = pretrained.load(FLAGS.draft)
  source = tasks.load_pairs('translate_en_de', 'test')[3][0]
  enc = evaluation.trim_padding(evaluation.encode_inputs(
      pretrained.vocabulary(), 'translate_en_de', [source], 64))
  if FLAGS.decoder == 'call':
    _profile_calls(target, enc, dump)
    return
  decode = _decode_function(target, draft, enc)
  for _ in range(2):  # Compile, warm up.
    result = decode()
    jax.block_until_ready(result.tokens)
  iterations = int(np.asarray(result.num_iterations))
  thunks = _traced_thunks(lambda: decode().tokens)
  own = _self_times(thunks)
  per_kind = collections.Counter()
  count = collections.Counter()
  for event in thunks:
    kind = event['name'].split('.')[0]
    per_kind[kind] += own[id(event)]
    count[kind] += 1
  scale = 1e3 * FLAGS.runs * iterations  # us -> ms per iteration
  print(f'{FLAGS.decoder}, T={FLAGS.temperature}, {iterations} loop '
        f'iterations for {FLAGS.max_decode_len} tokens; thunks per '
        f'iteration {len(thunks) / FLAGS.runs / iterations:.0f}; own time '
        f'per iteration {sum(per_kind.values()) / scale:.3f} ms, of it:')
  for kind, spent in per_kind.most_common(FLAGS.top):
    print(f'  {kind:44s} {spent / scale:8.4f} ms  '
          f'({count[kind] / FLAGS.runs / iterations:.1f} per iteration)')
  # Other thunks running beside the kernel calls, on other threads: they
  # take a core the kernel's helpers would use.
  calls = [e for e in thunks if e['name'].startswith('ffi_call')]
  others = sorted((e for e in thunks if not e['name'].startswith(
      ('ffi_call', 'while', 'cond', 'call'))), key=lambda e: e['ts'])
  starts = [e['ts'] for e in others]
  beside = 0.0
  for call in calls:
    begin, end = call['ts'], call['ts'] + call['dur']
    index = bisect.bisect_left(starts, begin - 1e4)
    while index < len(others) and others[index]['ts'] < end:
      other = others[index]
      if other['tid'] != call['tid']:
        beside += max(0.0, min(end, other['ts'] + other['dur'])
                      - max(begin, other['ts']))
      index += 1
  print(f'kernel calls: {sum(c["dur"] for c in calls) / scale:.3f} ms per '
        f'iteration, other thunks beside them {beside / scale:.4f} ms')
  if FLAGS.by_op:
    per_op = _by_op(thunks, own, _op_names(dump))
    print('own time per iteration by the op the thunks came from (decoder '
          'layers together; ? where XLA kept no op name):')
    for op, spent in per_op.most_common(FLAGS.top):
      print(f'  {spent / scale:8.4f} ms  {op}')
  shutil.rmtree(dump, ignore_errors=True)


def _op_names(dump: str) -> dict:
  """Instruction name -> the op_name XLA kept for it, from every compiled
  program's optimised HLO in `dump`."""
  names = {}
  pattern = re.compile(r'\s*(?:ROOT )?%(\S+) = .*op_name="([^"]*)"')
  for path in glob.glob(os.path.join(dump, '*after_optimizations.txt')):
    with open(path) as f:
      for line in f:
        match = pattern.match(line)
        if match:
          names.setdefault(match.group(1), match.group(2))
  return names


def _by_op(thunks, own, names) -> collections.Counter:
  """Own time per op path: the jit and loop wrappers dropped, every decoder
  layer counted as one ('layers_*'), the kernel calls named by the product
  or attention they compute."""
  per_op = collections.Counter()
  for event in thunks:
    op = names.get(event['name'], '?' + event['name'].split('.')[0])
    op = re.sub(r'layers_\d+', 'layers_*', op)
    op = re.sub(r'branch_\d+_fun', 'branch', op)
    op = re.sub(r'^jit\([^)]*\)/', '', op)
    per_op[op] += own[id(event)]
  return per_op


if __name__ == '__main__':
  app.run(main)
