"""The Q8 GEMV (int8 weights x int8 activations, decode_options.weights='q8').

Against numpy references written here: the packed layout, the integer
product (exact, on data whose every float step is exact), the quantized
product on random data (each instruction set giving the same bits), the
error bound of 8-bit rounding against the float product, and the kernel
layers. Every instruction set the CPU has runs; one it lacks skips, saying
so. AMX's tile code runs on every CPU as 'amx-emulated' (each tile
instruction in plain C++); the hardware 'amx' path runs where the CPU has
AMX. The library must be built (`pip install -e .`): these tests fail, not
skip, without it.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from terraformer import kernels
from terraformer.benchmarks import weight_factory
from terraformer.decoding import step as decode_step
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.sparse_qkv_attention import ModuleConv

BLOCK, ROWS = 32, 16  # Inputs per activation scale, outputs per group.


def _pack(q):
  """numpy: int8 W [K, N] -> [ceil(N/16), Kp/4, 16, 4], P[g, p, j, i] =
  W[4p + i, 16g + j], zeros past K (Kp = K rounded up to 32) and N."""
  k, n = q.shape
  kp, np_ = -(-k // BLOCK) * BLOCK, -(-n // ROWS) * ROWS
  padded = np.zeros((kp, np_), np.int8)
  padded[:k, :n] = q
  packed = np.zeros((np_ // ROWS, kp // 4, ROWS, 4), np.int8)
  for g in range(np_ // ROWS):
    for p in range(kp // 4):
      for j in range(ROWS):
        packed[g, p, j] = padded[4 * p:4 * p + 4, ROWS * g + j]
  return packed


def _quantize(v):
  """numpy Q8_0 of rows v [R, K] in float32: (q int64 [R, K], d [R, blocks])
  with d = max|v_block| / 127 and q = rint(v * (1 / d)), as the kernel
  computes them."""
  r, k = v.shape
  q, d = np.zeros((r, k), np.int64), []
  for b in range(0, k, BLOCK):
    block = v[:, b:b + BLOCK]
    amax = np.abs(block).max(axis=1)
    live = amax >= np.float32(1e-30)
    scale = np.where(live, amax / np.float32(127), 0).astype(np.float32)
    inv = np.where(live, np.float32(1) / np.where(live, scale, 1), 0).astype(
        np.float32)
    q[:, b:b + BLOCK] = np.clip(np.rint(block * inv[:, None]), -127, 127)
    d.append(scale)
  return q, np.stack(d, axis=1)


def _block_sums(q, d, w):
  """[R, blocks, N] float64: d[r, b] * sum_{k in block b} q[r, k] w[k, n],
  the integer sums exact (int64)."""
  k = q.shape[1]
  return np.stack([d[:, i, None].astype(np.float64)
                   * (q[:, b:b + BLOCK] @ w[b:b + BLOCK].astype(np.int64))
                   for i, b in enumerate(range(0, k, BLOCK))], axis=1)


# (T, S, K, N): K and N not multiples of 32 / 16 (tails of a block and of a
# group), one block (K < 32), one group (N = 16), 13 rows (AVX-512: a pass of
# 8 and one of 5; AVX2: six passes of 2 and one of 1), 18 rows (from 16 rows
# 'split' also splits the rows: rows 0-15 and 16-17 of each group; on
# AVX-512 VNNI, from 16 rows, register blocks of 4 rows x 3 groups, then
# single rows), 21 rows of 5 groups (blocks of 4 rows x 3 groups, a single
# row of 3 groups, then the 2 groups left one at a time). 'split': rows are
# also quantized in chunks over the pool. AMX's tiles (from 16 rows): passes
# of 2 row tiles of 16 x 2 groups, then 1 of either, rows padded to a
# multiple of 16; 17 rows (a tile and a row), 33 (three tiles: 'split' at
# row 16), 64 (two whole passes); K = 45 and 300 end in a partial block.
SHAPES = [(1, 1, 37, 21), (1, 1, 300, 33), (2, 3, 45, 16), (1, 13, 70, 5),
          (3, 1, 20, 50), (2, 9, 70, 40), (1, 21, 100, 80), (1, 17, 45, 37),
          (3, 11, 300, 50), (4, 16, 70, 33)]


@pytest.mark.parametrize('g_storage', ['float32', 'int8'])
@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
@pytest.mark.parametrize('t,s,k,n', SHAPES)
@pytest.mark.parametrize('name', kernels.GEMV_ISA_NAMES)
def test_q8_matmul_is_the_exact_integer_product(gemv_isa, request, name, t,
                                                s, k, n, parallel, g_storage):
  """Inputs whose every block holds +-127 * 2^e (so d_b = 2^e and the
  quantized activations are the chosen integers) and power-of-two weight
  scales: every float step is exact, so y equals the int64 product. An int8
  g (+-1 rows, scales 2^e) gives the same y as the float g it stands for."""
  gemv_isa(name)
  if parallel:
    request.getfixturevalue('split_every_product')
  rng = np.random.default_rng(k * n + t)
  blocks = len(range(0, k, BLOCK))
  sign = lambda *shape: rng.choice([-1, 1], shape)
  w = rng.integers(-127, 128, (k, n)).astype(np.int8)
  w[0:2] = 127 * sign(2, n)  # Largest pairs: 2 * 127 * 127 in maddubs.
  w_scale = (2.0 ** rng.integers(-2, 2, n)).astype(np.float32)
  qx = rng.integers(-40, 41, (t, k))
  qx[:, 0::BLOCK] = 127 * sign(t, blocks)  # Each block's max is 127.
  if k > 1:
    qx[:, 1::BLOCK] = 127 * sign(t, len(range(1, k, BLOCK)))
  x_exp = rng.integers(0, 2, (t, blocks))
  g_exp = rng.integers(0, 2, s)
  g_sign = sign(s, k)
  x = (qx * 2.0 ** np.repeat(x_exp, BLOCK, axis=1)[:, :k]).astype(np.float32)
  g = (g_sign * 2.0 ** g_exp[:, None]).astype(np.float32)
  bias = (rng.integers(-64, 64, s * n) / 4).astype(np.float32)
  # Row (t, s) of x g is qx[t] g_sign[s] 2^(x_exp + g_exp): d_b = 2^(x_exp +
  # g_exp) and q = qx g_sign exactly.
  q = (qx[:, None, :] * g_sign[None]).reshape(t * s, k)
  d = 2.0 ** (x_exp[:, None, :] + g_exp[None, :, None]).reshape(t * s, -1)
  terms = _block_sums(q, d, w)
  # Integer partial sums under 2^24 and outputs, multiples of 1/4, under
  # 2^22: every float32 step of the kernel is exact.
  assert np.abs(terms).sum(1).max() * max(1, w_scale.max()) < 2 ** 21
  expected = (terms.sum(1) * w_scale).reshape(t, s * n) + bias

  g_scale = None
  if g_storage == 'int8':
    g, g_scale = g_sign.astype(np.int8), (2.0 ** g_exp).astype(np.float32)
  got = jax.jit(kernels.q8_matmul)(x, _pack(w), w_scale, g, bias, g_scale)
  np.testing.assert_array_equal(np.asarray(got), expected.astype(np.float32))


# Plus rows of 35 blocks: AVX-512 quantizes 16 blocks at a time (16, 16,
# 2 and the tail block).
RANDOM_SHAPES = SHAPES + [(1, 5, 1100, 24)]


def _random_case(t, s, k, n, g_storage):
  """Random operands of `kernels.q8_matmul` (x, packed W, w_scale, g, bias,
  g_scale), the numpy result and its float32 rounding bound."""
  rng = np.random.default_rng(k + n)
  x = rng.standard_normal((t, k)).astype(np.float32)
  x[:, :3] *= 20  # Outliers: blocks with different scales.
  x[:, 40:72] = 0  # An all-zero block (d = 0).
  g_scale = None
  if g_storage == 'int8':
    g = rng.integers(-127, 128, (s, k)).astype(np.int8)
    g_scale = rng.uniform(0.001, 0.01, s).astype(np.float32)
  else:
    g = rng.standard_normal((s, k)).astype(np.float32)
  w = rng.integers(-127, 128, (k, n)).astype(np.int8)
  w_scale = rng.uniform(0.5, 2, n).astype(np.float32)
  bias = rng.standard_normal(s * n).astype(np.float32)
  q, d = _quantize((x[:, None, :] * g[None].astype(np.float32))
                   .reshape(t * s, k))
  if g_scale is not None:
    d = (d.reshape(t, s, -1) * g_scale[None, :, None]).reshape(t * s, -1)
  terms = _block_sums(q, d, w) * w_scale
  expected = terms.sum(1).reshape(t, s * n) + bias
  # float32 sums of <= 12 terms: each rounding within 2^-24 of a partial
  # sum, bounded by the sum of |terms|.
  tolerance = 2 * 2.0 ** -24 * (len(range(0, k, BLOCK)) + 2) * (
      np.abs(terms).sum(1).reshape(t, s * n) + np.abs(bias))
  return (x, _pack(w), w_scale, g, bias, g_scale), expected, tolerance


@pytest.mark.parametrize('g_storage', ['float32', 'int8'])
@pytest.mark.parametrize('t,s,k,n', RANDOM_SHAPES)
def test_q8_matmul_equals_numpy_on_random_data(gemv_isa, t, s, k, n,
                                               g_storage):
  """Random floats: the numpy quantization of x g with the integer products
  summed in float64, within float32 rounding of the sums; every
  instruction set gives the same bits (the same FMAs in the same order).
  An int8 g's rows x g8[s] are quantized, their d times g_scale[s]."""
  args, expected, tolerance = _random_case(t, s, k, n, g_storage)
  outputs = {}
  for name in kernels.GEMV_ISA_NAMES:
    if kernels.set_gemv_isa(name) != name:
      continue
    got = np.asarray(jax.jit(kernels.q8_matmul)(*args))
    assert np.all(np.abs(got - expected) <= tolerance), name
    outputs[name] = got
  assert 'amx-emulated' in outputs  # Every CPU runs it.
  for name, got in outputs.items():
    np.testing.assert_array_equal(got, outputs['scalar'], err_msg=name)


def _cpu_has_amx():
  """/proc/cpuinfo lists AMX-TILE and AMX-INT8 (False where it cannot be
  read)."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      flags = set(f.read().split())
  except OSError:
    return False
  return {'amx_tile', 'amx_int8'} <= flags


# (rows, K, N, the emulated TDPBSSDs: 16-row tiles x groups x blocks of 32).
TILE_COUNTS = [(17, 45, 37, 2 * 3 * 2), (33, 300, 50, 3 * 4 * 10),
               (64, 70, 33, 4 * 3 * 3), (16, 32, 16, 1), (15, 70, 40, 0)]


@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
def test_emulated_amx_path_runs_the_tile_code(gemv_isa, request, parallel):
  """'amx-emulated' is a path every CPU has: set, it is the one in use, and
  a product of 16 rows or more runs one emulated TDPBSSD per tile of 16
  rows, group of 16 outputs and block of 32 inputs (one thread or split),
  fewer rows none (the vector path's product). 'amx' on a CPU without AMX
  falls back to the best path it has, never to the emulation."""
  if parallel:
    request.getfixturevalue('split_every_product')
  if not _cpu_has_amx():
    assert kernels.set_gemv_isa('amx') == kernels.best_gemv_isa() != 'amx'
  gemv_isa('amx-emulated')
  assert kernels.gemv_isa() == 'amx-emulated'
  for rows, k, n, count in TILE_COUNTS:
    args, expected, tolerance = _random_case(1, rows, k, n, 'float32')
    before = kernels.emulated_tdpbssd()
    got = np.asarray(kernels.q8_matmul(*args))
    assert kernels.emulated_tdpbssd() - before == count, (rows, k, n)
    assert np.all(np.abs(got - expected) <= tolerance)


@pytest.mark.parametrize('g_storage', ['float32', 'int8'])
@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
def test_amx_gives_the_bits_of_the_scalar_path(gemv_isa, request, parallel,
                                               g_storage):
  """On a CPU with AMX: 'amx' is the path the library picks, and its tiles
  (tdpbssd, from 16 rows) give the bits of the scalar path and of the
  emulated tiles on every shape above, on one thread and split; the
  emulation is not what ran."""
  if not _cpu_has_amx():
    pytest.skip('this CPU has no AMX (amx_int8 not in /proc/cpuinfo)')
  assert kernels.best_gemv_isa() == 'amx'
  if parallel:
    request.getfixturevalue('split_every_product')
  for t, s, k, n in RANDOM_SHAPES:
    args, expected, tolerance = _random_case(t, s, k, n, g_storage)
    outputs = {}
    for name in ('scalar', 'amx-emulated', 'amx'):
      gemv_isa(name)
      before = kernels.emulated_tdpbssd()
      outputs[name] = np.asarray(kernels.q8_matmul(*args))
      if name == 'amx':
        assert kernels.emulated_tdpbssd() == before
    assert np.all(np.abs(outputs['amx'] - expected) <= tolerance)
    for name in ('amx-emulated', 'amx'):
      np.testing.assert_array_equal(outputs[name], outputs['scalar'],
                                    err_msg=f'{name} {(t, s, k, n)}')


def test_q8_error_is_within_the_rounding_bound(gemv_isa):
  """Against the float product: each rounding to 8 bits moves a value by at
  most half its step (d_b / 2 for x, scale / 2 for W), so |y - x W| <=
  sum_k |dx| |W| + |x| |dW| + |dx| |dW|, and the error uses a good part
  of that bound (a real rounding, not a float path)."""
  gemv_isa(kernels.best_gemv_isa())
  rng = np.random.default_rng(1)
  k, n = 1000, 70
  x = rng.standard_normal((1, k)).astype(np.float32)
  w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
  packed, w_scale = kernel_layers.pack_q8(jnp.asarray(w))
  got = np.asarray(kernels.q8_matmul(x, packed, w_scale))[0]
  exact = x[0].astype(np.float64) @ w.astype(np.float64)
  d = np.concatenate([np.full(min(BLOCK, k - b), np.abs(x[0, b:b + BLOCK]).max()
                              / 127) for b in range(0, k, BLOCK)])
  dx, dw = d[:, None] / 2, np.asarray(w_scale)[None, :] / 2
  bound = (dx * np.abs(w) + np.abs(x[0])[:, None] * dw + dx * dw).sum(0)
  err = np.abs(got - exact)
  assert np.all(err <= bound * 1.001 + 1e-6)
  assert err.max() > 0.01 * bound.max()


def test_pack_q8_layout_and_scales():
  rng = np.random.default_rng(2)
  w = rng.standard_normal((45, 21)).astype(np.float32)
  w[:, 3] = 0  # An all-zero output keeps scale 1 and zeros.
  packed, scale = kernel_layers.pack_q8(jnp.asarray(w))
  scale = np.asarray(scale)
  amax = np.abs(w).max(0)
  np.testing.assert_allclose(scale, np.where(amax > 0, amax / 127, 1),
                             rtol=1e-6)
  q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
  assert packed.dtype == jnp.int8
  assert packed.shape == kernel_layers.q8_packed_shape(45, 21) == (
      2, 16, 16, 4)
  np.testing.assert_array_equal(np.asarray(packed), _pack(q))
  assert np.abs(q).max(0)[amax > 0].min() == 127


def _layer_case(layer, x):
  """(q8 kernel outputs, q8 XLA outputs, float32 outputs, lowered text) of
  a layer called on x with 'q8' weights."""
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  expected = layer(x)
  kernel_installer.install(layer)
  stored = kernel_layers.store_weights(layer, weights, 'q8')
  outputs = []
  for use_ffi in (True, False):
    layer._tf_use_ffi = use_ffi  # pylint: disable=protected-access
    fn = jax.jit(layer.pure_fn)
    outputs.append(np.asarray(fn(x, stored, state, jax.random.PRNGKey(0))[0]))
    if use_ffi:
      text = fn.lower(x, stored, state, jax.random.PRNGKey(0)).as_text()
  return outputs[0], outputs[1], np.asarray(expected), text


@pytest.mark.parametrize('make', [
    lambda: tl.Dense(37), lambda: tl.Dense(37, use_bias=False),
    lambda: MultiplicativeDense(4, 21, use_bias=True),
    lambda: ModuleConv(5, 14, 3, (3, 1), mode='predict')],
                         ids=['dense', 'dense_no_bias', 'multiplicative',
                              'module_conv'])
def test_q8_kernel_layers(gemv_isa, make):
  """tl.Dense, MultiplicativeDense and (predict-mode) ModuleConv with 'q8'
  weights call tf_q8_matmul; XLA's path (`q8_product`) computes the same
  quantized product; both stay within 8-bit rounding of the float32 layer."""
  gemv_isa(kernels.best_gemv_isa())
  x = jax.random.normal(jax.random.PRNGKey(5), (1, 2, 70))
  layer = make()
  ffi, xla, f32, text = _layer_case(layer, x)
  assert 'tf_q8_matmul' in text and 'tf_skinny_matmul' not in text
  if isinstance(layer, MultiplicativeDense):  # D [S, d] in int8 too.
    stored = kernel_layers.store_weights(layer, layer.weights, 'q8')
    assert stored[0].dtype == jnp.int8 and stored[-1].shape == (4,)
  np.testing.assert_allclose(ffi, xla, rtol=1e-5, atol=1e-5)
  # Two 8-bit roundings per product: a few percent of the outputs' size.
  delta = np.abs(ffi - f32).max()
  assert 0 < delta < 0.03 * np.abs(f32).max()


def test_q8_module_conv_runs_same_size_kernels_as_one_product(gemv_isa,
                                                              monkeypatch):
  """Sparse QKV's convolutions (module kernels 3, 3, 1; M a multiple of 16):
  'q8' stores Q's and K's kernels side by side and one tf_q8_matmul computes
  both, V another; the outputs are those of one product per output (the
  layout for M not a multiple of 16), bit for bit, on the kernel's path and
  on XLA's (which multiplies each output apart: XLA's sums depend on the
  product's width, and a prompt runs that path)."""
  gemv_isa(kernels.best_gemv_isa())
  x = jax.random.normal(jax.random.PRNGKey(6), (1, 1, 64))
  layer = ModuleConv(4, 16, 3, (3, 3, 1), mode='predict')
  fused, xla, _, text = _layer_case(layer, x)
  assert text.count('tf_q8_matmul') == 2
  stored = kernel_layers.store_weights(layer, layer.weights, 'q8')
  # Q, K: 3 x 3 x 16 inputs (padded to 160), 2 x 16 outputs; V: 3 x 1 x 16.
  assert [w.shape for w in stored[:4]] == [(2, 160 // 4, 16, 4), (32,),
                                           (1, 64 // 4, 16, 4), (16,)]
  monkeypatch.setattr(kernel_layers.KernelModuleConv, '_kernel_groups',
                      lambda self: [[0], [1], [2]])
  alone, xla_alone, _, text = _layer_case(
      ModuleConv(4, 16, 3, (3, 3, 1), mode='predict'), x)
  assert text.count('tf_q8_matmul') == 3
  for i in range(3):
    np.testing.assert_array_equal(fused[i], alone[i])
    np.testing.assert_array_equal(xla[i], xla_alone[i])
    np.testing.assert_allclose(fused[i], xla[i], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('length_pad', [(2, 0), (1, 1), (0, 0)])
@pytest.mark.parametrize('module_kernel', [1, 2, 3])
def test_conv_patches_times_the_flat_kernel_is_the_convolution(
    length_pad, module_kernel):
  """`conv_patches` and the kernel flattened to [F F' M, M]: one product
  equal to XLA's convolution (ModuleConv's padding: zeros along modules,
  `length_pad` along the length)."""
  rng = np.random.default_rng(3)
  image = rng.standard_normal((2, 5, 4, 6)).astype(np.float32)
  kernel = rng.standard_normal((3, module_kernel, 6, 6)).astype(np.float32)
  patches = kernel_layers.conv_patches(image, 3, module_kernel, length_pad)
  got = np.asarray(patches) @ kernel.reshape(-1, 6)
  expected = jax.lax.conv_general_dilated(
      image, kernel, (1, 1),
      (length_pad, ((module_kernel - 1) // 2, module_kernel // 2)),
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  assert got.shape == expected.shape == (2, 5 + sum(length_pad) - 2, 4, 6)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_random_q8_weights_have_store_weights_structure(monkeypatch):
  """terraformer-bench's 'stored' random weights in 'q8' (no float32 copy):
  the tree, shapes and dtypes `store_weights` gives, packed groups that
  repeat a random block, scales of N(0, 1/K) columns."""
  monkeypatch.setattr(weight_factory, 'RANDOM_BLOCK', 3 * 16 * 64)
  layer = tl.Serial(tl.Dense(80), tl.Dense(50))
  x = shapes.ShapeDtype((1, 1, 64), jnp.float32)
  layer.init(x, rng=jax.random.PRNGKey(0))
  kernel_installer.install(layer)
  weight_shapes = jax.eval_shape(lambda: layer.weights)
  converted = kernel_layers.store_weights(layer, layer.weights, 'q8')
  direct = weight_factory.random_stored_weights(layer, weight_shapes, 'q8')
  assert (jax.tree_util.tree_structure(direct)
          == jax.tree_util.tree_structure(converted))
  assert [(l.shape, l.dtype) for l in jax.tree_util.tree_leaves(direct)] == [
      (l.shape, l.dtype) for l in jax.tree_util.tree_leaves(converted)]
  packed, _, scale = direct[0]
  assert packed.shape == (5, 16, 16, 4)
  packed = np.asarray(packed)
  np.testing.assert_array_equal(packed[3:], packed[:2])  # 3 groups repeat.
  assert len(np.unique(packed[:3])) > 100
  # Each output (j) spans -127..127; dequantized, the values spread like
  # N(0, 1/K) with K = 64.
  assert np.all(np.abs(packed[:3]).max(axis=(1, 3)) == 127)
  values = packed[:3] * np.asarray(scale)[:48].reshape(3, 1, 16, 1)
  assert abs(values.std() * 8 - 1) < 0.1


def test_environment_variable_forces_the_gemv_path(monkeypatch):
  """TERRAFORMER_GEMV_ISA and TERRAFORMER_ISA, read when the library loads,
  force a path (a benchmark of the fallbacks needs no code); an unknown
  name leaves the kernels unavailable, saying why. The decode path names
  the path taken."""
  assert kernels.available(), kernels.unavailable_reason()
  fresh = lambda: {'lib': None, 'tried': False, 'error': None}
  try:
    monkeypatch.setenv(kernels.GEMV_ISA_ENV, 'scalar')
    monkeypatch.setattr(kernels, '_state', fresh())
    assert kernels.gemv_isa() == 'scalar'
    assert decode_step.describe_options(('ffi', 'q8')) == (
        f'ffi ({kernels.set_isa()}, q8 scalar), q8 weights')
    assert decode_step.describe_options(('ffi', 'int8')) == (
        f'ffi ({kernels.set_isa()}), int8 weights')
    monkeypatch.setenv(kernels.ISA_ENV, 'scalar')
    monkeypatch.setattr(kernels, '_state', fresh())
    assert kernels.set_isa() == 'scalar'
    assert decode_step.describe_options(('ffi', 'q8')) == (
        'ffi (scalar, q8 scalar), q8 weights')
    # The emulated tiles on any CPU; 'amx' only where the CPU has it.
    monkeypatch.setenv(kernels.GEMV_ISA_ENV, 'amx-emulated')
    monkeypatch.setattr(kernels, '_state', fresh())
    assert kernels.gemv_isa() == 'amx-emulated'
    monkeypatch.setenv(kernels.GEMV_ISA_ENV, 'amx')
    monkeypatch.setattr(kernels, '_state', fresh())
    assert kernels.gemv_isa() == kernels.best_gemv_isa()
    assert (kernels.gemv_isa() == 'amx') == _cpu_has_amx()
    monkeypatch.setenv(kernels.ISA_ENV, 'avx9')
    monkeypatch.setattr(kernels, '_state', fresh())
    assert not kernels.available()
    assert kernels.unavailable_reason() == (
        f"{kernels.ISA_ENV}='avx9': not one of {kernels.ISA_NAMES}")
    monkeypatch.delenv(kernels.ISA_ENV)
    monkeypatch.setenv(kernels.GEMV_ISA_ENV, 'avx9')
    monkeypatch.setattr(kernels, '_state', fresh())
    assert not kernels.available() and kernels.gemv_isa() is None
    assert kernels.unavailable_reason() == (
        f"{kernels.GEMV_ISA_ENV}='avx9': not one of "
        f'{kernels.GEMV_ISA_NAMES}')
  finally:
    monkeypatch.undo()
    kernels.set_gemv_isa(kernels.best_gemv_isa())
    kernels.set_isa(kernels.ISA_NAMES[-1])



@pytest.mark.parametrize('name', kernels.GEMV_ISA_NAMES)
def test_int8_peak_and_product_rates_on_each_path(gemv_isa, name):
  """The probes a compute bound divides by: the int8 instruction's peak on
  1 and 2 threads (`peak_macs`) and the Q8 product alone
  (`q8_product_macs`, here a compute-bound 16-row product) are finite,
  positive rates on each path this CPU has. Their values are measured by
  the kernel benchmark, not here."""
  gemv_isa(name)
  one, two = kernels.peak_macs('int8', 1, 0.01), kernels.peak_macs(
      'int8', 2, 0.01)
  rate = kernels.q8_product_macs(16, 100, 40, repeats=3)
  for value in (one, two, rate):
    assert value is not None and 0 < value < float('inf')
  assert kernels.gemv_isa() == name  # The probes leave the path in use.


@pytest.mark.parametrize('name', kernels.ISA_NAMES)
def test_float32_peak_on_each_path(float_isa, name):
  """`peak_macs('float32')`: the float path's FMA, a finite positive rate
  on each path this CPU has."""
  float_isa(name)
  value = kernels.peak_macs('float32', 1, 0.01)
  assert value is not None and 0 < value < float('inf')
  assert kernels.set_isa() == name
