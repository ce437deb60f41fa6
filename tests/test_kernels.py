"""The few-row CPU kernel: values, batch invariance, paths, fallback, errors."""

import os
import platform
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_decode as sd
from spec_decode import kernels
from spec_decode.kernels import library
from spec_decode.model import decode_kernels
from spec_decode.model.model import decode_chunk
from spec_decode.model.model import prepare_decoding
from tests.conftest import random_inputs
from tests.conftest import random_model

built = pytest.mark.skipif(
    library.load() is None or jax.default_backend() != 'cpu',
    reason='the kernel library is not built here (see test_library_built)')

# Code paths this CPU runs; the portable one runs everywhere.
ISAS = [isa for isa in sorted(library.ISA_NAMES) if library.supports(isa)]


def _build_compiler_works() -> bool:
  """Whether the C++ compiler `pip install` would use builds a C++17 file.

  setuptools takes $CXX when set, else the compiler Python was built with;
  a machine without one (or CXX=false) installs the XLA fallback.
  """
  command = os.environ.get('CXX') or sysconfig.get_config_var('CXX') or 'c++'
  with tempfile.TemporaryDirectory() as folder:
    source = os.path.join(folder, 'probe.cc')
    with open(source, 'w') as f:
      f.write('#include <vector>\nint main() { return std::vector<int>{}.size(); }\n')
    try:
      done = subprocess.run(
          shlex.split(command) + ['-std=c++17', '-c', source, '-o',
                                  os.path.join(folder, 'probe.o')],
          capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
      return False
  return done.returncode == 0


def test_library_built_where_a_compiler_exists():
  # CI installs with `pip install -e .`, which must build the kernel in
  # place whenever a C++ compiler is on the machine; a silent fallback would
  # hide a broken build.
  if not _build_compiler_works():
    pytest.skip('no working C++ compiler for the build: XLA fallback expected')
  assert library.library_path() is not None
  assert library.load() is not None
  assert kernels.available() in ('avx2', 'avx512', 'avx512+amx', 'portable')
  assert kernels.available().endswith('+amx') == library.has_amx()


@built
def test_every_tile_asks_for_its_weights_ahead():
  # The products stream their weights from memory a block ahead of use
  # (few_rows.cc, bf16_products.cc, amx_products.cc); GCC 12 once deleted
  # every prefetch without a word (cpu_features.h, SD_ALWAYS_INLINE), and
  # the kernels ran at ~0.8x until someone read the machine code. Read it
  # here: each tile function of the vector and portable paths holds a
  # prefetch, and so does the AMX path where it was compiled.
  if platform.machine().lower() not in ('x86_64', 'amd64'):
    pytest.skip('reads x86 machine code')
  if shutil.which('objdump') is None:
    pytest.skip('objdump (binutils) is not installed')
  listing = subprocess.run(
      ['objdump', '-d', '-C', '--no-show-raw-insn', library.library_path()],
      capture_output=True, text=True, check=True).stdout
  bodies = {}  # Function name: its instructions.
  name = None
  for line in listing.splitlines():
    header = re.match(r'^[0-9a-f]+ <(.*)>:$', line)
    if header:
      name = header.group(1)
      bodies[name] = []
    elif name is not None:
      bodies[name].append(line)
  prefetches = {
      name: sum('prefetcht0' in line for line in body)
      for name, body in bodies.items()
      if re.search(r'\b(Pair)?Tile(Portable|Avx2|HalfAvx2|Avx512)\w*<', name)}
  assert len(prefetches) >= 40, sorted(prefetches)
  assert not [n for n, count in prefetches.items() if count == 0]
  amx = [body for body in bodies.values()
         if any('tdpbf16ps' in line for line in body)]
  if amx:  # The AMX path was compiled.
    assert any(any('prefetcht0' in line for line in body) for body in amx)


def _weights(depth, features, seed, dtype):
  rng = np.random.RandomState(seed)
  w = rng.randn(depth, features).astype(np.float32)
  # bfloat16 panels hold bfloat16 values: compare against those.
  return np.asarray(jnp.asarray(w, dtype).astype(jnp.float32))


def _call(x, packed, isa=library.ISA_BEST, threads=0):
  fn = jax.jit(lambda x, p: kernels.matmul(x, p, isa=isa, threads=threads))
  return np.asarray(fn(jnp.asarray(x), packed))


@built
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('depth,features', [(1, 1), (7, 13), (13, 129),
                                            (129, 7), (64, 96)])
def test_matches_float64_product(dtype, depth, features):
  w = _weights(depth, features, 0, dtype)
  packed = kernels.pack_kernel(w, dtype)
  assert packed.panels.dtype == dtype
  rng = np.random.RandomState(1)
  for rows in range(1, 18):
    x = rng.randn(rows, depth).astype(np.float32)
    want = x.astype(np.float64) @ w.astype(np.float64)
    got = _call(x, packed)
    assert got.shape == (rows, features) and got.dtype == np.float32
    # A float32 chain of `depth` fused multiply-adds: each step rounds once.
    bound = 2 * depth * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w))
    np.testing.assert_array_less(np.abs(got - want), bound + 1e-30)


@built
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('isa', ISAS)
def test_rows_do_not_depend_on_their_neighbours(dtype, isa):
  w = _weights(129, 100, 2, dtype)
  packed = kernels.pack_kernel(w, dtype)
  x = np.random.RandomState(3).randn(16, 129).astype(np.float32)
  together = _call(x, packed, isa)
  for row in range(16):
    alone = _call(x[row:row + 1], packed, isa)
    np.testing.assert_array_equal(alone[0], together[row])
  # Any split of the rows (tiles of other sizes) gives the same bits.
  np.testing.assert_array_equal(
      np.concatenate([_call(x[:5], packed, isa), _call(x[5:], packed, isa)]),
      together)


@built
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_every_code_path_gives_the_portable_bits(dtype):
  w = _weights(200, 77, 4, dtype)
  packed = kernels.pack_kernel(w, dtype)
  x = np.random.RandomState(5).randn(13, 200).astype(np.float32)
  reference = _call(x, packed, isa=1)
  for isa in ISAS:
    np.testing.assert_array_equal(_call(x, packed, isa), reference)
  np.testing.assert_array_equal(_call(x, packed), reference)
  # One thread or XLA's pool: the same bits.
  np.testing.assert_array_equal(_call(x, packed, threads=1), reference)


def test_pack_round_trip_and_layout():
  w = _weights(5, 70, 6, jnp.bfloat16)
  for dtype in (jnp.float32, jnp.bfloat16):
    packed = kernels.pack_kernel(w, dtype)
    assert packed.panels.shape == (3, 5, 32)
    assert packed.features == 70 and packed.depth == 5
    np.testing.assert_array_equal(kernels.unpack_kernel(packed), w)
    # Past N (the last panel's columns 6..31) the panels are zero.
    last = np.asarray(packed.panels.astype(jnp.float32))[2]
    assert np.count_nonzero(last) == np.count_nonzero(w[:, 64:])
  with pytest.raises(ValueError, match='kernel must be 2-D'):
    kernels.pack_kernel(np.zeros((2, 3, 4)))
  with pytest.raises(ValueError, match='dtype must be float32 or bfloat16'):
    kernels.pack_kernel(np.zeros((2, 3)), jnp.float16)


def test_packed_dtype_changes_no_result():
  exact = _weights(8, 8, 7, jnp.bfloat16)
  inexact = exact + 1e-4
  assert kernels.packed_dtype(exact) == jnp.bfloat16
  assert kernels.packed_dtype(inexact) == jnp.float32
  # A bfloat16 model rounds its kernels to bfloat16 in every dot anyway.
  assert kernels.packed_dtype(inexact, jnp.bfloat16) == jnp.bfloat16


@built
def test_bad_input_names_the_operand():
  packed = kernels.pack_kernel(np.ones((4, 3), np.float32))
  with pytest.raises(ValueError, match=r"x has shape \(2, 5\).*input width 4"):
    kernels.matmul(jnp.ones((2, 5)), packed)
  with pytest.raises(ValueError, match='x must be floating'):
    kernels.matmul(jnp.ones((2, 4), jnp.int32), packed)
  with pytest.raises(ValueError, match='isa must be'):
    kernels.matmul(jnp.ones((2, 4)), packed, isa=9)
  missing = [isa for isa in library.ISA_NAMES if not library.supports(isa)]
  if missing:
    # An instruction set this CPU lacks: an error from the call, no crash.
    with pytest.raises(Exception, match='lacks the requested instruction'):
      jax.block_until_ready(kernels.matmul(jnp.ones((2, 4)), packed,
                                           isa=missing[0]))


@built
def test_leading_axes_and_empty_rows():
  w = _weights(6, 40, 8, jnp.float32)
  packed = kernels.pack_kernel(w)
  x = np.random.RandomState(9).randn(2, 3, 6).astype(np.float32)
  got = np.asarray(kernels.matmul(jnp.asarray(x), packed))
  np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)
  assert kernels.matmul(jnp.ones((0, 6)), packed).shape == (0, 40)


def test_switch_and_fallback(monkeypatch):
  model = random_model(0)
  with kernels.enabled_as(False):
    assert kernels.available() == 'xla'
    assert model.decode_kernels is None
  # A missing library: XLA's dots, decoding still works.
  monkeypatch.setattr(library, 'load', lambda: None)
  assert kernels.available() == 'xla' and not kernels.enabled()
  assert model.decode_kernels is None
  result = sd.generate(model, random_inputs(2, 5, 512, 0), max_decode_len=4)
  assert result.tokens.shape == (2, 4)


def test_sharded_models_keep_xla_dots():
  model = random_model(0).shard(sd.make_mesh(1))
  assert model.decode_kernels is None


@built
def test_prepared_tree_covers_every_decoder_product():
  model = random_model(0)
  prepared = model.decode_kernels
  assert prepared is model.decode_kernels  # Prepared once, then kept.
  layer = prepared['decoder']['layers_1']
  params = model.params['decoder']['layers_1']
  joined = np.concatenate([params['self_attention'][n]['kernel']
                           for n in ('query', 'key', 'value')], axis=1)
  np.testing.assert_array_equal(
      kernels.unpack_kernel(
          layer['self_attention'][decode_kernels.JOINED_QKV]), joined)
  np.testing.assert_array_equal(
      kernels.unpack_kernel(layer['mlp'][decode_kernels.JOINED_WI]),
      np.concatenate([params['mlp']['wi_0']['kernel'],
                      params['mlp']['wi_1']['kernel']], axis=1))
  for block, name in (('self_attention', 'out'),
                      ('encoder_decoder_attention', 'query'),
                      ('encoder_decoder_attention', 'out'), ('mlp', 'wo')):
    np.testing.assert_array_equal(
        kernels.unpack_kernel(layer[block][name]['kernel']),
        params[block][name]['kernel'])
  np.testing.assert_array_equal(
      kernels.unpack_kernel(prepared['decoder']['logits_dense']['kernel']),
      model.params['decoder']['logits_dense']['kernel'])


def _chunk_logits(model, prepared, chunk):
  """Logits of decoding 6 tokens in chunks of `chunk` (one call each)."""
  config = model.config
  enc = jnp.asarray(random_inputs(3, 7, config.vocab_size, 1))
  tokens = jnp.asarray(random_inputs(3, 6, config.vocab_size, 2,
                                     min_length=6))
  encoded = prepare_decoding(config, model.params, enc)
  cache = sd.model.init_cache(config, 3, 8)
  step = jax.jit(lambda t, s, c: decode_chunk(config, model.params, t, s, c,
                                              encoded, prepared))
  outputs = []
  for start in range(0, 6, chunk):
    logits, cache = step(tokens[:, start:start + chunk],
                         jnp.full((3,), start, jnp.int32), cache)
    outputs.append(logits)
  return np.asarray(jnp.concatenate(outputs, axis=1))


@built
def test_decoder_call_on_the_kernel_matches_xla():
  model = random_model(0)
  xla = _chunk_logits(model, None, 1)
  for chunk in (1, 2, 3, 6):
    np.testing.assert_allclose(_chunk_logits(model, model.decode_kernels,
                                             chunk), xla, atol=2e-5,
                               rtol=2e-5)


@built
def test_bfloat16_model_on_the_kernel_matches_xla():
  model = random_model(0, dtype='bfloat16')
  prepared = model.decode_kernels
  leaf = prepared['decoder']['layers_0']['mlp']['wo']['kernel']
  assert leaf.panels.dtype == jnp.bfloat16
  got = _chunk_logits(model, prepared, 2)
  want = _chunk_logits(model, None, 2)
  # bfloat16 activations: both round every product's output to bfloat16;
  # only the float32 summation order differs.
  assert np.max(np.abs(got - want)) < 0.05 * np.max(np.abs(want))


def _softmax_attention64(query, key, value, bias):
  """The reference in float64: T5's attention, no 1/sqrt(d) scaling."""
  q = query.astype(np.float64)
  logits = np.einsum('bqhd,bhdk->bhqk', q, key.astype(np.float64)) + bias
  logits -= logits.max(axis=-1, keepdims=True)
  weights = np.exp(logits)
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum('bhqk,bhkd->bqhd', weights, value.astype(np.float64))


def _attention_operands(batch, q_len, heads, depth, k_len, bias_shape, seed):
  rng = np.random.RandomState(seed)
  query = rng.randn(batch, q_len, heads, depth).astype(np.float32)
  key = rng.randn(batch, heads, depth, k_len).astype(np.float32)
  value = rng.randn(batch, heads, k_len, depth).astype(np.float32)
  bias = rng.randn(*bias_shape).astype(np.float32)
  # Masked keys, as the decoder's causal and padding masks make them.
  bias[..., k_len // 2:] += np.where(
      rng.rand(*bias_shape[:-1], k_len - k_len // 2) < 0.5, -1e10, 0.0)
  return query, key, value, bias


def _attention(query, key, value, bias, isa=library.ISA_BEST):
  fn = jax.jit(lambda *a: kernels.attention(*a, isa=isa))
  return np.asarray(fn(*map(jnp.asarray, (query, key, value, bias))))


@built
@pytest.mark.parametrize('bias_rows', ['full', 'shared'])
@pytest.mark.parametrize('batch,q_len,heads,depth,k_len',
                         [(1, 1, 1, 1, 1), (2, 3, 4, 3, 7), (1, 8, 8, 64, 56),
                          (3, 5, 2, 13, 129)])
def test_attention_matches_float64(bias_rows, batch, q_len, heads, depth,
                                   k_len):
  bias_shape = ((batch, heads, q_len, k_len) if bias_rows == 'full'
                else (batch, 1, 1, k_len))
  operands = _attention_operands(batch, q_len, heads, depth, k_len,
                                 bias_shape, 10)
  got = _attention(*operands)
  want = _softmax_attention64(*operands)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@built
def test_attention_to_fully_masked_keys_is_uniform():
  # T5X's -1e10 mask: a query with every key masked averages the values.
  query, key, value, _ = _attention_operands(1, 2, 2, 4, 5, (1, 1, 1, 5), 11)
  bias = np.full((1, 1, 1, 5), -1e10, np.float32)
  got = _attention(query, key, value, bias)
  np.testing.assert_allclose(
      got, np.broadcast_to(value.mean(axis=2)[:, None], got.shape),
      rtol=1e-5, atol=1e-6)


@built
@pytest.mark.parametrize('isa', ISAS)
def test_attention_positions_do_not_depend_on_each_other(isa):
  operands = _attention_operands(2, 7, 3, 16, 40, (2, 3, 7, 40), 12)
  query, key, value, bias = operands
  together = _attention(*operands, isa=isa)
  for position in range(7):
    alone = _attention(query[:, position:position + 1], key, value,
                       bias[:, :, position:position + 1], isa=isa)
    np.testing.assert_array_equal(alone[:, 0], together[:, position])
  np.testing.assert_array_equal(together, _attention(*operands, isa=1))


@built
@pytest.mark.parametrize('isa', ISAS)
@pytest.mark.parametrize('depth,k_len', [(1, 1), (3, 7), (13, 129),
                                         (64, 56), (64, 112), (80, 65)])
def test_every_code_path_attends_with_the_same_bits(isa, depth, k_len):
  # The vector paths hold the sums in registers and mask the tails; each
  # logit and output element must still be the portable path's chain.
  operands = _attention_operands(2, 3, 2, depth, k_len, (2, 2, 3, k_len), 16)
  np.testing.assert_array_equal(_attention(*operands, isa=isa),
                                _attention(*operands, isa=1))


@built
@pytest.mark.parametrize('isa', ISAS)
def test_a_masked_tail_of_the_cache_changes_no_bit(isa):
  # A decoder's cache is allocated for the whole output; the slots past what
  # a query may see are masked (-1e10) and skipped. The result must be the
  # bits of attending to the visible prefix alone, with a mask inside the
  # prefix (a candidate tree's) attended as any key.
  query, key, value, bias = _attention_operands(2, 4, 3, 8, 33,
                                                (2, 3, 4, 33), 14)
  bias = np.random.RandomState(15).randn(*bias.shape).astype(np.float32)
  visible = np.array([[5, 9, 9, 20], [1, 2, 3, 33]])  # Keys [0, n) per query.
  for b in range(2):
    for p in range(4):
      bias[b, :, p, visible[b, p]:] += -1e10
  bias[1, :, 3, 10] += -1e10  # Masked inside the prefix.
  # Stale slots past every query of row 0 may hold anything.
  key[0, ..., 21:] = 1e30
  value[0, :, 21:] = 1e30
  got = _attention(query, key, value, bias, isa=isa)
  for b in range(2):
    for p in range(4):
      n = visible[b, p]
      alone = _attention(query[b:b + 1, p:p + 1], key[b:b + 1, ..., :n],
                         value[b:b + 1, :, :n], bias[b:b + 1, :, p:p + 1, :n],
                         isa=isa)
      np.testing.assert_array_equal(got[b, p], alone[0, 0])


@built
def test_attention_bad_operands_name_themselves():
  query, key, value, bias = map(jnp.asarray, _attention_operands(
      1, 2, 2, 4, 5, (1, 2, 2, 5), 13))
  with pytest.raises(ValueError, match='key has shape'):
    kernels.attention(query, key[:, :, :3], value, bias)
  with pytest.raises(ValueError, match='value has shape'):
    kernels.attention(query, key, value[:, :, :4], bias)
  with pytest.raises(ValueError, match='bias has shape'):
    kernels.attention(query, key, value, bias[:, :, :, :3])
  with pytest.raises(ValueError, match='query must be float32 and 4-D'):
    kernels.attention(query.astype(jnp.bfloat16), key, value, bias)


@built
def test_a_position_in_a_chunk_gets_the_bits_it_gets_alone():
  # The decoder call as a whole: a K-token call's logits equal the same
  # positions scored one token per call, bit for bit, for a float32 model
  # on the kernels (products and attention are row-invariant by
  # construction; the rest is row-wise elementwise work and norms).
  model = random_model(0)
  single = _chunk_logits(model, model.decode_kernels, 1)
  for chunk in (2, 3, 6):
    np.testing.assert_array_equal(
        _chunk_logits(model, model.decode_kernels, chunk), single)


@built
def test_peak_rate_is_measured_where_the_cpu_has_the_instructions():
  # scripts/k_token_dots.py prints the arithmetic floor from it.
  rate = library.peak_mac_rate('float32', threads=1, seconds=0.02)
  if library.best_isa() in (2, 3):
    assert 1e8 < rate < 1e13
  else:
    assert rate is None
  dot = library.peak_mac_rate('bfloat16', threads=2, seconds=0.02)
  assert (dot is not None) == library.has_avx512_bf16()
