"""On-policy distillation of a draft (DistillSpec, Zhou et al., ICLR 2024).

Offline distillation trains the draft on the target's own outputs; at decoding
time, though, the draft is conditioned on prefixes it produced itself. On-policy
distillation closes that gap: the draft samples continuations from its own
distribution, the (frozen) target scores the same prefixes, and the loss is a
divergence between the two next-token distributions at every sampled
position. Total variation is the natural choice for speculative decoding: at a
position where the draft proposes from q and the target samples from p, the
rejection rule accepts with probability sum_x min(p(x), q(x)) = 1 - TV(p, q)
(the paper's beta), so minimising TV maximises acceptance directly.
"""

from typing import Dict, Tuple

import jax
import jax.numpy as jnp

from spec_decode import decoding
from spec_decode import sampling as sampling_lib
from spec_decode.model import T5Config
from spec_decode.model.model import shift_right
from spec_decode.model.model import teacher_forced_logits
from spec_decode.model.network import Transformer

Array = jax.Array
DIVERGENCES = ('tvd', 'forward_kl')


def check_divergence(name: str) -> str:
  if name not in DIVERGENCES:
    raise ValueError(f'on_policy_divergence must be one of {DIVERGENCES}, got '
                     f'{name!r}.')
  return name


def token_divergence(teacher_logits: Array, student_logits: Array,
                     divergence: str) -> Array:
  """Per-position divergence between teacher p and student q.

  Args:
    teacher_logits: float32 [batch, length, vocab] (no gradient flows).
    student_logits: float32 [batch, length, vocab].
    divergence: 'tvd' (1 - beta, what acceptance depends on) or
      'forward_kl' (KL(p || q), the offline method's soft loss).

  Returns:
    float32 [batch, length].
  """
  teacher_logprobs = jax.nn.log_softmax(
      jax.lax.stop_gradient(teacher_logits))
  student_logprobs = jax.nn.log_softmax(student_logits)
  teacher_probs = jnp.exp(teacher_logprobs)
  if check_divergence(divergence) == 'tvd':
    return 0.5 * jnp.sum(jnp.abs(teacher_probs - jnp.exp(student_logprobs)),
                         axis=-1)
  return jnp.sum(teacher_probs * (teacher_logprobs - student_logprobs),
                 axis=-1)


def sample_continuations(config: T5Config, params, encoder_input_tokens: Array,
                         rng: Array, max_decode_len: int, temperature: float,
                         eos_id: int = 1) -> Tuple[Array, Array]:
  """The student's own samples, with the engine's baseline decoder.

  Args:
    config: Student config.
    params: Student params (no gradient flows through sampling).
    encoder_input_tokens: int32 [batch, enc_len].
    rng: `jax.random` key.
    max_decode_len: Output length.
    temperature: Sampling temperature (0 samples greedily).
    eos_id: End-of-sequence id.

  Returns:
    int32 [batch, max_decode_len] tokens (0 after EOS) and float32 weights
    [batch, max_decode_len], 1 at emitted positions (EOS included).
  """
  # The unjitted decoder: this runs inside the caller's jit, and a nested
  # jit may not carry the CPU compiler options `decoder_jit` adds.
  result = decoding.baseline_generate.__wrapped__(
      config, jax.lax.stop_gradient(params), encoder_input_tokens, rng,
      max_decode_len, sampling_lib.SamplingConfig(temperature), eos_id)
  positions = jnp.arange(max_decode_len)[None, :]
  weights = (positions < result.lengths[:, None]).astype(jnp.float32)
  return result.tokens, weights


def on_policy_loss(student_config: T5Config, teacher_config: T5Config,
                   student_params, teacher_params, encoder_input_tokens: Array,
                   rng: Array, max_decode_len: int, temperature: float,
                   divergence: str, dropout_rng=None
                   ) -> Tuple[Array, Dict[str, Array]]:
  """Mean divergence on the student's own samples, and metrics.

  Args:
    student_config: The draft's config.
    teacher_config: The target's config.
    student_params: Trained parameters.
    teacher_params: Frozen parameters.
    encoder_input_tokens: int32 [batch, enc_len].
    rng: Key for the student's samples.
    max_decode_len: Sample length.
    temperature: Sampling temperature of the student's samples.
    divergence: See `token_divergence`.
    dropout_rng: Student dropout key (None: no dropout).

  Returns:
    The scalar loss and sums: 'loss_sum' (divergence), 'token_count',
    'correct' (positions where the student's argmax is the teacher's, i.e.
    where greedy speculation would accept).
  """
  targets, weights = sample_continuations(
      student_config, student_params, encoder_input_tokens, rng,
      max_decode_len, temperature)
  decoder_inputs = shift_right(targets)
  teacher_logits = teacher_forced_logits(teacher_config, teacher_params,
                                         encoder_input_tokens, decoder_inputs)
  rngs = None if dropout_rng is None else {'dropout': dropout_rng}
  student_logits = Transformer(student_config).apply(
      {'params': student_params}, encoder_input_tokens, decoder_inputs,
      enable_dropout=rngs is not None, rngs=rngs)
  per_token = token_divergence(teacher_logits, student_logits, divergence)
  count = jnp.sum(weights)
  loss = jnp.sum(per_token * weights) / jnp.maximum(count, 1.0)
  agree = (jnp.argmax(student_logits, -1) ==
           jnp.argmax(teacher_logits, -1)) * weights
  return loss, {'loss_sum': jnp.sum(per_token * weights),
                'token_count': count, 'correct': jnp.sum(agree)}
