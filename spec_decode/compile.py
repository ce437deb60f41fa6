"""`jit` for the decoders, with CPU compiler options that matter for speed.

On CPUs, XLA's default routes small-row matrix products (a target scoring
gamma + 1 tokens, a batch of a few rows) through a library (YNNPACK) path
that costs several times a one-row product, so nothing goes there: dots
stay on XLA's own emitters (where the few-row kernel does not take them,
`spec_decode.kernels`), and so do reductions. YNNPACK's reductions of 8 or
more rows sum in another order than of fewer, which alone kept a position
scored in an 8-token decoder call from getting the bits it gets scored
alone (`scripts/iteration_costs.py` measures it); without them a call is
batch-invariant at every K, and no slower. Other backends compile with
their defaults.
"""

import functools
from typing import Any, Callable, Dict, Sequence

import jax

from spec_decode.model import encoder_widths

CPU_COMPILER_OPTIONS: Dict[str, Any] = {
    # No fusion goes to YNNPACK: dots and reductions stay on XLA's emitters.
    'xla_cpu_experimental_ynn_fusion_type': '',
    'xla_cpu_copy_insertion_use_region_analysis': True,
}


def decoder_jit(fun: Callable, static_argnums: Sequence[int] = ()
                ) -> Callable:
  """`jax.jit` with `CPU_COMPILER_OPTIONS` when the backend is the CPU.

  The backend is looked up on the first call, not at import. The returned
  function exposes `_cache_size()` and `lower(...)` like a jitted function
  (the memory plan and the sharding tests compile it ahead of time).

  Settings read while tracing that no argument carries (whether the
  encoder pass is trimmed, `encoder_widths.trimming`) get a jitted function
  each, so a program traced under one is never run under the other.
  """
  compiled = {}

  def jitted():
    key = encoder_widths.enabled()
    if key not in compiled:
      options = (CPU_COMPILER_OPTIONS if jax.default_backend() == 'cpu'
                 else None)
      # jax keeps traces per Python function: a new one per setting.
      traced = fun if key else functools.wraps(fun)(
          lambda *args, **kwargs: fun(*args, **kwargs))
      compiled[key] = jax.jit(traced, static_argnums=static_argnums,
                              compiler_options=options)
    return compiled[key]

  @functools.wraps(fun)
  def wrapper(*args, **kwargs):
    return jitted()(*args, **kwargs)

  wrapper._cache_size = lambda: jitted()._cache_size()  # pylint: disable=protected-access
  wrapper.lower = lambda *args, **kwargs: jitted().lower(*args, **kwargs)
  return wrapper
