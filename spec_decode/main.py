r"""The main job: baseline vs speculative decoding with the shipped models.

  python -m spec_decode.main                       # the embedded default
  python -m spec_decode.main --gin_file=configs/runs/main.gin \
      --gin.main.MainConfig.gamma=5 --output_dir=/tmp/out   # a fixed gamma

Decodes held-out test examples of both tasks at batch 1, greedy and at
temperature 1, with baseline decoding and with speculative decoding
(interleaved, after compilation), then prints a few examples, whether greedy
outputs are identical, the measured alpha, tokens per target call, per-token
latency, the measured speedup and the speedup the paper's formula predicts
from the measured alpha and cost coefficient c. By default gamma is 'auto':
the decoder costs are measured on this machine (cached, see
`spec_decode.costs`), and inside the compiled loop each row chooses at each
iteration how many tokens to propose, 0 (a plain target step) to max_gamma,
from its own acceptance so far and those costs (`spec_decode.adaptive`);
the table says how many it proposed per iteration. The same figures are
written as JSON into the output folder.
"""

import dataclasses
import datetime
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

from absl import flags
import jax

from spec_decode import auto_generation
from spec_decode import costs as costs_lib
from spec_decode import evaluation
from spec_decode import generation
from spec_decode import gin_utils
from spec_decode import kernels
from spec_decode import report as report_lib
from spec_decode import reproduce
from spec_decode import specs
from spec_decode.data import tasks


@dataclasses.dataclass
class MainConfig:
  """What the main job runs (bind from gin as `main.MainConfig.X`).

  Attributes:
    target: The target (`specs.ModelSpec`: a shipped model, a T5X
      checkpoint or a Hugging Face folder, as `infer` takes).
    draft: The draft.
    tasks: Tasks to decode.
    num_examples: Test examples per task (batch 1 each).
    first_example: Index of the first test example used (e.g. past the
      committed samples, with `data_dir` set, for sentences never looked at).
    temperatures: Sampling temperatures; 0 is greedy.
    gamma: Draft tokens per iteration, or 'auto' (each row chooses 0 to
      max_gamma proposals per iteration inside the compiled loop, from its
      own acceptance so far and the costs measured on this machine).
    min_gain: With gamma='auto', the margin a call's predicted speedup over
      baseline decoding must clear before the call speculates (`generate`'s
      `min_gain`); None is `adaptive.MIN_GAIN`.
    max_decode_len: Output length limit.
    input_length: Encoder inputs are truncated and padded to this length.
    data_dir: Folder from scripts/prepare_data.py; None uses the committed
      test samples.
    show_examples: Examples printed as text per task.
    seed: Sampling seed.
    timing_repeats: Timed decodes per example and decoder, interleaved; the
      median counts (shared machines are noisy).
    num_partitions: Model-parallel size of the target over the devices
      (`specs.MeshSpec`); 1 on one device shards nothing.
    vocabulary: SentencePiece model file of the target's vocabulary; None is
      the target's own (`specs.ModelSpec.vocabulary`).
    cpu_kernel: Run decoder products on the few-row CPU kernel where it is
      built (`spec_decode.kernels`); False: XLA's dots, for comparisons.
      Both decoders always take the same path.
    kernel_product_inputs: What the kernel's products take the activations
      as: 'float32' (exact) or 'bfloat16' (rounded at each product, float32
      sums, as TPUs compute float32 dots at default precision; twice the
      arithmetic rate on CPUs with AVX512_BF16). Both decoders use it.
  """
  target: specs.ModelSpec = specs.ModelSpec(
      label='local target', pretrained='t5_local_target')
  draft: specs.ModelSpec = specs.ModelSpec(
      label='local draft (tiny)', pretrained='t5_local_draft_tiny')
  tasks: Tuple[str, ...] = ('translate_en_de', 'summarize')
  num_examples: int = 32
  first_example: int = 0
  temperatures: Tuple[float, ...] = (0.0, 1.0)
  gamma: Union[int, str] = 'auto'
  min_gain: Optional[float] = None
  max_decode_len: int = 48
  input_length: int = 64
  data_dir: Optional[str] = None
  show_examples: int = 3
  seed: int = 0
  timing_repeats: int = 3
  num_partitions: Union[int, str] = 1
  vocabulary: Optional[str] = None
  cpu_kernel: bool = True
  kernel_product_inputs: str = 'float32'


def _log(message: str) -> None:
  print(f'[{time.strftime("%H:%M:%S")}] {message}', flush=True)


def _costs_at(profile: costs_lib.CostProfile, gamma: int
              ) -> Dict[str, float]:
  return {'c': profile.c, 'verify_cost': profile.verify_cost(gamma)}


def run_task(config: MainConfig, target, draft, vocabulary, task: str,
             temperature: float, profile: costs_lib.CostProfile
             ) -> Dict[str, object]:
  """Decodes the task's examples one by one; returns its figures."""
  pairs = tasks.load_pairs(task, 'test', config.data_dir)[
      config.first_example:config.first_example + config.num_examples]
  sources = [source for source, _ in pairs]
  enc = evaluation.encode_inputs(vocabulary, task, sources,
                                 config.input_length)
  shown = []

  def show(index, baseline, speculative):
    if index < config.show_examples:
      shown.append({
          'input': sources[index], 'reference': pairs[index][1],
          'baseline': evaluation.decode_outputs(vocabulary,
                                                baseline.tokens)[0],
          'speculative': evaluation.decode_outputs(vocabulary,
                                                   speculative.tokens)[0]})

  figures = reproduce.compare_decoders(
      target, draft, reproduce.timing_batches(enc, 1),
      temperature=temperature, gamma=config.gamma,
      max_decode_len=config.max_decode_len, seed=config.seed,
      repeats=config.timing_repeats, on_batch=show,
      decode_options=(None if config.min_gain is None
                      else {'min_gain': config.min_gain}))
  # Theorem 3.8's predictions at the count most iterations proposed (a
  # fixed gamma, or gamma='auto''s most common nonzero choice).
  counts = figures['proposal_counts']
  gamma = max(range(1, len(counts)), key=lambda g: counts[g], default=0)
  if gamma and counts[gamma]:
    figures = reproduce.add_predictions(figures, gamma,
                                        _costs_at(profile, gamma))
  else:
    gamma = 0
  identical = figures['identical_rows'] == figures['rows']
  return {'task': task, 'temperature': temperature, 'gamma': gamma,
          'gamma_setting': config.gamma,
          'examples': len(pairs),
          'greedy_identical': identical if temperature == 0 else None,
          **figures, 'examples_shown': shown}


def format_table(rows: Sequence[Dict[str, object]]) -> str:
  header = ('task', 'T', 'g/iter', 'greedy=', 'alpha', 'beta', 'tok/call',
            'base ms', 'spec ms', 'speedup', 'pred loop', 'pred',
            'pred+v', 'pred+v+n')
  lines = ['  '.join(f'{h:>9}' for h in header)]

  def times(value):
    return '-' if value is None else f'{value:.2f}x'

  for row in rows:
    same = row['greedy_identical']
    cells = (row['task'][:9], f"{row['temperature']:.1f}",
             f"{row['mean_proposals']:.2f}",
             '-' if same is None else ('yes' if same else 'NO'),
             f"{row['alpha']:.3f}", f"{row['alpha_beta']:.3f}",
             f"{row['tokens_per_target_call']:.2f}",
             f"{row['baseline_ms_per_token']:.2f}",
             f"{row['speculative_ms_per_token']:.2f}",
             times(row['measured_speedup']),
             times(row.get('predicted_speedup_in_loop')),
             times(row.get('predicted_speedup')),
             times(row.get('predicted_speedup_with_verify_cost')),
             times(row.get('predicted_speedup_at_lengths')))
    lines.append('  '.join(f'{c:>9}' for c in cells))
  return '\n'.join(lines)


def run(config: MainConfig, output_dir: str) -> Dict[str, object]:
  """Runs the main job; returns (and writes) its figures."""
  if isinstance(config.gamma, bool) or config.gamma != 'auto' and (
      not isinstance(config.gamma, int) or config.gamma < 1):
    raise ValueError(f"gamma must be 'auto' or a positive integer, got "
                     f'{config.gamma!r}.')
  generation.check_min_gain(config.min_gain, config.gamma)
  if config.kernel_product_inputs not in kernels.PRODUCT_INPUTS:
    raise ValueError(f'kernel_product_inputs must be one of '
                     f'{kernels.PRODUCT_INPUTS}, got '
                     f'{config.kernel_product_inputs!r}.')
  start = time.time()
  if not config.cpu_kernel:
    kernels.set_enabled(False)
  kernels.set_product_inputs(config.kernel_product_inputs)
  _log(f'loading {config.target.describe()} and {config.draft.describe()}')
  vocabulary = config.target.vocabulary(config.vocabulary)
  specs.check_vocabulary(vocabulary, config.target.model_config())
  target, draft = specs.MeshSpec(config.num_partitions).load(config.target,
                                                             config.draft)
  _log(f'target: {target}')
  _log(f'draft:  {draft}')
  machine = costs_lib.machine_description()
  _log(f"machine: {machine['cpu']} ({machine['backend']}, "
       f"{machine['cpu_count']} cores; {machine['cpu_vector_flags']})")
  decoder_products = kernels.available()
  _log(f'decoder products: {decoder_products} (the few-row CPU kernel\'s '
       "code path, or 'xla' for XLA's dots)")
  profile = costs_lib.cost_profile(
      target, draft, 1, max_gamma=max(costs_lib.DEFAULT_MAX_GAMMA,
                                      0 if config.gamma == 'auto'
                                      else config.gamma))
  _log(f'c = {profile.c:.4f} (draft step '
       f'{1e3 * profile.draft_step_seconds:.2f} ms, target step '
       f'{1e3 * profile.target_step_seconds:.2f} ms); a target call scoring '
       f'K = 1..%d tokens on {decoder_products} costs %s target steps' % (
           profile.max_gamma + 1, ' / '.join(
               f'{profile.verify_cost(k - 1):.2f}'
               for k in range(1, profile.max_gamma + 2))))
  counts = [count for count in profile.iteration_counts if count]
  _log("gamma='auto' weighs whole iterations proposing 0 (a plain step) / "
       '%s tokens at %s baseline steps (T>0; greedy %s); a call spends '
       '%.1f baseline steps once, %.1f more when it speculates' % (
           ' / '.join(map(str, counts)),
           ' / '.join(f'{cost:.2f}' for cost in [profile.plain_cost()] + [
               profile.iteration_cost(g) for g in counts]),
           ' / '.join(f'{cost:.2f}' for cost in [profile.plain_cost(True)] + [
               profile.iteration_cost(g, True) for g in counts]),
           profile.call_cost(), profile.call_extra_cost()))
  if config.gamma == 'auto':
    _log("gamma='auto' lets a row propose at most %d tokens greedy, %d at "
         'T>0: the most its rule ever chooses under these costs (at an '
         'acceptance up to %.2f)' % (
             auto_generation.default_max_gamma(profile, True),
             auto_generation.default_max_gamma(profile, False),
             auto_generation.ALPHA_CEILING))
  rows = []
  for task in config.tasks:
    for temperature in config.temperatures:
      _log(f'{task}, temperature {temperature}: decoding '
           f'{config.num_examples} examples at batch 1')
      rows.append(run_task(config, target, draft, vocabulary, task,
                           temperature, profile))
  print()
  for row in rows:
    if row['temperature'] == 0:
      print(f"== {row['task']} (greedy) ==")
      for example in row['examples_shown']:
        print(f"  input:       {example['input'][:200]}")
        print(f"  reference:   {example['reference'][:200]}")
        print(f"  baseline:    {example['baseline']}")
        print(f"  speculative: {example['speculative']}")
        print()
  print(format_table(rows))
  print('\ng/iter: draft tokens proposed per iteration (gamma=\'auto\': '
        'each row chooses at each iteration; 0 is a plain target step); '
        'pred loop: the speedup gamma=\'auto\'\'s rule expected of its '
        'choices; pred: Theorem 3.8 from measured alpha and c at the most '
        'common count; pred+v: the same with the measured cost of scoring '
        'gamma+1 tokens in one target call; pred+v+n: also ending each '
        'output at its real length (the last call of an output keeps only '
        'the tokens up to its end).')
  for row in rows:
    print(f"proposals per iteration, {row['task']} T={row['temperature']}: "
          + ' '.join(f'{g}:{n}' for g, n in enumerate(row['proposal_counts'])
                     if n))
  report = {'config': dataclasses.asdict(config),
            'costs': profile.to_json(), 'machine': machine,
            'decoder_products': decoder_products,
            'device': jax.devices()[0].device_kind,
            'seconds': time.time() - start, 'rows': rows}
  if report_lib.is_writer():
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, 'main.json')
    with open(path, 'w') as f:
      json.dump(report, f, indent=1)
    _log(f'wrote {path} ({time.time() - start:.0f} s in all)')
  return report


def main(argv: List[str]) -> None:
  del argv
  gin_utils.parse_gin_flags(modules=['main'])
  config = gin_utils.build(MainConfig)
  output_dir = flags.FLAGS.output_dir or os.path.join(
      'output', 'main-' + datetime.datetime.now().strftime('%Y%m%d-%H%M%S'))
  run(config, output_dir)


def cli() -> None:
  """`python -m spec_decode.main`: flags, gin, run."""
  flags.DEFINE_string('output_dir', None, 'Where to write main.json '
                      '(default: output/main-<time>).',
                      module_name=sys.argv[0])
  gin_utils.define_gin_flags()
  gin_utils.run(main)


if __name__ == '__main__':
  # gin binds `spec_decode.main.MainConfig`, not this `__main__` copy.
  from spec_decode import main as _importable  # pylint: disable=g-import-not-at-top
  _importable.cli()
