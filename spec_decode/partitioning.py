"""Device meshes and T5X's logical axis rules, for decoding over many chips.

JAX's SPMD partitioner does the work, as under T5X's `PjitPartitioner`: every
parameter carries logical axis names (`spec_decode.logical_axes`), a short
list of rules maps those names to the axes of a `('data', 'model')` mesh, and
a few sharding constraints inside the decoders (caches, activations, loop
state) keep XLA from gathering a cache in every iteration. No collective is
written by hand.

Typical use:

  mesh = device_mesh.make_mesh(num_partitions=4)
  target = target.shard(mesh)      # params split over 'model'
  result = generate(target, tokens, draft=draft, ...)  # draft replicated

Without a mesh nothing here runs: `constrain` is the identity unless a
`Partitioning` is active, so single-device decoding is unchanged.
"""

import contextlib
import dataclasses
import math
import threading
from typing import Any, Iterator, Optional, Sequence, Tuple

import flax
import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

Array = jax.Array
LogicalAxisRules = Tuple[Tuple[str, Optional[str]], ...]

MESH_AXES = ('data', 'model')

# Every logical axis name a parameter, cache or activation of ours carries.
# 'length' and 'kv' name activation/cache axes; the rest are T5X's parameter
# names (plus 'layers'/'stack' that T5X's scanned models use).
KNOWN_LOGICAL_AXES = frozenset({
    'batch', 'vocab', 'embed', 'mlp', 'heads', 'kv', 'joined_kv', 'length',
    'relpos_buckets', 'abspos_buckets', 'layers', 'stack', 'mlp_activations',
})


def standard_logical_axis_rules() -> LogicalAxisRules:
  """T5X's default rules (1-D parameter and activation partitioning).

  Returns:
    (logical axis, mesh axis or None) pairs: batch over 'data'; vocab, mlp,
    heads and joined_kv over 'model'; everything else replicated. 'kv' (the
    per-head width) stays replicated as in T5X: the caches already split
    their heads over 'model', and one mesh axis can split one dimension only.
  """
  return (
      ('batch', 'data'),
      ('vocab', 'model'),
      ('embed', None),
      ('mlp', 'model'),
      ('heads', 'model'),
      ('kv', None),
      ('joined_kv', 'model'),
      ('relpos_buckets', None),
      ('abspos_buckets', None),
      ('length', None),
      ('layers', None),
      ('stack', None),
      ('mlp_activations', None),
  )


def data_parallel_rules(rules: Optional[Sequence[Tuple[str, Optional[str]]]]
                        = None) -> LogicalAxisRules:
  """`rules` with every mapping onto 'model' dropped: replicated over it.

  The draft's default: a small draft split many ways costs more in
  collectives than its matmuls take.
  """
  rules = check_rules(standard_logical_axis_rules() if rules is None
                      else rules)
  return tuple((name, None if axis == 'model' else axis)
               for name, axis in rules)


def check_rules(rules: Sequence[Tuple[str, Optional[str]]]
                ) -> LogicalAxisRules:
  """Validates logical axis rules and returns them as a hashable tuple.

  Args:
    rules: (logical axis name, mesh axis name or None) pairs, as T5X's
      `logical_axis_rules` (a gin list of pairs works).

  Returns:
    The rules as a tuple of tuples.

  Raises:
    ValueError: A malformed pair, an unknown logical axis or a mesh axis
      other than 'data'/'model'.
  """
  checked = []
  for index, rule in enumerate(rules):
    if (not isinstance(rule, (tuple, list)) or len(rule) != 2
        or not isinstance(rule[0], str)):
      raise ValueError(f'logical_axis_rules[{index}] must be a pair '
                       f'(logical axis name, mesh axis or None), got {rule!r}.')
    name, axis = rule
    if name not in KNOWN_LOGICAL_AXES:
      raise ValueError(
          f'logical_axis_rules[{index}] names unknown logical axis {name!r}; '
          f'known axes: {sorted(KNOWN_LOGICAL_AXES)}.')
    if axis is not None and axis not in MESH_AXES:
      raise ValueError(
          f'logical_axis_rules[{index}] maps {name!r} to mesh axis {axis!r}; '
          f'expected one of {MESH_AXES} or None.')
    checked.append((name, axis))
  return tuple(checked)


def _check_mesh(mesh: Any) -> Mesh:
  if not isinstance(mesh, Mesh):
    raise TypeError(f'mesh must be a jax.sharding.Mesh (see '
                    f'device_mesh.make_mesh), got {type(mesh).__name__}.')
  missing = [axis for axis in MESH_AXES if axis not in mesh.axis_names]
  if missing or len(mesh.axis_names) != len(MESH_AXES):
    raise ValueError(f'mesh must have exactly the axes {MESH_AXES} (T5X '
                     f'layout), got {tuple(mesh.axis_names)}.')
  return mesh


@dataclasses.dataclass(frozen=True)
class Partitioning:
  """A mesh and the rules that place logical axes on it (hashable: a static
  argument of the compiled decoders).

  Attributes:
    mesh: A ('data', 'model') mesh.
    rules: Checked logical axis rules.
  """
  mesh: Mesh
  rules: LogicalAxisRules

  @classmethod
  def create(cls, mesh: Mesh,
             rules: Optional[Sequence[Tuple[str, Optional[str]]]] = None
             ) -> 'Partitioning':
    """Checks `mesh` and `rules` (default: T5X's standard rules)."""
    return cls(_check_mesh(mesh), check_rules(
        standard_logical_axis_rules() if rules is None else rules))

  def axis_size(self, mesh_axis: str) -> int:
    return int(self.mesh.shape[mesh_axis])

  @property
  def data_size(self) -> int:
    return self.axis_size('data')

  def spec(self, logical: Sequence[Optional[str]]) -> PartitionSpec:
    """Maps logical axis names to a `PartitionSpec` of mesh axes.

    Like flax and T5X: each logical axis takes the first rule naming it
    whose mesh axis this array does not already use; unnamed or unruled
    axes are replicated.
    """
    used = set()
    mesh_axes = []
    for name in logical:
      chosen = None
      for rule_name, axis in self.rules:
        if rule_name == name and (axis is None or axis not in used):
          chosen = axis
          break
      if chosen is not None:
        used.add(chosen)
      mesh_axes.append(chosen)
    return PartitionSpec(*mesh_axes)

  def sharding(self, logical: Sequence[Optional[str]]) -> NamedSharding:
    return NamedSharding(self.mesh, self.spec(logical))

  def check_divisible(self, what: str, shape: Sequence[int],
                      logical: Sequence[Optional[str]]) -> None:
    """Raises ValueError if a dimension does not split evenly.

    Args:
      what: The array's name, for the message (e.g. a parameter path).
      shape: Its shape.
      logical: Its logical axis names.
    """
    for dim, (size, axis) in enumerate(zip(shape, self.spec(logical))):
      if axis is not None and size % self.axis_size(axis):
        raise ValueError(
            f'{what}: dimension {dim} ({logical[dim]!r}, size {size}) is not '
            f'divisible by mesh axis {axis!r} of size {self.axis_size(axis)}; '
            f'choose num_partitions dividing it, or map {logical[dim]!r} to '
            'None in the logical axis rules.')

  def data_parallel(self) -> 'Partitioning':
    """The same mesh with nothing split over 'model'."""
    return Partitioning(self.mesh, data_parallel_rules(self.rules))


def _flatten(tree: Any) -> dict:
  return {'/'.join(path): leaf for path, leaf in
          flax.traverse_util.flatten_dict(tree).items()}


def param_shardings(param_shapes: Any, logical_axes: Any, num_heads: int,
                    partitioning: Partitioning) -> Any:
  """The `NamedSharding` of every parameter of a model.

  The model package calls this with its own trees
  (`spec_decode.model.param_shardings(config, partitioning)`): this module
  sits below the model and knows nothing of its layout.

  Args:
    param_shapes: The parameter tree with `jax.ShapeDtypeStruct` leaves.
    logical_axes: The same tree with the leaves' logical axis names.
    num_heads: Attention heads (the decoder caches split them).
    partitioning: The mesh and rules.

  Returns:
    A tree like the params with `NamedSharding` leaves.

  Raises:
    ValueError: A parameter dimension (or the heads of the caches) does not
      divide its mesh axis; the message names it.
  """
  shapes = _flatten(param_shapes)
  axes = _flatten(logical_axes)
  # The caches split their heads over the axis the rules give 'heads'.
  partitioning.check_divisible(
      'num_heads (decoder caches)', (num_heads,), ('heads',))
  shardings = {}
  for key, shape in shapes.items():
    logical = tuple(axes[key])
    partitioning.check_divisible(f'parameter {key!r}', shape.shape, logical)
    shardings[tuple(key.split('/'))] = partitioning.sharding(logical)
  return flax.traverse_util.unflatten_dict(shardings)


def shard_params(params: Any, shardings: Any) -> Any:
  """Places `params` on the mesh (each device gets its shard only).

  Args:
    params: The parameter tree (numpy or jax arrays).
    shardings: A tree like it with `NamedSharding` leaves
      (`spec_decode.model.param_shardings`).

  Returns:
    The tree of sharded `jax.Array`s.
  """
  return jax.tree_util.tree_map(
      lambda x, s: jax.device_put(x, s), params, shardings)


_ACTIVE = threading.local()


@contextlib.contextmanager
def active(partitioning: Optional[Partitioning]) -> Iterator[None]:
  """Makes `constrain` apply `partitioning` while tracing (None: no-op)."""
  previous = getattr(_ACTIVE, 'value', None)
  _ACTIVE.value = partitioning
  try:
    yield
  finally:
    _ACTIVE.value = previous


def current() -> Optional[Partitioning]:
  """The partitioning `active` set, or None."""
  return getattr(_ACTIVE, 'value', None)


def constrain(x: Array, logical: Sequence[Optional[str]]) -> Array:
  """A sharding constraint by logical names; the identity with no mesh.

  Args:
    x: An array being traced.
    logical: One logical name (or None) per dimension of `x`.

  Returns:
    `x`, constrained to the active mesh when there is one.
  """
  partitioning = current()
  if partitioning is None:
    return x
  return jax.lax.with_sharding_constraint(x, partitioning.sharding(logical))


def constrain_rows(tree: Any) -> Any:
  """Constrains every array of `tree` with a leading batch axis to 'data'.

  For loop state (tokens, lengths, statistics): rows stay on the devices
  that hold their caches. Scalars are left alone.
  """
  if current() is None:
    return tree
  return jax.tree_util.tree_map(
      lambda x: x if np.ndim(x) == 0 else constrain(
          x, ('batch',) + (None,) * (np.ndim(x) - 1)), tree)


def repeat_rows_to_multiple(tokens: np.ndarray, multiple: int
                            ) -> np.ndarray:
  """Repeats the last row until the batch divides `multiple`.

  A row's output does not depend on the others (own rng stream, own
  cache), so the caller slices the real rows back out unchanged. Copies of
  a real row, not all-padding rows (`tasks.pad_rows`): the loop runs until
  every row is done, and a copy ends with its original, while a padding
  row might decode all the way to max_decode_len.

  Args:
    tokens: [batch, length] host array.
    multiple: The data-parallel size.

  Returns:
    [ceil(batch / multiple) * multiple, length].
  """
  extra = -tokens.shape[0] % multiple
  if not extra:
    return tokens
  return np.concatenate([tokens, np.repeat(tokens[-1:], extra, axis=0)])


def shard_batch(tokens: np.ndarray, partitioning: Partitioning) -> Array:
  """Places [batch, length] tokens with rows over 'data'.

  On a multi-host slice each process passes the whole global batch (as the
  scripts here do); only this process's rows are copied to its devices.
  """
  sharding = partitioning.sharding(('batch', 'length'))
  return jax.make_array_from_callback(tokens.shape, sharding,
                                      lambda index: tokens[index])


def shard_bytes(array: Array) -> int:
  """Bytes of the largest shard of `array` held by one device."""
  return max(math.prod(shard.data.shape) * shard.data.dtype.itemsize
             for shard in array.addressable_shards)
