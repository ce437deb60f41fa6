r"""Decoding text with a configured model, T5X `infer.py` style.

  python -m spec_decode.infer --gin_file=runs/baseline.gin \
      --input_file=inputs.txt --output_file=outputs.jsonl
  python -m spec_decode.infer --gin_file=runs/speculative.gin \
      --gin.infer.InferConfig.gamma=3 < inputs.txt

Reads one raw input per line (the task prefix is added), decodes them in
batches with the target alone (`draft=None`, baseline decoding) or with
speculative decoding, and writes one JSON object per input: the input, the
output text and tokens, the target calls, and for speculative runs the
accepted draft tokens.
"""

import dataclasses
import json
import sys
import time
from typing import Dict, Iterable, List, Optional, Union

from absl import flags
import jax
import numpy as np

from spec_decode import evaluation
from spec_decode import generation
from spec_decode import gin_utils
from spec_decode import report
from spec_decode import specs


@dataclasses.dataclass
class InferConfig:
  """One decoding run (bind from gin as `infer.InferConfig.X`).

  Attributes:
    target: The model whose outputs are produced.
    draft: The draft proposing tokens, or None for baseline decoding.
    task: Local task whose input prefix is added ('translate_en_de',
      'summarize').
    gamma: Draft tokens per speculative iteration, or 'auto' (each row,
      each iteration, from its acceptance so far and the costs measured on
      this machine; see `spec_decode.generate`).
    temperature: 0 is greedy.
    top_k: Keep the k most likely tokens (0 keeps all).
    top_p: Nucleus mass kept, in (0, 1].
    batch_size: Inputs decoded together.
    input_length: Inputs are truncated and padded to this many tokens.
    max_decode_len: Output length limit.
    seed: Sampling seed.
    vocabulary: SentencePiece model file of the target's vocabulary; None is
      the target's own (`specs.ModelSpec.vocabulary`).
    mesh: How the models are laid out over devices (`specs.MeshSpec`).
  """
  target: specs.ModelSpec = specs.ModelSpec(
      label='local target', pretrained='t5_local_target')
  draft: Optional[specs.ModelSpec] = None
  task: str = 'translate_en_de'
  gamma: Union[int, str] = 5
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  batch_size: int = 8
  input_length: int = 64
  max_decode_len: int = 64
  seed: int = 0
  vocabulary: Optional[str] = None
  mesh: specs.MeshSpec = specs.MeshSpec()


def infer(config: InferConfig, sources: List[str]) -> List[Dict[str, object]]:
  """Decodes `sources` (raw text, no task prefix).

  Args:
    config: What to decode with.
    sources: Inputs, one string each.

  Returns:
    One dict per input: `input`, `output`, `tokens`, `target_calls` and,
    for speculative runs, `draft_tokens_accepted`.
  """
  if not sources:
    raise ValueError('sources: expected at least one input, got none.')
  if config.batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {config.batch_size}.')
  vocabulary = config.target.vocabulary(config.vocabulary)
  specs.check_vocabulary(vocabulary, config.target.model_config())
  target, draft = config.mesh.load(config.target, config.draft)
  rng = jax.random.PRNGKey(config.seed)
  results = []
  for start in range(0, len(sources), config.batch_size):
    batch = sources[start:start + config.batch_size]
    enc = evaluation.encode_inputs(vocabulary, config.task, batch,
                                   config.input_length)
    rng, step_rng = jax.random.split(rng)
    decoded = generation.generate(
        target, enc, max_decode_len=config.max_decode_len,
        temperature=config.temperature, top_k=config.top_k,
        top_p=config.top_p, eos_id=target.eos_id, rng=step_rng, draft=draft,
        gamma=config.gamma)
    tokens = np.asarray(decoded.tokens)
    lengths = np.asarray(decoded.lengths)
    calls = np.asarray(decoded.target_calls)
    accepted = np.asarray(decoded.draft_tokens_accepted)
    texts = evaluation.decode_outputs(vocabulary, tokens)
    for row, source in enumerate(batch):
      result = {'input': source, 'output': texts[row],
                'tokens': tokens[row, :lengths[row]].tolist(),
                'target_calls': int(calls[row])}
      if draft is not None:
        result['draft_tokens_accepted'] = int(accepted[row])
      results.append(result)
  return results


def _read_lines(stream: Iterable[str]) -> List[str]:
  return [line.rstrip('\n') for line in stream if line.strip()]


def main(argv: List[str]) -> None:
  del argv
  gin_utils.parse_gin_flags(modules=['infer', 'specs'])
  config = gin_utils.build(InferConfig)
  if flags.FLAGS.input_file:
    with open(flags.FLAGS.input_file, encoding='utf-8') as f:
      sources = _read_lines(f)
  else:
    sources = _read_lines(sys.stdin)
  start = time.time()
  results = infer(config, sources)
  lines = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in results)
  if flags.FLAGS.output_file and report.is_writer():
    with open(flags.FLAGS.output_file, 'w', encoding='utf-8') as f:
      f.write(lines)
  else:
    sys.stdout.write(lines)
  print(f'decoded {len(results)} inputs in {time.time() - start:.1f} s',
        file=sys.stderr)


def cli() -> None:
  """`python -m spec_decode.infer`: flags, gin, run."""
  flags.DEFINE_string('input_file', None,
                      'Raw inputs, one per line (default: standard input).')
  flags.DEFINE_string('output_file', None,
                      'JSON lines out (default: standard output).')
  gin_utils.define_gin_flags()
  gin_utils.run(main)


if __name__ == '__main__':
  # gin binds `spec_decode.infer.InferConfig`, not this `__main__` copy.
  from spec_decode import infer as _importable  # pylint: disable=g-import-not-at-top
  _importable.cli()
