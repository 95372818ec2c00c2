"""tf_cache_attention: a decoding step's attention reads its cache in place.

The bucketed XLA path (PrefixCausalAttention, CausalDotProductAttention)
slices the smallest cache bucket holding the filled positions for its dots:
a copy of [batch * heads, bucket, d_head] keys and values per step. With the
kernels installed the step calls `tf_cache_attention` on the whole cache
(updated in place by the donated step's dynamic-update-slice), reading the
filled positions only; the numbers are those of the bucketed path.
"""
import re

import gin
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer import kernels
from terraformer.benchmarks import bytes_read
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.ops import cache_buckets
from terraformer.layers.prefix_attention import PrefixCausalAttention
from greedy_decoding import greedy  # tests/greedy_decoding.py
from terraformer.models import ScalingTransformer
from terraformer.models import Terraformer

# Cache buckets 64, 128, 256: steps in the first bucket slice it.
MAX_LEN = 256


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  # Bindings of an earlier test would change the models built here.
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture
def isa():
  assert kernels.available(), kernels.unavailable_reason()
  assert kernels.has_kernel('tf_cache_attention')
  yield kernels.set_isa
  kernels.set_isa('avx512')


def _reference(q, k, v, idx, valid):
  """Trax's DotProductCausalAttention math over the whole cache, float64."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  dots = np.einsum('ntd,nmd->ntm', q, k) / np.sqrt(q.shape[-1])
  mask = (np.arange(k.shape[1])[None, None, :]
          <= (idx + np.arange(q.shape[1]))[None, :, None])
  if valid is not None:
    mask = mask & valid[:, None, :]
  dots = np.where(mask, dots, -1e9)
  weights = np.exp(dots - dots.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('ntm,nmd->ntd', weights, v)


# (heads, cache length, d_head): d_head 13 and 40 have vector tails; 144 is
# the 17B models' (9 vectors); 272 is past the 16 vectors the AVX-512 path
# keeps in registers (it takes the per-key path). Cache lengths 20 and 70:
# partial and whole blocks of 16 keys.
SHAPES = [(5, 20, 13), (3, 70, 40), (2, 70, 144), (2, 20, 272)]


@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
@pytest.mark.parametrize('masked', [False, True], ids=['all', 'valid'])
@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: f'd{s[2]}')
@pytest.mark.parametrize('name', kernels.ISA_NAMES)
def test_cache_attention_equals_numpy(isa, request, name, shape, masked,
                                      parallel):
  used = isa(name)
  if used != name:
    pytest.skip(f'this CPU lacks {name} (kernels use {used})')
  if parallel:
    request.getfixturevalue('split_every_product')
  rng = np.random.default_rng(0)
  # The cache's positions past idx + t hold values that must not be read
  # (NaN).
  n, m, d = shape
  attend = jax.jit(kernels.cache_attention)
  for t, idx in [(1, 0), (1, 7), (1, m - 1), (3, 4), (2, m // 2 + 3)]:
    q = rng.standard_normal((n, t, d)).astype(np.float32)
    k = rng.standard_normal((n, m, d)).astype(np.float32)
    v = rng.standard_normal((n, m, d)).astype(np.float32)
    valid = None
    if masked:
      valid = rng.random((n, m)) > 0.3
      valid[:, idx:idx + t] = True   # A query's own key is always real.
    expected = _reference(q, k, v, idx, valid)
    k[:, idx + t:], v[:, idx + t:] = np.nan, np.nan
    got = attend(q, k, v, np.int32(idx), valid)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5,
                               atol=1e-5)


def _stepper(layer):
  step = jax.jit(layer.pure_fn, donate_argnums=(2,))
  state = [layer.state]

  def call(x):
    out, state[0] = step(x, (), state[0], jax.random.PRNGKey(0))
    return np.asarray(out)
  return call


def test_prefix_attention_kernel_equals_buckets(isa):
  del isa
  heads, d_head = 3, 8
  sig = tuple(shapes.ShapeDtype((heads, 1, d_head)) for _ in range(3))
  layers = [PrefixCausalAttention(max_inference_length=MAX_LEN,
                                  mode='predict', min_bucket=64)
            for _ in range(2)]
  for layer in layers:
    layer.init(sig)
  assert kernel_installer.install(layers[1]) == 1
  assert isinstance(layers[1], kernel_layers.KernelPrefixCausalAttention)
  buckets, kernel = (_stepper(layer) for layer in layers)
  q, k, v = (np.random.default_rng(i).standard_normal(
      (heads, 150, d_head)).astype(np.float32) for i in range(3))
  for t in range(150):   # buckets 64, 128 and 256
    x = (q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1])
    np.testing.assert_allclose(kernel(x), buckets(x), rtol=1e-5, atol=1e-5)


def test_causal_dot_product_kernel_equals_buckets(isa):
  """The Terraformer's decoder attention: a prefill of per-example lengths
  (XLA's dots), then steps through the kernel with its valid-key mask."""
  del isa
  batch, heads, d_head, prefill = 2, 2, 8, 5
  n = batch * heads
  layers = [CausalDotProductAttention(heads, max_len=MAX_LEN, mode='predict',
                                      min_bucket=64) for _ in range(2)]
  sig = (shapes.ShapeDtype((n, 1, d_head)),) * 3 + (
      shapes.ShapeDtype((batch,), np.int32),)
  for layer in layers:
    layer.init(sig)
  kernel_installer.install(layers[1])
  assert isinstance(layers[1], kernel_layers.KernelCausalDotProductAttention)
  buckets, kernel = (_stepper(layer) for layer in layers)
  q, k, v = (np.random.default_rng(i).standard_normal(
      (n, 80, d_head)).astype(np.float32) for i in range(3))
  lengths = np.array([2, 4], np.int32)   # Junk after them in the prefill.
  x = (q[:, :prefill], k[:, :prefill], v[:, :prefill], lengths)
  np.testing.assert_allclose(kernel(x), buckets(x), rtol=1e-5, atol=1e-5)
  for t in range(prefill, 80):          # buckets 64 and 128
    x = (q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], lengths)
    np.testing.assert_allclose(kernel(x), buckets(x), rtol=1e-5, atol=1e-5)


def test_step_bytes_count_the_filled_positions(isa):
  """The bytes bound of a kernel step counts the positions it reads."""
  del isa
  heads, d_head, position = 3, 8, 9
  layer = PrefixCausalAttention(max_inference_length=MAX_LEN, mode='predict')
  layer.init(tuple(shapes.ShapeDtype((heads, 1, d_head)) for _ in range(3)))
  per_position = 2 * heads * d_head * 4        # keys and values, float32

  def step_bytes():
    return sum(bytes_read.step_bytes(layer, (), layer.state,
                                     position).values())
  assert step_bytes() == 64 * per_position + 4  # the 64-position bucket
  kernel_installer.install(layer)
  assert step_bytes() == (position + 1) * per_position + 4


def _scaling():
  return ScalingTransformer(
      input_vocab_size=96, d_model=32, d_ff=64, n_encoder_layers=1,
      n_decoder_layers=1, n_heads=2, dropout=0.0, max_len=MAX_LEN,
      d_lowrank=8, ff_sparsity=8, attention_sparsity=4, loss_sparsity=4,
      mode='predict')


def _dense_scaling():
  return ScalingTransformer(
      input_vocab_size=96, d_model=32, d_ff=64, n_encoder_layers=1,
      n_decoder_layers=1, n_heads=2, dropout=0.0, max_len=MAX_LEN,
      mode='predict')


def _terraformer():
  return Terraformer(
      input_vocab_size=96, d_model=32, d_ff=64, n_heads=4, n_encoder_layers=1,
      n_decoder_layers=1, dropout=0.0, max_len=MAX_LEN, ff_sparsity=8,
      d_lowrank=4, loss_sparsity=4, d_sru=8, attention_sparsity=4,
      encoder_attention_type='full', decoder_attention_type='full',
      predict_mem_len=MAX_LEN, mode='predict')


def _bucket_slices(hlo):
  """Arrays of the step's HLO shaped like a cache bucket smaller than the
  cache, f32[rows, bucket, d_head]: the slices of the bucketed path."""
  small = '|'.join(str(b) for b in cache_buckets(MAX_LEN)[:-1])
  return re.findall(rf'= f32\[\d+,(?:{small}),\d+\]\{{2,1,0\}} '
                    r'(?:slice|dynamic-slice|copy|fusion|gather)\(', hlo)


@pytest.mark.parametrize('build', [_scaling, _dense_scaling, _terraformer],
                         ids=['sparse_qkv', 'dense', 'terraformer'])
def test_decoding_step_reads_cache_in_place(isa, build):
  """The compiled decoding step with the kernels has no copy of a cache
  bucket: its attention is one tf_cache_attention call on the whole cache
  (the step's donated state, updated in place); greedy decoding is that of
  the bucketed path (`cache_attention_kernel.enabled = False`)."""
  del isa
  logits, tokens, hlo = greedy(build, ('ffi', 'float32'), n_tokens=6,
                               compiled=True)
  assert 'custom_call_target="tf_cache_attention"' in hlo
  assert not _bucket_slices(hlo), _bucket_slices(hlo)
  # The caches are aliased to the step's outputs: updated in place.
  assert 'input_output_alias' in hlo.splitlines()[0]
  with gin.unlock_config():
    gin.bind_parameter('terraformer.cache_attention_kernel.enabled', False)
  b_logits, b_tokens, b_hlo = greedy(build, ('ffi', 'float32'), n_tokens=6,
                                     compiled=True)
  assert 'tf_cache_attention' not in b_hlo
  assert _bucket_slices(b_hlo)   # What the kernel removes.
  np.testing.assert_allclose(logits, b_logits, rtol=0, atol=1e-5)
  assert tokens == b_tokens
