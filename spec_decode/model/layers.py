"""T5 v1.1 building blocks, numerically as T5X's `examples/t5/layers.py`:
norms, dense products, embeddings and the MLP (attention: `attention.py`).

Parameters are declared with T5X's names, 2-D kernel shapes and logical axis
names (kept as `nn.LogicallyPartitioned` metadata at init), so a checkpoint
written by T5X loads into this tree unchanged and a mesh can shard it later.

At decode time on one CPU device the decoder's products find their weights
prepared for `spec_decode.kernels` in the `decode_kernels` collection
(`decode_kernels.prepare`) and run there; without it, XLA's dots.
"""

import functools
from typing import Any, Callable, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels
from spec_decode import partitioning
from spec_decode.model import decode_kernels

Array = jax.Array
Initializer = Callable[..., Array]


def param_with_axes(module: nn.Module, name: str, init: Initializer,
                    shape: Tuple[int, ...], axes: Tuple[str, ...]) -> Array:
  """Declares a float32 parameter carrying T5X logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                      jnp.float32)


class RMSNorm(nn.Module):
  """T5's layer norm: scale only, no mean subtraction, computed in float32.

  Attributes:
    dtype: Output dtype.
    epsilon: Added to the mean square.
  """
  dtype: Any = jnp.float32
  epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    scale = param_with_axes(self, 'scale', nn.initializers.ones, (x.shape[-1],),
                   ('embed',))
    mean2 = jnp.mean(jax.lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * jax.lax.rsqrt(mean2 + self.epsilon), self.dtype)
    return y * jnp.asarray(scale, self.dtype)


def prepared_kernel(module: nn.Module, name: str,
                    x: Array) -> Optional[kernels.PackedKernel]:
  """The kernel `name` prepared for the few-row kernel, if it should run.

  Args:
    module: The module whose product it is.
    name: The variable's name in the `decode_kernels` collection.
    x: The product's input [..., in].

  Returns:
    The `PackedKernel`, or None: XLA's dot (no prepared kernel, or more
    rows than the kernel is faster for).
  """
  if not module.has_variable(decode_kernels.DECODE_KERNELS, name):
    return None
  if not kernels.pays_for(int(np.prod(x.shape[:-1]))):
    return None
  return module.get_variable(decode_kernels.DECODE_KERNELS, name)


def prepared_product(x: Array, packed: kernels.PackedKernel,
                     dtype: Any) -> Array:
  """What `Dense` computes, on the few-row kernel: x and the kernel in
  `dtype` (the kernel was packed so), float32 sums, rounded to `dtype`."""
  return kernels.matmul(jnp.asarray(x, dtype), packed).astype(dtype)


class Dense(nn.Module):
  """A bias-free linear map over the last axis with a 2-D kernel.

  Attributes:
    features: Output width.
    kernel_axes: Logical axis names of the [in, out] kernel.
    dtype: Computation dtype (inputs and kernel are cast to it).
    kernel_init: Kernel initializer.
  """
  features: int
  kernel_axes: Tuple[str, str]
  dtype: Any = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(
      1.0, 'fan_in', 'truncated_normal')

  @nn.compact
  def __call__(self, x: Array) -> Array:
    packed = prepared_kernel(self, 'kernel', x)
    if packed is not None:
      return prepared_product(x, packed, self.dtype)
    kernel = param_with_axes(self, 'kernel', self.kernel_init,
                    (x.shape[-1], self.features), self.kernel_axes)
    x = jnp.asarray(x, self.dtype)
    kernel = jnp.asarray(kernel, self.dtype)
    # Accumulate in float32 and round once: on a mesh that splits the
    # contracted axis (out, wo), the partial sums are then added in float32,
    # so a sharded bfloat16 model computes what the unsharded one does.
    y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                            preferred_element_type=jnp.float32)
    return y.astype(self.dtype)


class Embed(nn.Module):
  """The token embedding table, shared by encoder and decoder inputs.

  T5X gathers with a one-hot matmul; a gather gives the same values.

  Attributes:
    num_embeddings: Vocabulary size.
    features: Embedding width.
    dtype: Output dtype.
  """
  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = param_with_axes(self, 'embedding', nn.initializers.normal(1.0),
                            (self.num_embeddings, self.features),
                            ('vocab', 'embed'))

  def __call__(self, tokens: Array) -> Array:
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, x: Array) -> Array:
    """Logits from the transposed table (only for tied embeddings)."""
    return jnp.dot(jnp.asarray(x, jnp.float32),
                   jnp.asarray(self.embedding, jnp.float32).T)


class GatedMlp(nn.Module):
  """T5 v1.1's gated MLP: act_0(x W_0) * act_1(x W_1), then W_o.

  Attributes:
    intermediate_dim: Hidden width.
    activations: One flax activation name (or 'linear') per branch.
    dtype: Activation dtype.
    dropout_rate: Dropout of the hidden units when not `deterministic`.
  """
  intermediate_dim: int
  activations: Sequence[str] = ('gelu', 'linear')
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    # Decoding: the branches' kernels joined into one product.
    joined = (prepared_kernel(self, decode_kernels.JOINED_WI, x)
              if len(self.activations) > 1 else None)
    if joined is not None:
      projections = jnp.split(prepared_product(x, joined, self.dtype),
                              len(self.activations), axis=-1)
    else:
      projections = [
          Dense(self.intermediate_dim, ('embed', 'mlp'), dtype=self.dtype,
                name='wi' if len(self.activations) == 1 else f'wi_{index}')(x)
          for index in range(len(self.activations))]
    branches = [h if name == 'linear' else getattr(nn, name)(h)
                for h, name in zip(projections, self.activations)]
    # [batch, length, mlp]
    h = partitioning.constrain(functools.reduce(lambda a, b: a * b, branches),
                               ('batch', 'length', 'mlp'))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return Dense(x.shape[-1], ('mlp', 'embed'), dtype=self.dtype,
                 name='wo')(h)
