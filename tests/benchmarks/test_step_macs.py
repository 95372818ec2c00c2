"""Multiply-adds of one decoding step (terraformer/benchmarks/step_macs.py).

Oracles: XLA's own count of the compiled predict step (`cost_analysis()`
'flops', 2 per multiply-add of a dot or convolution, plus the elementwise
work) for float32 models without kernels; hand counts from the shapes for
single layers; and, for 'q8' storage, the products that `store_weights`
packs, counted by hand, moving from 'float' to 'int8'.
"""
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from terraformer import kernels
from terraformer.benchmarks import step_macs
from terraformer.decoding import step as decode_step
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.cross_attention import CrossAttention
from terraformer.layers.local_conv import LocalConv
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_qkv_attention import ModuleConv
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM
from terraformer.models import Terraformer

from bench_models import (  # tests/bench_models.py
    D, D_FF, F, LOWRANK, N, S, S_LOSS, SPARSE, V, lm)


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  # Bindings of an earlier test would change the models built here.
  gin.clear_config()
  yield
  gin.clear_config()


def _flops(fn, *args):
  """XLA's flop count of the compiled `fn(*args)` (shapes suffice)."""
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):  # Older JAX: one dict per program.
    cost = cost[0]
  return cost['flops']


def _after_first_call(model, prompt_len=9):
  """(x, weights, state after the first call, rng) of a predict step, as
  shapes: the encoder then is cached (tl.Cache filled) and not run."""
  signature = decode_step.predict_signature(model, prompt_len)
  weights, state = decode_step.init_shapes(model, signature)
  model.weights, model.state = weights, state  # pure_fn's tree structure.
  token = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  x = ((jax.ShapeDtypeStruct((1, prompt_len), jnp.int32), token)
       if decode_step.is_encoder_decoder(model) else token)
  rng = jax.ShapeDtypeStruct((2,), jnp.uint32)
  _, state = jax.eval_shape(model.pure_fn, x, weights, state, rng)
  return x, weights, state, rng


# d_model 256: a block's dots are O(d_model²) multiply-adds per token, its
# elementwise work (LayerNorm, biases, activations, residual sums, the
# softmax over the cache) O(d_model + cache): a few percent of XLA's flops.
# max_len 512: a step at position 300 reads the 512-position bucket, the
# one XLA counts (the cost of a lax.switch is its costliest branch).
_BIG = dict(d_model=256, d_ff=1024, n_heads=4, dropout=0.0, max_len=512,
            mode='predict')
_SPARSE_BIG = dict(d_lowrank=32, ff_sparsity=32, attention_sparsity=4,
                   loss_sparsity=4)
ORACLE_MODELS = {
    'dense_lm': lambda: ScalingTransformerLM(vocab_size=256, n_layers=2,
                                             **_BIG),
    # Sparse QKV (F x F' = 3 x 3 convolutions over 4 modules: XLA leaves
    # the zero-padded edge modules out, and so does step_macs), sparse FF,
    # sparse loss.
    'sparse_lm': lambda: ScalingTransformerLM(
        vocab_size=256, n_layers=2, attention_kernel_size=3, **_SPARSE_BIG,
        **_BIG),
    'dense_encoder_decoder': lambda: ScalingTransformer(
        input_vocab_size=256, n_encoder_layers=1, n_decoder_layers=2,
        **_BIG),
    'sparse_encoder_decoder': lambda: ScalingTransformer(
        input_vocab_size=256, n_encoder_layers=1, n_decoder_layers=2,
        **_SPARSE_BIG, **_BIG),
    # CausalDotProductAttention over encoder + decoder positions, the
    # low-rank SRU, the reversible decoder stack.
    'terraformer': lambda: Terraformer(
        input_vocab_size=256, n_encoder_layers=1, n_decoder_layers=2,
        ff_sparsity=32, d_lowrank=32, encoder_attention_type='full',
        decoder_attention_type='full', predict_mem_len=512, d_sru=32,
        **_BIG),
}
# XLA's flops exceed 2 x MACs by the elementwise work: at most this share.
ELEMENTWISE_SHARE = 0.05


@pytest.mark.parametrize('name', sorted(ORACLE_MODELS))
def test_float_macs_match_xla_flops_of_the_compiled_step(name):
  model = ORACLE_MODELS[name]()
  prompt_len, position = 9, 300
  x, weights, state, rng = _after_first_call(model, prompt_len)
  flops = _flops(model.pure_fn, x, weights, state, rng)
  encoder_len = prompt_len if decode_step.is_encoder_decoder(model) else 0
  counts = step_macs.step_macs(model, weights, state, position,
                               encoder_len=encoder_len)
  total = step_macs.total_macs(counts)
  assert total['int8'] == 0
  assert (1 - ELEMENTWISE_SHARE) * flops <= 2 * total['float'] <= flops, (
      counts, flops)


def _single_step(layer, signature, position=0, n_tokens=1):
  weights, state = layer.init(signature)
  return step_macs.step_macs(layer, weights, state, position, n_tokens)


@pytest.mark.parametrize('use_bias', [True, False])
def test_dense_is_k_times_n_per_token(use_bias):
  layer = tl.Dense(48, use_bias=use_bias)
  assert _single_step(layer, shapes.ShapeDtype((1, 3, 40)), n_tokens=3) == {
      'Dense': {'int8': 0, 'float': 3 * 40 * 48}}
  if not use_bias:  # XLA: the dot alone, 2 flops a multiply-add.
    weights, _ = layer.init(shapes.ShapeDtype((1, 3, 40)))
    assert _flops(jnp.dot, jnp.zeros((1, 3, 40)), weights) == 2 * 3 * 40 * 48


def test_sparse_ff_predict_step_reads_one_row_per_block():
  """Controller (x C1) C2, then one row of W1ᵀ and one of W2 per block."""
  layer = SparseFF(D_FF, N, LOWRANK, mode='predict')
  blocks = D_FF // N
  per_token = D * LOWRANK + LOWRANK * D_FF + 2 * blocks * D
  assert _single_step(layer, shapes.ShapeDtype((1, 2, D)), n_tokens=2) == {
      'SparseFF': {'int8': 0, 'float': 2 * per_token}}


def test_multiplicative_dense_is_its_product_and_its_scaling():
  """y[s, m] = sum_i (x_i D[s, i]) E[i, m]: S*d*M, plus the S*d x ⊙ D."""
  modules, d_module = 4, 8
  layer = MultiplicativeDense(modules, d_module, use_bias=True)
  assert _single_step(layer, shapes.ShapeDtype((1, 1, D))) == {
      'MultiplicativeDense': {
          'int8': 0, 'float': modules * D * d_module + modules * D}}


@pytest.mark.parametrize('modules,d_module,length_kernel,module_kernels', [
    (S, D // S, F, (F, F, 1)),      # sparse QKV's Q, K and V
    (8, 16, 3, (3,)),
    (4, 8, 1, (5,)),                # wider than half the modules
])
def test_module_conv_counts_what_xla_counts(modules, d_module, length_kernel,
                                            module_kernels):
  """XLA's flops of the predict-mode convolutions: 2 per multiply-add of
  an input module that exists (the zero padding left out), plus one add
  of the bias per output feature."""
  layer = ModuleConv(modules, d_module, length_kernel, module_kernels,
                     mode='predict')
  signature = shapes.ShapeDtype((1, 1, modules * d_module))
  weights, state = layer.init(signature)
  counts = step_macs.step_macs(layer, weights, state, 0)
  flops = _flops(layer.pure_fn, jnp.zeros((1, 1, modules * d_module)),
                 weights, state, jax.random.PRNGKey(0))
  bias_adds = len(module_kernels) * modules * d_module
  assert flops == 2 * counts['ModuleConv']['float'] + bias_adds
  assert counts['ModuleConv']['int8'] == 0


def test_module_conv_by_hand():
  """Sparse QKV's convolutions over S modules: a 3-wide module kernel
  loses one column at each edge module (S*3 - 2 pairs), a 1-wide none;
  each pair is F positions of M x M weights."""
  m = D // S
  layer = ModuleConv(S, m, F, (3, 3, 1), mode='predict')
  expected = F * m * m * (2 * (3 * S - 2) + S)
  assert _single_step(layer, shapes.ShapeDtype((1, 1, D))) == {
      'ModuleConv': {'int8': 0, 'float': expected}}
  # LocalConv: one module of width d_model, F d_model x d_model matrices.
  assert _single_step(LocalConv(D, 3, mode='predict'),
                      shapes.ShapeDtype((1, 1, D))) == {
                          'ModuleConv': {'int8': 0, 'float': 3 * D * D}}


def test_cache_attention_reads_its_bucket():
  """Scores and weighted values over the bucket of positions the step
  reads (64, 128: the buckets of a 128-position cache), per head."""
  heads, d_head = 3, 8
  layer = PrefixCausalAttention(max_inference_length=128, mode='predict')
  weights, state = layer.init(
      tuple(shapes.ShapeDtype((heads, 1, d_head)) for _ in range(3)))
  for position, bucket in ((0, 64), (63, 64), (64, 128), (127, 128)):
    assert step_macs.step_macs(layer, weights, state, position) == {
        'PrefixCausalAttention': {
            'int8': 0, 'float': 2 * bucket * heads * d_head}}


def test_decoder_cache_attention_counts_the_encoder_positions():
  """The Terraformer's decoder cache holds encoder_len encoder positions,
  then the decoder's (buckets 64, 128, 200)."""
  heads, d_head, encoder_len = 2, 8, 9
  layer = CausalDotProductAttention(heads, max_len=200, mode='predict')
  weights, state = layer.init(
      tuple(shapes.ShapeDtype((heads, 1, d_head)) for _ in range(3))
      + (shapes.ShapeDtype((1,), np.int32),))
  for position, bucket in ((1, 64), (54, 64), (55, 128), (150, 200)):
    counts = step_macs.step_macs(layer, weights, state, position,
                                 encoder_len=encoder_len)
    assert counts == {'CausalDotProductAttention': {
        'int8': 0, 'float': 2 * bucket * heads * d_head}}


def test_cross_attention_reads_every_encoder_position():
  heads, d_head, length = 4, 8, 9
  layer = CrossAttention(n_heads=heads, mode='predict')
  state = (jnp.zeros((1, heads, d_head, length)),
           jnp.zeros((1, heads, length, d_head)))
  assert step_macs.step_macs(layer, (), state, 5) == {
      'CrossAttention': {'int8': 0, 'float': 2 * heads * d_head * length}}


def test_in_place_cache_attention_counts_the_filled_positions():
  """With `tf_cache_attention` the step reads positions 0..position only,
  not their bucket."""
  if not kernels.available():
    pytest.skip('the kernel library is not available: '
                f'{kernels.unavailable_reason()}')
  if not kernels.has_kernel('tf_cache_attention'):
    pytest.skip('the kernel library has no tf_cache_attention')
  heads, d_head, position = 3, 8, 9
  layer = PrefixCausalAttention(max_inference_length=128, mode='predict')
  weights, state = layer.init(
      tuple(shapes.ShapeDtype((heads, 1, d_head)) for _ in range(3)))
  kernel_installer.install(layer)
  assert step_macs.step_macs(layer, weights, state, position) == {
      'KernelPrefixCausalAttention': {
          'int8': 0, 'float': 2 * (position + 1) * heads * d_head}}


def _lm_q8_products(sparse, n_layers=2):
  """MACs per token of the products 'q8' packs in `lm(n_layers)` (by hand).

  Sparse: E of sparse QKV (S modules of D/S) and of the sparse loss
  (S_LOSS modules of V/S_LOSS), the Q, K (F x F, edge columns padded) and
  V (F x 1) convolutions, the sparse FF controller's C2. Dense: Q, K, V,
  the output, the two FF layers, the logits.
  """
  if not sparse:
    return {'KernelDense': n_layers * (4 * D * D + 2 * D * D_FF) + D * V}
  m = D // S
  return {
      'KernelMultiplicativeDense': (n_layers * S * D * m
                                    + S_LOSS * D * (V // S_LOSS)),
      'KernelModuleConv': n_layers * F * m * m * (2 * (F * S - 2) + S),
      'KernelSparseFF': n_layers * LOWRANK * D_FF,
  }


def _stored(model, weights, storage):
  return jax.eval_shape(
      lambda w: kernel_layers.store_weights(model, w, storage), weights)


@pytest.mark.parametrize('sparse', [False, True])
def test_q8_moves_exactly_its_products_to_int8(sparse):
  model = lm(n_layers=2, **(SPARSE if sparse else {}))
  _, weights, state, _ = _after_first_call(model)
  kernel_installer.install(model, use_ffi=False)
  position = 5
  f32 = step_macs.step_macs(model, weights, state, position)
  q8 = step_macs.step_macs(model, _stored(model, weights, 'q8'), state,
                           position)
  expected = _lm_q8_products(sparse)
  assert {k: c['int8'] for k, c in q8.items() if c['int8']} == expected
  assert f32.keys() == q8.keys()
  for name, counts in f32.items():
    assert counts['int8'] == 0
    assert q8[name]['float'] == counts['float'] - expected.get(name, 0)
  assert sum(step_macs.total_macs(q8).values()) == (
      step_macs.total_macs(f32)['float'])
  # int8 and bfloat16 storage: dequantized rows, float products.
  for storage in ('int8', 'bfloat16'):
    assert step_macs.step_macs(model, _stored(model, weights, storage),
                               state, position) == f32


def test_q8_terraformer_keeps_each_class_total():
  """The fused decoder blocks are walked: each class's MACs stay, the
  packed products' now int8 (d_sru 32: every packed matrix's K is a
  multiple of the Q8 block, which 'q8' keeps only rounded up)."""
  model = Terraformer(
      input_vocab_size=V, d_model=D, d_ff=D_FF, n_encoder_layers=1,
      n_decoder_layers=2, n_heads=4, dropout=0.0, max_len=128, ff_sparsity=N,
      d_lowrank=LOWRANK, loss_sparsity=S_LOSS, attention_sparsity=S,
      encoder_attention_type='full', decoder_attention_type='full',
      predict_mem_len=128, d_sru=32, mode='predict')
  _, weights, state, _ = _after_first_call(model)
  kernel_installer.install(model, use_ffi=False)
  f32 = step_macs.step_macs(model, weights, state, 3, encoder_len=9)
  q8 = step_macs.step_macs(model, _stored(model, weights, 'q8'), state, 3,
                           encoder_len=9)
  assert {k for k, c in q8.items() if c['int8']} == {
      'KernelDense', 'KernelMultiplicativeDense', 'KernelModuleConv',
      'KernelSparseFF'}
  assert {k: sum(c.values()) for k, c in q8.items()} == {
      k: c['float'] for k, c in f32.items()}


def test_layers_it_cannot_count_raise():
  class Bilinear(tl.Layer):
    def forward(self, x):
      return x * self.weights

    def init_weights_and_state(self, input_signature):
      self.weights = jnp.ones(input_signature.shape[-1:])

  layer = Bilinear()
  weights, state = layer.init(shapes.ShapeDtype((1, 1, 4)))
  with pytest.raises(NotImplementedError, match='Bilinear'):
    step_macs.step_macs(layer, weights, state, 0)
  with pytest.raises(NotImplementedError, match='PureAttention'):
    step_macs.step_macs(tl.PureAttention(n_heads=2, mode='predict'), (), (),
                        0)


def test_total_macs_sums_the_classes():
  assert step_macs.total_macs({'A': {'int8': 1, 'float': 2},
                               'B': {'int8': 10, 'float': 20}}) == {
                                   'int8': 11, 'float': 22}
