"""The fused decode kernels (terraformer/kernels): equal to the XLA path.

Tiny shapes. The library must be built (`pip install -e .`): these tests
fail, not skip, without it, except the one that removes it on purpose.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import shapes

from terraformer.decoding import step as decode_step
from terraformer import kernels
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.sparse_ff import SparseFF
from greedy_decoding import greedy  # tests/greedy_decoding.py
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM


def _require_kernels():
  assert kernels.available(), kernels.unavailable_reason()


@pytest.fixture
def isa():
  """Restores the best instruction set after a test that changes it."""
  _require_kernels()
  yield kernels.set_isa
  kernels.set_isa('avx512')


def _isa_or_skip(set_isa, name):
  used = set_isa(name)
  if used != name:
    pytest.skip(f'this CPU lacks {name} (kernels use {used})')


# (T, S, K, N). 6 rows: N = 37 and K = 13 give vector tails in both
# directions. 13 rows (>= 8: the row-blocked AVX2 path, split into row groups
# of 8 when parallel): a 4-row block tail, K over two tiles of 256 rows, N =
# 37 = 2 x 16 + 5 (no 8-wide block, a scalar tail) and N = 24 (one 16-wide
# and one 8-wide block).
@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
@pytest.mark.parametrize('t,s,k,n', [(2, 3, 13, 37), (1, 13, 300, 37),
                                     (1, 13, 300, 24)])
@pytest.mark.parametrize('name', kernels.ISA_NAMES)
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16', 'int8'])
def test_skinny_matmul_equals_numpy(isa, request, name, dtype, t, s, k, n,
                                    parallel):
  _isa_or_skip(isa, name)
  if parallel:
    request.getfixturevalue('split_every_product')
  rng = np.random.default_rng(0)
  x = rng.standard_normal((t, k)).astype(np.float32)
  g = rng.standard_normal((s, k)).astype(np.float32)
  w = rng.standard_normal((k, n)).astype(np.float32)
  b = rng.standard_normal((s * n,)).astype(np.float32)
  stored, scales = kernel_layers._store(jnp.asarray(w), dtype)  # pylint: disable=protected-access
  scale = scales[0] if scales else None
  dense = np.asarray(kernel_layers._load(stored, scale), np.float64)  # pylint: disable=protected-access
  expected = (np.einsum('tk,sk,kn->tsn', x.astype(np.float64), g, dense)
              .reshape(t, s * n) + b)
  got = jax.jit(kernels.skinny_matmul)(x, stored, g, scale, b)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


# d_ff 96: 12 blocks of 8, 3 per chunk (fewer than the 4 rows the kernel
# reads at a time); 320: 40 blocks, 10 per chunk (4 + 4 + 2 rows, the next
# rows prefetched), and C1's 32 columns (split in halves over the pool).
@pytest.mark.parametrize('d_ff,d_lowrank', [(96, 4), (320, 32)])
@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
@pytest.mark.parametrize('name', kernels.ISA_NAMES)
@pytest.mark.parametrize('storage', ['int8', 'q8'])
def test_sparse_ff_kernel_equals_xla_layer(isa, request, name, parallel,
                                           storage, d_ff, d_lowrank):
  """The sparse FF step (blocks of 8, in chunks of blocks that run on
  one thread or split over the pool) equals the XLA layer; int8 rows equal
  XLA on the dequantized rows ('q8': and the controller's C2 packed, its
  product quantized as `q8_product` does), with the same bits serial or
  split."""
  _isa_or_skip(isa, name)
  if parallel:
    request.getfixturevalue('split_every_product')
  layer = SparseFF(d_ff, n_elements_in_block=8, d_lowrank=d_lowrank,
                   mode='predict')
  x = jax.random.normal(jax.random.PRNGKey(3), (1, 2, 40))
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(4))
  expected = layer(x)
  assert kernel_installer.install(layer) == 1
  assert isinstance(layer, kernel_layers.KernelSparseFF)
  got = layer(x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected),
                             rtol=1e-5, atol=1e-5)
  stored = kernel_layers.store_weights(layer, weights, storage)
  assert kernel_layers.is_q8(stored[1]) == (storage == 'q8')
  outputs = {}
  for use_ffi in (True, False):
    layer._tf_use_ffi = use_ffi  # pylint: disable=protected-access
    outputs[use_ffi] = np.asarray(layer.pure_fn(
        x, stored, state, jax.random.PRNGKey(0))[0])
  np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-5,
                             atol=1e-5)
  before = kernels.set_parallel_bytes(1 << 62)  # Never split: same bits.
  try:
    layer._tf_use_ffi = True  # pylint: disable=protected-access
    serial = np.asarray(layer.pure_fn(x, stored, state,
                                      jax.random.PRNGKey(0))[0])
  finally:
    kernels.set_parallel_bytes(before)
  np.testing.assert_array_equal(outputs[True], serial)


def _encdec():
  return ScalingTransformer(
      input_vocab_size=96, d_model=32, d_ff=64, n_encoder_layers=1,
      n_decoder_layers=2, n_heads=2, dropout=0.0, max_len=64, d_lowrank=8,
      ff_sparsity=8, attention_sparsity=4, loss_sparsity=4, mode='predict')


def _lm():
  return ScalingTransformerLM(
      vocab_size=80, d_model=32, d_ff=64, n_layers=2, n_heads=2, dropout=0.0,
      max_len=64, d_lowrank=8, ff_sparsity=8, attention_sparsity=4,
      loss_sparsity=4, mode='predict')


@pytest.mark.parametrize('build', [_encdec, _lm], ids=['encdec', 'lm'])
def test_decode_with_kernels_equals_xla(build):
  _require_kernels()
  logits, tokens, hlo = greedy(build, ('xla', 'float32'))
  k_logits, k_tokens, k_hlo = greedy(build, ('ffi', 'float32'))
  assert 'tf_sparse_ff' not in hlo and 'tf_skinny_matmul' not in hlo
  # Both kernels run in the step: the sparse FF block and the
  # multiplicative / dense layers.
  assert 'tf_sparse_ff' in k_hlo and 'tf_skinny_matmul' in k_hlo
  np.testing.assert_allclose(k_logits, logits, rtol=0, atol=1e-5)
  assert k_tokens == tokens
  assert len(set(tokens)) > 1  # A decode that moves, not one token.


# Logits here span about +-2: 0.05 is 2.5% of that, the bound at a typical
# position. 'q8' rounds each dense layer's input to 8 bits as well as its
# weights (two roundings of at most 1/254 of a block's largest value per
# product instead of one), and also the sparse FF controller's C2 and the
# multiplicative layers' D, whose argmaxes (a sparse FF block's row) can
# flip at a near tie: the position where one flips moves by up to ~10% of
# the logits' span (0.22 here), the others stay within 0.05.
@pytest.mark.parametrize('storage,tolerance', [('bfloat16', 0.05),
                                               ('int8', 0.05), ('q8', 0.3)])
def test_weight_storage(storage, tolerance):
  _require_kernels()
  logits, tokens, _ = greedy(_encdec, ('xla', 'float32'))
  k_logits, k_tokens, _ = greedy(_encdec, ('ffi', storage))
  x_logits, _, _ = greedy(_encdec, ('xla', storage))
  per_position = np.abs(k_logits - logits).max(axis=-1)
  assert 0 < per_position.max() < tolerance  # Rounded: close, not equal.
  assert np.median(per_position) < 0.05
  assert k_tokens == tokens
  # The kernels read the stored weights as XLA's dequantized path does
  # ('q8': XLA quantizes the activations the same way, `q8_product`).
  np.testing.assert_allclose(k_logits, x_logits, rtol=0, atol=1e-5)


def test_store_weights_types():
  model = _encdec()
  sig = decode_step.predict_signature(model, prompt_len=8)
  weights, _ = model.init(sig, rng=jax.random.PRNGKey(1))
  kernel_installer.install(model)
  stored = kernel_layers.store_weights(model, weights, 'int8')
  dtypes = {str(a.dtype) for a in jax.tree_util.tree_leaves(stored)}
  assert 'int8' in dtypes and 'float32' in dtypes
  w = jax.random.normal(jax.random.PRNGKey(0), (5, 33))
  q, scale = kernel_layers.quantize_rows(w)
  err = np.abs(np.asarray(q, np.float32) * np.asarray(scale)[:, None]
               - np.asarray(w))
  assert np.all(err <= np.asarray(scale)[:, None] / 2 + 1e-7)
  assert np.abs(np.asarray(q)).max() == 127


def test_fallback_without_library(monkeypatch):
  """No library: kernels requested, XLA's code runs, same numbers."""
  logits, tokens, _ = greedy(_encdec, ('xla', 'float32'))
  monkeypatch.setenv('TERRAFORMER_KERNELS_LIB', '/nonexistent/lib.so')
  monkeypatch.setattr(kernels, '_state',
                      {'lib': None, 'tried': False, 'error': None})
  assert not kernels.available()
  assert 'cannot load' in kernels.unavailable_reason()
  with pytest.warns(UserWarning, match='not available'):
    f_logits, f_tokens, hlo = greedy(_encdec, ('ffi', 'float32'))
  assert 'tf_sparse_ff' not in hlo and 'tf_skinny_matmul' not in hlo
  np.testing.assert_array_equal(f_logits, logits)
  assert f_tokens == tokens
  assert decode_step.describe_options(('ffi', 'float32')) == (
      'xla (kernels not built)')


def test_kernel_benchmark_has_a_row_per_variant(monkeypatch, capsys,
                                               tmp_path):
  """`python -m terraformer.benchmarks.kernels` on a small output layer (2 MB
  of float32 weights): XLA and the kernel with float32, bfloat16 and int8
  weights, each with the bytes it reads (smaller storage, fewer bytes)."""
  from terraformer.benchmarks import kernels as kernel_bench  # pylint: disable=g-import-not-at-top
  from terraformer.layers.multiplicative_dense import MultiplicativeDense  # pylint: disable=g-import-not-at-top
  _require_kernels()
  monkeypatch.setitem(kernel_bench.CASES, 'tiny', (
      lambda: MultiplicativeDense(4, 2048, use_bias=True), 256))
  monkeypatch.setattr(kernel_bench, 'PRODUCTS', {'small': (16, 100, 40)})
  out = tmp_path / 'layers.json'
  kernel_bench.main(['--cases=tiny', '--repeats=1', f'--json={out}'])
  rows = [line.split() for line in capsys.readouterr().out.splitlines()
          if line.startswith('tiny ')]
  assert [' '.join(r[1:3]) for r in rows] == [
      name for name, _ in kernel_bench.VARIANTS]
  megabytes = {' '.join(r[1:3]): float(r[r.index('MB') - 1]) for r in rows}
  assert megabytes['ffi int8'] < megabytes['ffi bf16'] < megabytes['ffi f32']
  # --json: the same rows, and the machine.
  written = json.loads(out.read_text())
  assert [r['variant'] for r in written['rows']] == [' '.join(r[1:3])
                                                      for r in rows]
  assert [round(r['bytes'] / 1e6, 1) for r in written['rows']] == [
      megabytes[r['variant']] for r in written['rows']]
  assert written['machine']['gemv_isa'] == kernels.gemv_isa()
  # The compute-bound product on every Q8 path this CPU has (not the
  # emulated ones), against that path's int8 peak; the path in use is set
  # back.
  paths = [r['path'] for r in written['products']]
  assert paths[0] == 'scalar' and paths[-1] == kernels.gemv_isa()
  real = [n for n in kernels.GEMV_ISA_NAMES if n not in kernels.GEMV_EMULATED]
  assert paths == real[:len(paths)]
  for r in written['products']:
    assert r['shape'] == [16, 100, 40]
    assert 0 < r['macs_per_s'] and 0 < r['peak_macs_per_s']
    assert r['of_peak'] == r['macs_per_s'] / r['peak_macs_per_s']
  assert written['tables']['products']['rows'] == kernel_bench.products_table(
      written['products'])['rows']
