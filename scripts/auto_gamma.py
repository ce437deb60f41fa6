r"""gamma='auto' against baseline and every fixed gamma, per emitted token.

  python scripts/auto_gamma.py --source=licenses            # unseen text
  python scripts/auto_gamma.py --source=test --batch_size=8 # the main job's

Decodes --num_calls inputs (at --batch_size rows each) of each task, greedy
and at temperature 1, with baseline decoding, each fixed gamma in --gammas
and gamma='auto', all timed in turn per input (interleaved in balanced
orders, `benchmark.balanced_orders`; medians of --repeats). Inputs are
padded to --input_length so every call has one shape: each variant
compiles on the first input (untimed, and for 'auto' that is also where
the costs are measured or read), and no later call may compile; the
slowest of 'auto''s calls over its median, per emitted token (beside
baseline's, for the machine's own spread), says whether one did.

--source=licenses takes sentences (En->De) and paragraphs (summarize) of
the license texts Debian ships in /usr/share/common-licenses: legal prose,
a domain the shipped models never saw. --source=test takes the committed
test samples the main job decodes.

--margins=1.2,1.05 also times 'auto' with the margin its calls' predicted
speedup over baseline must clear to speculate (`generate`'s `min_gain`;
default `adaptive.MIN_GAIN`) set to each value: where a lower margin starts
to pay, or to lose, on this machine.

--simulate times nothing: it replays greedy decoding's iterations exactly
instead. Under greedy decoding a proposal is accepted exactly when the
draft's argmax agrees with the target's output at its position, so where
the draft's teacher-forced argmax agrees with each input's greedy output
decides every iteration of any proposal policy. The in-loop rule
(`adaptive.choose_counts`, `adaptive.update_alpha`) is replayed at each of
--alpha_rates, and every row proposing each count of --gammas at every
iteration, all priced with the pair's measured costs (`costs.cost_profile`,
in baseline steps); the replay's histogram at today's `adaptive.ALPHA_RATE`
is checked against the compiled loop's own. What a policy is worth by the
costs the rule reads, free of the machine's timing noise:

  python scripts/auto_gamma.py --simulate --source=test --num_calls=32

Prints, per task and temperature: ms per emitted token of each variant,
its speedup over baseline, the best fixed gamma, 'auto''s proposals per
iteration (at each margin too), and its slowest/median call per token.
--output writes it all as JSON.
"""

import json
import os
import re
import time
from typing import Dict, List

from absl import app
from absl import flags
import jax
import numpy as np

import spec_decode as sd
from spec_decode import acceptance
from spec_decode import adaptive
from spec_decode import auto_generation
from spec_decode import benchmark
from spec_decode import costs
from spec_decode import evaluation
from spec_decode import pretrained
from spec_decode.data import tasks

FLAGS = flags.FLAGS
flags.DEFINE_enum('source', 'licenses', ['licenses', 'test'],
                  'Where the inputs come from (see above).')
flags.DEFINE_list('tasks', ['translate_en_de', 'summarize'], 'Tasks.')
flags.DEFINE_list('temperatures', ['0', '1'], 'Sampling temperatures.')
flags.DEFINE_list('gammas', ['1', '2', '3', '4', '5', '7'], 'Fixed gammas.')
flags.DEFINE_list('margins', [],
                  "gamma='auto' also at each of these margins over baseline "
                  "decoding (generate's min_gain): where the margin stops "
                  'paying on this machine.')
flags.DEFINE_integer('num_calls', 40, 'Timed inputs (calls) per setting.')
flags.DEFINE_integer('batch_size', 1, 'Rows per call.')
flags.DEFINE_integer('input_length', 64, 'Encoder inputs padded to this.')
flags.DEFINE_integer('max_decode_len', 48, 'Output limit.')
flags.DEFINE_integer('repeats', 3, 'Timed calls per input and variant.')
flags.DEFINE_string('target', 't5_local_target', 'Shipped target.')
flags.DEFINE_string('draft', 't5_local_draft_tiny', 'Shipped draft.')
flags.DEFINE_string('output', None, 'Write the figures as JSON here.')
flags.DEFINE_bool('simulate', False,
                  'Replay greedy iterations exactly instead of timing (see '
                  'above).')
flags.DEFINE_list('alpha_rates', ['0.15', '0.05', '0.02'],
                  "The rule's ALPHA_RATE values --simulate replays.")

LICENSES = '/usr/share/common-licenses'


def license_texts(task: str, count: int) -> List[str]:
  """Sentences (En->De) or paragraphs (summarize) of Debian's license
  texts, in file order, 6 to 60 words each."""
  texts = []
  for name in ('GPL-3', 'Apache-2.0', 'LGPL-3', 'MPL-2.0', 'GFDL-1.3'):
    path = os.path.join(LICENSES, name)
    if not os.path.exists(path):
      continue
    paragraphs = [' '.join(p.split()) for p in
                  open(path, encoding='utf-8').read().split('\n\n')]
    for paragraph in paragraphs:
      pieces = (re.split(r'(?<=[.;:])\s+', paragraph)
                if task == 'translate_en_de' else [paragraph])
      texts += [p for p in pieces if 6 <= len(p.split()) <= 60]
  if len(texts) < count:
    raise ValueError(f'only {len(texts)} license texts for {task} under '
                     f'{LICENSES}; --num_calls must be at most that.')
  return texts[:count]


def inputs_for(task: str, vocabulary) -> np.ndarray:
  count = FLAGS.num_calls * FLAGS.batch_size
  if FLAGS.source == 'licenses':
    sources = license_texts(task, count)
  else:
    pairs = tasks.load_pairs(task, 'test')
    sources = [pairs[i % len(pairs)][0] for i in range(count)]
  return evaluation.encode_inputs(vocabulary, task, sources,
                                  FLAGS.input_length)


def measure(target, draft, enc: np.ndarray, temperature: float
            ) -> Dict[str, object]:
  """One task and temperature: every variant on every call."""
  variants = {'baseline': {}}
  variants.update({f'gamma {g}': dict(draft=draft, gamma=int(g))
                   for g in FLAGS.gammas})
  variants['auto'] = dict(draft=draft, gamma='auto')
  margins = {f'auto {float(m):g}': float(m) for m in FLAGS.margins}
  variants.update({name: dict(draft=draft, gamma='auto', min_gain=margin)
                   for name, margin in margins.items()})
  calls = [enc[i:i + FLAGS.batch_size]
           for i in range(0, len(enc), FLAGS.batch_size)]
  results = {}

  def run(name, index):
    def call():
      result = sd.generate(target, calls[index],
                           max_decode_len=FLAGS.max_decode_len,
                           temperature=temperature,
                           rng=jax.random.PRNGKey(index), **variants[name])
      results[(name, index)] = result
      return result.tokens
    return call

  seconds = {name: [] for name in variants}
  for index in range(len(calls)):
    timings = benchmark.interleaved_timings(
        {name: run(name, index) for name in variants}, FLAGS.repeats,
        warmup=1 if index == 0 else 0, start=index * FLAGS.repeats)
    for name in variants:
      seconds[name].append(benchmark.median(timings[name]))
  tokens = {name: sum(int(np.sum(results[(name, i)].lengths))
                      for i in range(len(calls))) for name in variants}
  ms_per_token = {name: 1e3 * sum(seconds[name]) / tokens[name]
                  for name in variants}
  speedup = {name: ms_per_token['baseline'] / ms_per_token[name]
             for name in variants}
  fixed = [name for name in variants if name.startswith('gamma')]
  best = max(fixed, key=lambda name: speedup[name])
  autos = [name for name in variants if name.startswith('auto')]
  histograms = {name: sum(np.asarray(results[(name, i)].proposal_counts)
                          .sum(0) for i in range(len(calls)))
                for name in autos}
  mean_proposals = {name: float(np.dot(np.arange(len(h)), h) / h.sum())
                    for name, h in histograms.items()}
  histogram = histograms['auto']
  # Per emitted token, so a long output is not mistaken for a compile.
  def slowest_over_median(name):
    per_token = np.asarray([seconds[name][i] / max(
        1, int(np.sum(results[(name, i)].lengths))) for i in range(len(calls))])
    return float(per_token.max() / np.median(per_token))
  identical = None
  if temperature == 0:
    identical = all(np.array_equal(np.asarray(results[(name, i)].tokens),
                                   np.asarray(results[('baseline', i)].tokens))
                    for i in range(len(calls)) for name in autos)
  return {
      'ms_per_token': ms_per_token, 'speedup': speedup,
      'best_fixed': best, 'auto_over_best_fixed': (speedup['auto']
                                                   / speedup[best]),
      'auto_proposal_counts': histogram.tolist(),
      'auto_mean_proposals': mean_proposals['auto'],
      'mean_proposals': mean_proposals,
      'auto_slowest_over_median': slowest_over_median('auto'),
      'baseline_slowest_over_median': slowest_over_median('baseline'),
      'auto_greedy_identical': identical,
  }


def agreement(target, draft, enc: np.ndarray) -> List[np.ndarray]:
  """Per input, `adaptive.greedy_agreement` along the target's greedy
  output (ending at EOS or --max_decode_len)."""
  rows = []
  for index in range(len(enc)):
    tokens = enc[index:index + 1]
    rows += adaptive.greedy_agreement(draft, tokens, sd.generate(
        target, tokens, max_decode_len=FLAGS.max_decode_len))
  return rows


def simulate(target, draft, enc: np.ndarray) -> Dict[str, object]:
  """Every policy replayed on one task's inputs (greedy, batch 1)."""
  profile = costs.cost_profile(target, draft, 1, costs.DEFAULT_MAX_GAMMA)
  prior = auto_generation.auto_prior(target, draft)
  prior = acceptance.DEFAULT_ALPHA_PRIOR if prior is None else prior
  # The rule's costs as `generate` passes them (up to the default
  # max_gamma), and every count's for the fixed policies.
  rule_costs = auto_generation.proposal_costs(profile, True, prior)
  every_costs = auto_generation.proposal_costs(
      profile, True, prior, max_gamma=profile.max_gamma)
  rows = agreement(target, draft, enc)
  tokens = sum(len(row) for row in rows)
  once = profile.call_cost(True) * len(rows)
  extra = profile.call_extra_cost(True) * len(rows)
  policies = {f'rule at ALPHA_RATE {rate}': (float(rate), None)
              for rate in FLAGS.alpha_rates}
  policies.update({f'every iteration {g}': (adaptive.ALPHA_RATE, int(g))
                   for g in FLAGS.gammas
                   if int(g) <= costs.DEFAULT_MAX_GAMMA})
  figures = {}
  kept_rate = adaptive.ALPHA_RATE
  try:
    for name, (rate, count) in policies.items():
      adaptive.ALPHA_RATE = rate
      policy_costs = rule_costs if count is None else every_costs
      histogram = sum(adaptive.replay_greedy(row, policy_costs,
                                             FLAGS.max_decode_len, count)
                      for row in rows)
      cost = float(np.dot(histogram, policy_costs.iteration_cost))
      figures[name] = {
          'histogram': histogram.tolist(), 'iterations_cost': cost,
          'predicted_speedup': (once + tokens) / (once + extra + cost)}
  finally:
    adaptive.ALPHA_RATE = kept_rate
  # The replay against the loop itself, at today's rate.
  today = [adaptive.replay_greedy(row, rule_costs, FLAGS.max_decode_len)
           for row in rows]
  loop = [np.asarray(sd.generate(
      target, enc[i:i + 1], max_decode_len=FLAGS.max_decode_len, draft=draft,
      gamma='auto').proposal_counts)[0] for i in range(len(rows))]
  return {'prior': prior, 'tokens': tokens, 'policies': figures,
          'replay_matches_loop': sum(
              int(np.array_equal(a, b)) for a, b in zip(today, loop))}


def main_simulate(report: Dict[str, object]) -> None:
  target = pretrained.load(FLAGS.target)
  draft = pretrained.load(FLAGS.draft)
  vocabulary = pretrained.vocabulary()
  for task in FLAGS.tasks:
    enc = inputs_for(task, vocabulary)
    row = {'task': task, 'temperature': 0.0, **simulate(target, draft, enc)}
    report['rows'].append(row)
    print(f"\n{task} greedy, {len(enc)} inputs, {row['tokens']} tokens, prior "
          f"{row['prior']:.3f}; replay at ALPHA_RATE {adaptive.ALPHA_RATE} "
          f"equals the loop's histogram on {row['replay_matches_loop']}/"
          f"{len(enc)} inputs")
    for name, figures in row['policies'].items():
      histogram = {g: n for g, n in enumerate(figures['histogram']) if n}
      print(f"  {name:28s} predicted {figures['predicted_speedup']:.3f}x "
            f"(iterations {figures['iterations_cost']:.1f} baseline steps; "
            f"proposals: iterations {histogram})", flush=True)


def main(argv):
  del argv
  start = time.time()
  report = costs.timing_report({name: FLAGS[name].value for name in (
      'source', 'batch_size', 'num_calls', 'input_length', 'max_decode_len',
      'repeats', 'gammas', 'margins')})
  report['rows'] = []
  if FLAGS.simulate:
    main_simulate(report)
    _write(report, start)
    return
  target = pretrained.load(FLAGS.target)
  draft = pretrained.load(FLAGS.draft)
  vocabulary = pretrained.vocabulary()
  for task in FLAGS.tasks:
    enc = inputs_for(task, vocabulary)
    for temperature in (float(t) for t in FLAGS.temperatures):
      row = {'task': task, 'temperature': temperature,
             **measure(target, draft, enc, temperature)}
      report['rows'].append(row)
      print(f"\n{task} T={temperature}: " + ', '.join(
          f"{name} {ms:.2f} ms/token ({row['speedup'][name]:.2f}x)"
          for name, ms in row['ms_per_token'].items()))
      print(f"  best fixed: {row['best_fixed']}; auto over it: "
            f"{row['auto_over_best_fixed']:.2f}; auto proposals per "
            f"iteration {row['auto_mean_proposals']:.2f} (histogram "
            f"{row['auto_proposal_counts']}); slowest call over the "
            f"median, per token: auto {row['auto_slowest_over_median']:.2f}, "
            f"baseline {row['baseline_slowest_over_median']:.2f}; greedy "
            f"identical: {row['auto_greedy_identical']}", flush=True)
      if FLAGS.margins:
        print('  proposals per iteration at each margin: ' + ', '.join(
            f'{name} {mean:.2f}'
            for name, mean in row['mean_proposals'].items()), flush=True)
  _write(report, start)


def _write(report: Dict[str, object], start: float) -> None:
  report['seconds'] = time.time() - start
  if FLAGS.output:
    with open(FLAGS.output, 'w') as f:
      json.dump(report, f, indent=1)


if __name__ == '__main__':
  app.run(main)
