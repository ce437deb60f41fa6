"""How much memory per device a speculative decoding run needs, before it runs.

The speculative loop is compiled on abstract shapes (`jax.ShapeDtypeStruct`
with shardings, no weights anywhere), and XLA's own plan for the program
(`compile().memory_analysis()`) is set beside our count of parameter and
cache bytes per device. So a T5X user learns whether T5-XXL with a T5-small
draft fits a v5e chip at model parallelism 8 without owning the checkpoint
or the chips (compile on 8 host CPU devices; on a TPU VM the TPU compiler's
plan is the one that counts).
"""

import math
import time
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import device_mesh
from spec_decode import partitioning
from spec_decode import speculative
from spec_decode.model import init_cache
from spec_decode.model import param_shapes
from spec_decode.model import param_shardings
from spec_decode.model import T5Config
from spec_decode.sampling import SamplingConfig

GIB = 1024 ** 3

# High-bandwidth memory per chip (or per GPU), in bytes.
CHIP_MEMORY: Dict[str, int] = {
    'TPU v4': 32 * GIB,
    'TPU v5e': 16 * GIB,
    'TPU v5p': 95 * GIB,
    'H100': 80 * GIB,
    'H200': 141 * GIB,
}


def _abstract_params(config: T5Config, plan: partitioning.Partitioning,
                     dtype: Any) -> Any:
  shardings = param_shardings(config, plan)
  return jax.tree_util.tree_map(
      lambda shape, sharding: jax.ShapeDtypeStruct(shape.shape, dtype,
                                                   sharding=sharding),
      param_shapes(config), shardings)


def _per_device_bytes(tree: Any) -> int:
  """Bytes one device holds of abstract arrays with shardings."""
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total


def _cache_bytes(config: T5Config, plan: partitioning.Partitioning,
                 batch: int, cache_len: int, enc_len: int) -> int:
  """Per-device bytes of the self-attention cache and cross keys/values."""
  caches = jax.eval_shape(lambda: init_cache(config, batch, cache_len))
  cross = jax.eval_shape(lambda: init_cache(config, batch, enc_len))
  total = 0
  for tree in (caches, cross):
    for leaf in jax.tree_util.tree_leaves(tree):
      # [batch, heads, ...]: rows over 'data', heads over 'model'.
      sharding = plan.sharding(('batch', 'heads', None, None))
      shape = sharding.shard_shape(leaf.shape)
      total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total


def plan_speculative(target: T5Config, draft: T5Config, *, batch_size: int,
                     input_length: int, max_decode_len: int, gamma: int,
                     num_partitions: int,
                     devices: Optional[Sequence[Any]] = None,
                     rules: Optional[Sequence[Tuple[str, Optional[str]]]]
                     = None,
                     params_dtype: str = 'bfloat16',
                     temperature: float = 0.0) -> Dict[str, Any]:
  """Compiles the speculative loop on abstract shapes and reports memory.

  The mesh is (1, num_partitions) over the first `num_partitions` devices:
  per-device figures at data parallelism d are those of batch_size / d rows.

  Args:
    target: The target's config (its `dtype` is the activation dtype).
    draft: The draft's config; replicated over 'model' as `generate` does.
    batch_size: Rows per call.
    input_length: Encoder input length.
    max_decode_len: Output length.
    gamma: Draft tokens per iteration.
    num_partitions: Model-parallel size.
    devices: Devices to build the mesh from (default `jax.devices()`).
    rules: Logical axis rules (default T5X's).
    params_dtype: Parameter dtype as loaded (T5X serves bfloat16).
    temperature: 0 greedy; sampling only adds small per-row arrays.

  Returns:
    Per-device bytes: 'target_param_bytes', 'draft_param_bytes',
    'cache_bytes' (both models' self- and cross-attention caches), XLA's
    'argument_bytes', 'output_bytes', 'temp_bytes', 'alias_bytes',
    'cpu_weight_copy_bytes' (the float32 weight copies only XLA:CPU makes
    of bfloat16 weights), 'device_temp_bytes' (temporaries without them)
    and 'total_bytes' (arguments + outputs + device temporaries -
    aliased), plus
    'compile_seconds', 'backend' and 'fits' ({chip: bool}).
  """
  devices = list(jax.devices() if devices is None else devices)
  if len(devices) < num_partitions:
    raise ValueError(
        f'num_partitions={num_partitions} needs that many devices, have '
        f'{len(devices)} (on a CPU set XLA_FLAGS='
        f'--xla_force_host_platform_device_count={num_partitions}).')
  mesh = device_mesh.make_mesh(num_partitions, devices[:num_partitions])
  target_plan = partitioning.Partitioning.create(mesh, rules)
  draft_plan = target_plan.data_parallel()
  dtype = jnp.dtype(params_dtype)
  target_params = _abstract_params(target, target_plan, dtype)
  draft_params = _abstract_params(draft, draft_plan, dtype)
  tokens = jax.ShapeDtypeStruct(
      (batch_size, input_length), jnp.int32,
      sharding=target_plan.sharding(('batch', 'length')))
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32,
                             sharding=target_plan.sharding((None,)))
  start = time.time()
  compiled = speculative._speculative_generate.lower(  # pylint: disable=protected-access
      target, draft, target_params, draft_params, tokens, rng,
      max_decode_len, SamplingConfig(temperature), 1, gamma, 1.0, 'token',
      None, target_plan, draft_plan).compile()
  seconds = time.time() - start
  analysis = compiled.memory_analysis()
  cache_len = max_decode_len + gamma + 2  # As `_speculative_generate`.
  plan = {
      'num_partitions': num_partitions,
      'backend': jax.default_backend(),
      'compile_seconds': seconds,
      'target_param_bytes': _per_device_bytes(target_params),
      'draft_param_bytes': _per_device_bytes(draft_params),
      'cache_bytes': (
          _cache_bytes(target, target_plan, batch_size, cache_len,
                       input_length)
          + _cache_bytes(draft, draft_plan, batch_size, cache_len,
                         input_length)),
  }
  for name, field in (('argument_bytes', 'argument_size_in_bytes'),
                      ('output_bytes', 'output_size_in_bytes'),
                      ('temp_bytes', 'temp_size_in_bytes'),
                      ('alias_bytes', 'alias_size_in_bytes')):
    plan[name] = int(getattr(analysis, field, 0) or 0) if analysis else None
  if analysis is not None:
    # XLA:CPU computes bfloat16 dots in float32 and hoists a float32 copy
    # of every weight out of the loop; TPU and GPU compilers make none, so
    # that copy is not counted against a chip's memory.
    upcast = 0
    if plan['backend'] == 'cpu' and dtype.itemsize < 4:
      upcast = ((plan['target_param_bytes'] + plan['draft_param_bytes'])
                * 4 // dtype.itemsize)
    plan['cpu_weight_copy_bytes'] = min(upcast, plan['temp_bytes'])
    plan['device_temp_bytes'] = plan['temp_bytes'] - plan[
        'cpu_weight_copy_bytes']
    plan['total_bytes'] = (plan['argument_bytes'] + plan['output_bytes'] +
                           plan['device_temp_bytes'] - plan['alias_bytes'])
  else:  # A backend without an analysis: our own count is all there is.
    plan['total_bytes'] = (plan['target_param_bytes'] +
                           plan['draft_param_bytes'] + plan['cache_bytes'])
  plan['fits'] = {chip: plan['total_bytes'] <= memory
                  for chip, memory in CHIP_MEMORY.items()}
  return plan
