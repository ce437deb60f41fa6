"""`Model`: a config and its parameters, plus the functional model calls.

Baseline and speculative decoding both go through `prepare_decoding` and
`decode_chunk` below, so the two decoders run the very same model code.
"""

import functools
import math
from typing import Any, Dict, Optional, Sequence, Tuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_decode import kernels
from spec_decode import partitioning as partitioning_lib
from spec_decode import validation
from spec_decode.model import decode_kernels
from spec_decode.model import encoder_widths
from spec_decode.model.config import T5Config
from spec_decode.model.network import DecoderCache
from spec_decode.model.network import EncodedInputs
from spec_decode.model.network import Transformer

Array = jax.Array
Params = Dict[str, Any]


def _init_variables(config: T5Config, rng: Array) -> Params:
  dummy = jnp.ones((1, 1), jnp.int32)
  return Transformer(config).init(rng, dummy, dummy)['params']


def init_params(config: T5Config, rng: Array) -> Params:
  """Initialises parameters as T5X does (float32, T5X initialisers).

  Args:
    config: The model config.
    rng: A `jax.random` key.

  Returns:
    A nested dict of float32 arrays with T5X's names and 2-D kernel shapes.
  """
  # Eager on purpose: one jitted init of every parameter compiles for tens of
  # seconds on CPU, while the per-op kernels are cached and fast.
  return flax.core.unfreeze(nn.unbox(_init_variables(config, rng)))


@functools.lru_cache(maxsize=32)
def _abstract_variables(config: T5Config) -> Any:
  return jax.eval_shape(functools.partial(_init_variables, config),
                        jax.random.PRNGKey(0))


def param_shapes(config: T5Config) -> Dict[str, Any]:
  """Returns the parameter tree of `config` as `jax.ShapeDtypeStruct`s."""
  return flax.core.unfreeze(nn.unbox(_abstract_variables(config)))


def param_shardings(config: T5Config,
                    partitioning: partitioning_lib.Partitioning) -> Any:
  """The `NamedSharding` of every parameter of `config` on a mesh: this
  model's shapes and logical axes through `partitioning.param_shardings`
  (which raises a ValueError naming any dimension its mesh axis does not
  divide)."""
  return partitioning_lib.param_shardings(
      param_shapes(config), logical_axes(config), config.num_heads,
      partitioning)


def logical_axes(config: T5Config) -> Dict[str, Any]:
  """Returns T5X's logical axis names of every parameter.

  Args:
    config: The model config.

  Returns:
    A tree like the params whose leaves are `jax.sharding.PartitionSpec`s of
    logical names ('vocab', 'embed', 'joined_kv', 'mlp', 'heads',
    'relpos_buckets'), ready for `flax.linen.logical_to_mesh_sharding`.
  """
  return flax.core.unfreeze(nn.get_partition_spec(_abstract_variables(config)))


def parameter_count(params: Any) -> int:
  """The number of scalars in a parameter tree.

  Args:
    params: Nested dict of arrays, or of anything with a `.shape` (e.g.
      `param_shapes`' `jax.ShapeDtypeStruct`s).

  Returns:
    The sum over leaves of their sizes.
  """
  return sum(math.prod(np.shape(x)) for x in jax.tree_util.tree_leaves(params))


def shift_right(targets: Any) -> Any:
  """Decoder inputs for teacher forcing: targets shifted right, 0 first.

  Args:
    targets: int [batch, length], a numpy array or a (traced) jax array.

  Returns:
    [batch, length] of the same kind: 0, then targets[:, :-1].
  """
  # numpy stays numpy, so host-side callers get host arrays back.
  xp = np if isinstance(targets, np.ndarray) else jnp
  return xp.concatenate([xp.zeros_like(targets[:, :1]), targets[:, :-1]],
                        axis=1)


def _flatten(tree: Dict[str, Any]) -> Dict[str, Any]:
  return {'/'.join(path): leaf for path, leaf in
          flax.traverse_util.flatten_dict(tree).items()}


def check_params(config: T5Config, params: Params, source: str = 'params'
                 ) -> None:
  """Checks that `params` has exactly the tree and shapes `config` implies.

  Args:
    config: The model config.
    params: A nested dict of arrays.
    source: What the params came from, for error messages (e.g. a path).

  Raises:
    ValueError: Naming the first missing key, unexpected key or shape
      mismatch.
  """
  if not isinstance(params, dict):
    raise ValueError(f'{source}: expected a nested dict of parameters, got '
                     f'{type(params).__name__}.')
  expected = _flatten(param_shapes(config))
  actual = _flatten(params)
  for key in sorted(expected):
    if key not in actual:
      raise ValueError(f'{source}: missing parameter {key!r} (expected shape '
                       f'{tuple(expected[key].shape)} for this config).')
  for key in sorted(actual):
    if key not in expected:
      raise ValueError(f'{source}: unexpected parameter {key!r}; the config '
                       'has no such parameter (wrong config?).')
    shape = tuple(np.shape(actual[key]))
    if shape != tuple(expected[key].shape):
      raise ValueError(f'{source}: parameter {key!r} has shape {shape}, but '
                       f'the config expects {tuple(expected[key].shape)}.')


def _variables(params: Params, prepared: Optional[Params]) -> Params:
  variables = {'params': params}
  if prepared is not None:
    variables[decode_kernels.DECODE_KERNELS] = prepared
  return variables


def prepare_decoding(config: T5Config, params: Params,
                     encoder_input_tokens: Array,
                     prepared: Optional[Params] = None) -> EncodedInputs:
  """Runs the encoder and the cross-attention key/value projections once.

  `prepared` is `Model.decode_kernels` (the few-row CPU kernel's weights) or
  None for XLA's dots, as for `decode_chunk`. On one CPU device the encoder
  computes only the columns the input uses (`encoder_widths`).
  """
  def encode(tokens: Array) -> EncodedInputs:
    return Transformer(config).apply(_variables(params, prepared), tokens,
                                     method=Transformer.prepare_decoding)
  if encoder_widths.applies():
    return encoder_widths.encode_used_columns(encode, encoder_input_tokens)
  return encode(encoder_input_tokens)


def decode_chunk(config: T5Config, params: Params, tokens: Array, start: Array,
                 cache: DecoderCache, encoded: EncodedInputs,
                 prepared: Optional[Params] = None,
                 tree: Optional[Tuple[int, int]] = None
                 ) -> Tuple[Array, DecoderCache]:
  """Scores `tokens` [batch, K] at positions start[b]..start[b]+K-1.

  Args:
    config: The model config.
    params: Its parameters.
    tokens: int [batch, K].
    start: int [batch] position of each row's first token.
    cache: The decoder cache.
    encoded: From `prepare_decoding`.
    prepared: `Model.decode_kernels`: the model's kernels for the few-row
      CPU kernel, or None for XLA's dots.
    tree: None, or (k, gamma): the chunk is the row's last token then k
      candidates of gamma tokens, written at slots start[b].. but each
      candidate scored as if it alone followed the last token
      (`attention.tree_layout`; `network.move_chunk` then puts the kept
      one in place).

  Returns:
    float32 logits [batch, K, vocab] and the updated cache.
  """
  return Transformer(config).apply(_variables(params, prepared), tokens,
                                   start, cache, encoded, tree=tree,
                                   method=Transformer.decode)


@functools.partial(jax.jit, static_argnums=0)
def teacher_forced_logits(config: T5Config, params: Params,
                          encoder_input_tokens: Array,
                          decoder_input_tokens: Array) -> Array:
  """float32 logits [batch, dec_len, vocab], without dropout (`Model.logits`
  without its argument checks, for callers inside a jit)."""
  return Transformer(config).apply({'params': params}, encoder_input_tokens,
                                   decoder_input_tokens)


@functools.partial(jax.jit, static_argnums=0)
def _encoder_output(config: T5Config, params: Params,
                    encoder_input_tokens: Array) -> Array:
  return Transformer(config).apply({'params': params}, encoder_input_tokens,
                                   method=Transformer.encode)


class Model:
  """A T5 v1.1 model: a `T5Config` and a parameter tree that fits it.

  Attributes:
    config: The model config.
    params: Nested dict of arrays with T5X's names and shapes.
    eos_id: The vocabulary's end-of-sequence id (T5: 1).
  """

  def __init__(self, config: T5Config, params: Params, eos_id: int = 1):
    if not isinstance(config, T5Config):
      raise TypeError(f'config must be a T5Config, got {type(config).__name__}.')
    check_params(config, params)
    eos_id = validation.check_int('eos_id', eos_id, 0)
    if eos_id >= config.vocab_size:
      raise ValueError(f'eos_id must be < vocab_size={config.vocab_size}, got '
                       f'{eos_id}.')
    self._config = config
    self._params = params
    self._eos_id = eos_id
    self._partitioning = None
    # Placements of this model on meshes it was not sharded for (a draft
    # replicated beside a sharded target), made once per mesh.
    self._placements: Dict[Any, 'Model'] = {}
    # Per `kernels.available()` path (product inputs, AMX or not).
    self._decode_kernels: Dict[str, Params] = {}
    self._placed = False  # `device_params` has run.

  @property
  def config(self) -> T5Config:
    return self._config

  @property
  def params(self) -> Params:
    return self._params

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def device_params(self) -> Params:
    """`params` on the default device, placed on first use: what decoders
    take.

    Checkpoints read into NumPy arrays, and a jitted call converts NumPy
    arguments at every call, in its dispatch. The placed arrays then stand
    for `params` too (no second copy in memory). A sharded model's params
    are placed already.
    """
    if not self._placed:
      if self._partitioning is None and any(
          isinstance(leaf, np.ndarray)
          for leaf in jax.tree_util.tree_leaves(self._params)):
        self._params = jax.tree_util.tree_map(jax.device_put, self._params)
      self._placed = True
    return self._params

  @property
  def partitioning(self) -> Optional[partitioning_lib.Partitioning]:
    """The mesh and rules the params are sharded with; None: one device."""
    return self._partitioning

  @property
  def decode_kernels(self) -> Optional[Params]:
    """The model's kernels laid out for the few-row CPU kernel, or None.

    Prepared on first use for the current `kernels.available()` path (the
    product inputs, AMX tiles or not) and kept, one copy per path used
    (`decode_kernels.prepare` says what a copy costs in memory). None, so
    decoding uses XLA's dots, when the kernel is switched off or not built
    (`spec_decode.kernels.available()`), off a CPU, or for a model sharded
    over a mesh.
    """
    if self._partitioning is not None or not kernels.enabled():
      return None
    path = kernels.available()
    if path not in self._decode_kernels:
      self._decode_kernels[path] = decode_kernels.prepare(self._config,
                                                          self._params)
    return self._decode_kernels[path]

  def shard(self, mesh: jax.sharding.Mesh,
            rules: Optional[Sequence[Tuple[str, Optional[str]]]] = None
            ) -> 'Model':
    """This model with its parameters split over a device mesh.

    Args:
      mesh: A ('data', 'model') mesh (`device_mesh.make_mesh`).
      rules: Logical axis rules as T5X's `logical_axis_rules`; default
        T5X's standard rules (vocab, mlp, heads, joined_kv over 'model').
        `partitioning.data_parallel_rules()` replicates the model over
        'model' (the default for a draft beside a sharded target).

    Returns:
      A `Model` whose params are `jax.Array`s with `NamedSharding`s;
      `generate` then runs its whole loop over the mesh.

    Raises:
      ValueError: A bad mesh or rule, or a dimension (named in the message)
        that its mesh axis does not divide.
    """
    plan = partitioning_lib.Partitioning.create(mesh, rules)
    params = partitioning_lib.shard_params(
        self._params, param_shardings(self._config, plan))
    sharded = Model(self._config, params, self._eos_id)
    sharded._partitioning = plan  # pylint: disable=protected-access
    return sharded

  def placed_like(self, plan: partitioning_lib.Partitioning) -> 'Model':
    """This model replicated over 'model' on `plan`'s mesh (memoised)."""
    if self._partitioning is not None:
      return self
    key = plan.data_parallel()
    if key not in self._placements:
      self._placements[key] = self.shard(key.mesh, key.rules)
    return self._placements[key]

  def __repr__(self) -> str:
    mesh = ('' if self._partitioning is None else
            f', mesh {dict(self._partitioning.mesh.shape)}')
    return (f'Model({self._config}, {parameter_count(self._params):,} '
            f'parameters{mesh})')

  def logits(self, encoder_input_tokens: Any,
             decoder_input_tokens: Any) -> Array:
    """Teacher-forced logits, without dropout.

    Args:
      encoder_input_tokens: int [batch, enc_len], 0-padded.
      decoder_input_tokens: int [batch, dec_len]: targets shifted right with
        start token 0. The decoder mask is causal; at padded target positions
        T5X also masks padded keys, which changes nothing at real positions.

    Returns:
      float32 [batch, dec_len, vocab].
    """
    vocab = self._config.vocab_size
    enc = validation.check_tokens('encoder_input_tokens', encoder_input_tokens,
                                  vocab)
    dec = validation.check_tokens('decoder_input_tokens', decoder_input_tokens,
                                  vocab)
    if enc.shape[0] != dec.shape[0]:
      raise ValueError(
          f'encoder_input_tokens has batch {enc.shape[0]} but '
          f'decoder_input_tokens has batch {dec.shape[0]}; they must match.')
    return teacher_forced_logits(self._config, self._params, enc, dec)

  def encode(self, encoder_input_tokens: Any) -> Array:
    """The encoder output [batch, enc_len, emb_dim] after `encoder_norm`."""
    enc = validation.check_tokens('encoder_input_tokens', encoder_input_tokens,
                                  self._config.vocab_size)
    return _encoder_output(self._config, self._params, enc)

  def score(self, encoder_input_tokens: Any, decoder_target_tokens: Any
            ) -> Array:
    """Per-token log p(target) as T5X's `score_batch` (0 at padding).

    Args:
      encoder_input_tokens: int [batch, enc_len], 0-padded.
      decoder_target_tokens: int [batch, dec_len] targets, 0-padded.

    Returns:
      float32 [batch, dec_len] log-probabilities; sum over the last axis for
      sequence scores.
    """
    targets = validation.check_tokens('decoder_target_tokens',
                                      decoder_target_tokens,
                                      self._config.vocab_size)
    logits = self.logits(encoder_input_tokens, shift_right(targets))
    logprobs = jax.nn.log_softmax(logits)
    picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    return jnp.where(targets > 0, picked, 0.0)


def truncated_model(model: Model, num_decoder_layers: int,
                    num_encoder_layers: Optional[int] = None) -> Model:
  """A draft that shares `model`'s weights but keeps only its first layers.

  Args:
    model: The target.
    num_decoder_layers: Decoder layers to keep.
    num_encoder_layers: Encoder layers to keep (default: all).

  Returns:
    A `Model` with the same vocabulary, embeddings and output layer.
  """
  config = model.config
  if num_encoder_layers is None:
    num_encoder_layers = config.num_encoder_layers
  small = config.replace(num_decoder_layers=num_decoder_layers,
                         num_encoder_layers=num_encoder_layers)
  keep = {'encoder': num_encoder_layers, 'decoder': num_decoder_layers}
  params = {'token_embedder': model.params['token_embedder']}
  for stack, count in keep.items():
    params[stack] = {
        name: value for name, value in model.params[stack].items()
        if not name.startswith('layers_') or int(name.split('_')[1]) < count}
    if not count:
      params[stack].pop('relpos_bias', None)
  return Model(small, params, eos_id=model.eos_id)
