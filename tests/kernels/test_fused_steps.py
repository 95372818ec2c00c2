"""Fused decoding steps: a sparse QKV attention step in one kernel call, a
Terraformer decoder block in one call.

`KernelSparseQKV` (tf_sparse_qkv) replaces the three tf_q8_matmul calls of
sparse QKV's step (the multiplicative layer, the Q/K and the V
convolutions), `KernelSparseQKVAttention` (tf_sparse_qkv_attention)
that call and the attention's tf_cache_attention, and
`KernelReversibleSerial` (tf_terraformer_block) a Terraformer decoder
block's five calls and its XLA residuals, SRU cell and swaps, and
`KernelScalingBlocks` (tf_scaling_block) a Scaling Transformer decoder
block's calls, its cross-attention and its residual sums. Each is
checked against the calls it replaces (the same operations: the same bits,
step after step, outputs and state; the block within float rounding: its
SRU cell is C++, not XLA) and against XLA's quantized path (float
rounding), at the layer and in a whole decoding step.
"""
import re

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes
from trax.layers import combinators as trax_combinators

from terraformer import kernels
from terraformer.kernels import block_layers
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers import composites
from terraformer.layers import reversible as rev
from terraformer.layers.attention import SelfAttention
from terraformer.layers.attention import TransformerSelfAttention
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_qkv_attention import SparseQKV
from greedy_decoding import greedy  # tests/greedy_decoding.py
from terraformer.decoding import step as decode_step
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM
from terraformer.models import Terraformer

# The Q8 paths the fused steps are checked on: the real ones (AMX's tiles
# only on products of 16 rows or more, which these small steps never make;
# its emulation's own tests are in test_q8_gemv.py).
GEMV_PATHS = [n for n in kernels.GEMV_ISA_NAMES
              if n not in kernels.GEMV_EMULATED]


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  gin.clear_config()
  yield
  gin.clear_config()


def _sparse_qkv_steps(layer, stored, state, xs, fusable):
  """Outputs and states of `layer` (an installed SparseQKV) over the steps
  xs [steps, B, 1, d], with the fused call allowed or not; and the step's
  HLO text."""
  outputs = []
  saved = kernel_layers.KernelSparseQKV._fusable  # pylint: disable=protected-access
  try:
    if not fusable:
      kernel_layers.KernelSparseQKV._fusable = lambda self, x, weights=None: False  # pylint: disable=protected-access
    fn = jax.jit(layer.pure_fn)
    text = fn.lower(xs[0], stored, state, jax.random.PRNGKey(0)).as_text()
    for x in xs:
      out, state = fn(x, stored, state, jax.random.PRNGKey(0))
      outputs.append((out, state))
  finally:
    kernel_layers.KernelSparseQKV._fusable = saved  # pylint: disable=protected-access
  return jax.tree_util.tree_map(np.asarray, outputs), text


@pytest.mark.parametrize('parallel', [False, True], ids=['serial', 'split'])
@pytest.mark.parametrize('batch,kernel_size', [(1, 3), (2, 2), (1, 4)])
@pytest.mark.parametrize('name', GEMV_PATHS)
def test_sparse_qkv_step_is_one_call_with_the_bits_of_three(
    gemv_isa, request, name, parallel, batch, kernel_size):
  """Sparse QKV's decoding step in 'q8' (module kernels 3, 3, 1; M = 16)
  is one tf_sparse_qkv call: its q, k, v and kept inputs equal, bit for bit
  and step after step, those of the multiplicative layer's and the two
  convolutions' tf_q8_matmul calls (`KernelMultiplicativeDense`,
  `KernelModuleConv`), which XLA's quantized product matches to float
  rounding."""
  gemv_isa(name)
  if parallel:
    request.getfixturevalue('split_every_product')
  d_model, modules = 80, 5
  layer = SparseQKV(d_model, modules, kernel_size, 3, causal=True,
                    mode='predict')
  xs = jax.random.normal(jax.random.PRNGKey(7), (4, batch, 1, d_model))
  weights, state = layer.init(shapes.signature(xs[0]),
                              rng=jax.random.PRNGKey(1))
  assert kernel_installer.install(layer) == 3
  assert isinstance(layer, kernel_layers.KernelSparseQKV)
  stored = kernel_layers.store_weights(layer, weights, 'q8')
  fused, text = _sparse_qkv_steps(layer, stored, state, xs, True)
  assert text.count('tf_sparse_qkv') == 1 and 'tf_q8_matmul' not in text
  three, text = _sparse_qkv_steps(layer, stored, state, xs, False)
  assert text.count('tf_q8_matmul') == 3 and 'tf_sparse_qkv' not in text
  for (out, kept), (out3, kept3) in zip(fused, three):
    for y, y3 in zip(out, out3):
      assert y.shape == (batch, 1, d_model)
      np.testing.assert_array_equal(y, y3)
    np.testing.assert_array_equal(kept[1], kept3[1])
  layer._tf_use_ffi = False  # pylint: disable=protected-access
  for sub in layer.sublayers:
    sub._tf_use_ffi = False  # pylint: disable=protected-access
  xla, _ = _sparse_qkv_steps(layer, stored, state, xs, True)
  for (out, kept), (out_xla, kept_xla) in zip(fused, xla):
    for y, y_xla in zip(out, out_xla):
      np.testing.assert_allclose(y, y_xla, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kept[1], kept_xla[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', ['prompt', 'same_kernels', 'int8'])
def test_sparse_qkv_keeps_the_layers_calls_where_it_cannot_fuse(gemv_isa,
                                                                 case):
  """A prompt (two positions), module kernels that 'q8' stores as one
  product (3, 3, 3) and int8 storage (no packed E) run the sublayers, each
  with its own kernel."""
  gemv_isa(kernels.best_gemv_isa())
  length = 2 if case == 'prompt' else 1
  x = jax.random.normal(jax.random.PRNGKey(8), (1, length, 64))
  layer = SparseQKV(64, 4, 3, 3, causal=True, mode='predict',
                    value_module_kernel_size=3 if case == 'same_kernels'
                    else 1)
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(2))
  kernel_installer.install(layer)
  storage = 'int8' if case == 'int8' else 'q8'
  stored = kernel_layers.store_weights(layer, weights, storage)
  text = jax.jit(layer.pure_fn).lower(x, stored, state,
                                      jax.random.PRNGKey(0)).as_text()
  assert 'tf_sparse_qkv' not in text
  assert ('tf_skinny_matmul' if case == 'int8' else 'tf_q8_matmul') in text


def test_sparse_qkv_kernel_rejects_mismatched_operands(gemv_isa):
  """Operands whose shapes disagree get one line naming what is wrong."""
  gemv_isa(kernels.best_gemv_isa())
  layer = SparseQKV(64, 4, 3, 3, causal=True, mode='predict')
  x = jnp.ones((1, 1, 64))
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(3))
  kernel_installer.install(layer)
  (d, e, bias, e_scale, d_scale), conv = kernel_layers.store_weights(
      layer, weights, 'q8')
  k_qk, b_qk, k_v, b_v, s_qk, s_v = conv
  with pytest.raises(Exception, match='tf_sparse_qkv: packed V kernel has'):
    # The Q/K kernels where V's belong: 3 x 3 x 16 inputs, not 3 x 1 x 16.
    jax.block_until_ready(kernels.sparse_qkv(
        x, 3, 1, d=d, d_scale=d_scale, e=e, e_scale=e_scale, e_bias=bias,
        kept=state[1], qk=k_qk, qk_scale=s_qk, qk_bias=b_qk, v=k_qk,
        v_scale=s_v, v_bias=b_v))


def _unfused_attention(monkeypatch):
  """Sparse QKV attention as its sublayers' calls (tf_sparse_qkv, then
  tf_cache_attention), and LayerNorms as XLA's."""
  monkeypatch.setattr(kernel_layers.KernelSparseQKVAttention, 'fused_step',
                      lambda self, *args, **kwargs: None)
  monkeypatch.setattr(block_layers.KernelNormSerial, 'forward',
                      trax_combinators.Serial.forward)
  monkeypatch.setattr(block_layers.KernelReversibleSerial, 'forward',
                      trax_combinators.Serial.forward)
  monkeypatch.setattr(block_layers.KernelScalingBlocks, 'forward',
                      trax_combinators.Serial.forward)


def _attention_steps(layer, x, stored, state, steps):
  """A prompt, then `steps` single positions: [(outputs, state)], and the
  HLO text of a single position's call."""
  fn = jax.jit(layer.pure_fn)
  _, state = fn(x, stored, state, jax.random.PRNGKey(0))
  results, text = [], None
  for t in range(steps):
    xt = jax.random.normal(jax.random.PRNGKey(10 + t), (x[0].shape[0], 1) +
                           x[0].shape[2:])
    xt = (xt,) + tuple(x[1:])
    xt = xt if len(xt) > 1 else xt[0]
    if text is None:
      text = fn.lower(xt, stored, state, jax.random.PRNGKey(0)).as_text()
    out, state = fn(xt, stored, state, jax.random.PRNGKey(0))
    results.append((out, state))
  return jax.tree_util.tree_map(np.asarray, results), text


@pytest.mark.parametrize('layout', ['terraformer', 'transformer'])
@pytest.mark.parametrize('name', GEMV_PATHS)
def test_sparse_qkv_attention_step_is_one_call_with_the_bits_of_two(
    gemv_isa, monkeypatch, name, layout):
  """A decoder's sparse QKV attention (the Terraformer's, reading the
  encoder lengths and masking junk keys; the Scaling Transformer's) in 'q8'
  decodes each position with one tf_sparse_qkv_attention call; outputs,
  caches, kept inputs and position equal those of tf_sparse_qkv +
  tf_cache_attention bit for bit (batch 2, examples of different lengths),
  and XLA's quantized path to float rounding."""
  gemv_isa(name)
  d_model, modules, max_len = 64, 4, 16
  if layout == 'terraformer':
    layer = SelfAttention(d_model, 4, 'full', modules, causal=True,
                          mode='predict', predict_mem_len=max_len)
    x = (jax.random.normal(jax.random.PRNGKey(1), (2, 3, d_model)),
         jnp.array([1, 2]))
  else:
    layer = TransformerSelfAttention(d_model, 4, 'full', modules,
                                     causal=True, mode='predict',
                                     max_len=max_len)
    x = (jax.random.normal(jax.random.PRNGKey(1), (2, 3, d_model)),)
  weights, state = layer.init(shapes.signature(x if len(x) > 1 else x[0]),
                              rng=jax.random.PRNGKey(0))
  kernel_installer.install(layer)
  assert isinstance(layer, kernel_layers.KernelSparseQKVAttention)
  stored = kernel_layers.store_weights(layer, weights, 'q8')
  fused, text = _attention_steps(layer, x, stored, state, 4)
  assert text.count('tf_sparse_qkv_attention') == 1
  assert 'tf_cache_attention' not in text and 'tf_q8_matmul' not in text
  with monkeypatch.context() as patch:
    _unfused_attention(patch)
    two, text = _attention_steps(layer, x, stored, state, 4)
  assert 'tf_sparse_qkv_attention' not in text
  assert 'tf_cache_attention' in text and 'tf_sparse_qkv' in text
  for (out, st), (out2, st2) in zip(fused, two):
    assert out.shape == (2, 1, d_model)
    np.testing.assert_array_equal(out, out2)
    for a, b in zip(jax.tree_util.tree_leaves(st),
                    jax.tree_util.tree_leaves(st2)):
      np.testing.assert_array_equal(a, b)
  kernel_installer.install(layer, use_ffi=False)
  xla, _ = _attention_steps(layer, x, stored, state, 4)
  for (out, _), (out_xla, _) in zip(fused, xla):
    np.testing.assert_allclose(out, out_xla, rtol=1e-5, atol=1e-5)


def _terraformer_q8():
  # d_model 64 over 4 modules: M = 16, whole groups of the Q8 layout.
  return Terraformer(
      input_vocab_size=96, d_model=64, d_ff=128, n_heads=4,
      n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, max_len=64,
      ff_sparsity=8, d_lowrank=4, loss_sparsity=4, d_sru=8,
      attention_sparsity=4, encoder_attention_type='full',
      decoder_attention_type='full', predict_mem_len=64, mode='predict')


def _scaling_q8():
  return ScalingTransformer(
      input_vocab_size=96, d_model=64, d_ff=128, n_encoder_layers=1,
      n_decoder_layers=2, n_heads=4, dropout=0.0, max_len=64, d_lowrank=8,
      ff_sparsity=8, attention_sparsity=4, loss_sparsity=4, mode='predict')


def _calls(hlo):
  """[(kernel, its operand layouts)] of a compiled step's HLO."""
  return re.findall(r'custom_call_target="(tf_\w+)", operand_layout_'
                    r'constraints=\{(.*?\})\}', hlo)


def _scaling_lm_q8():
  return ScalingTransformerLM(
      vocab_size=96, d_model=64, d_ff=128, n_layers=2, n_heads=4,
      dropout=0.0, max_len=64, d_lowrank=8, ff_sparsity=8,
      attention_sparsity=4, loss_sparsity=4, mode='predict')


def _same_decode_as_parts(build, logits, tokens, as_parts, monkeypatch):
  """Checks a fused greedy decode (`logits`, `tokens` of `build`'s 'q8'
  model) against the blocks' parts' calls (`as_parts(patch)` puts them
  back; logits within 1e-5) and against the fully unfused step (1e-4), the
  same tokens; returns the parts' step's kernel calls."""
  targets = []
  for put_back, atol in ((as_parts, 1e-5), (_unfused_attention, 1e-4)):
    with monkeypatch.context() as patch:
      put_back(patch)
      other_logits, other_tokens, hlo = greedy(build, ('ffi', 'q8'),
                                               n_tokens=6, compiled=True)
    np.testing.assert_allclose(logits, other_logits, rtol=0, atol=atol)
    assert tokens == other_tokens
    targets = targets or [t for t, _ in _calls(hlo)]
  return targets


def _assert_same_steps(fused, parts):
  """[(outputs, state)] of the same steps: every output and state leaf of
  the same shape and dtype, equal to float rounding."""
  assert len(fused) == len(parts)
  for step, step2 in zip(fused, parts):
    leaves, leaves2 = (jax.tree_util.tree_leaves(t) for t in (step, step2))
    assert len(leaves) == len(leaves2)
    for a, b in zip(leaves, leaves2):
      assert a.shape == b.shape and a.dtype == b.dtype
      np.testing.assert_allclose(np.asarray(a, np.float32),
                                 np.asarray(b, np.float32),
                                 rtol=1e-5, atol=1e-5)


def _scaling_blocks_as_parts(monkeypatch):
  """Scaling Transformer blocks as their parts' own calls."""
  monkeypatch.setattr(block_layers.KernelScalingBlocks, 'forward',
                      trax_combinators.Serial.forward)


@pytest.mark.parametrize('build', [_scaling_q8, _scaling_lm_q8],
                         ids=['encoder_decoder', 'lm'])
@pytest.mark.parametrize('name', GEMV_PATHS)
def test_scaling_transformer_decoder_block_is_one_call(gemv_isa, float_isa,
                                                       monkeypatch, name,
                                                       build):
  """A whole 'q8' Scaling Transformer decoding step makes one
  tf_scaling_block call per decoder block (and one for the sparse loss):
  the attention, the cross-attention over the encoder (sparse queries,
  attention over its split keys) and the sparse FF, with the residual
  sums; the caches are aliased to the step's outputs and never copied.
  Its greedy decode has the tokens of the step made of the blocks' own
  calls (tf_sparse_qkv_attention, the queries' two tf_q8_matmul and XLA's
  cross-attention, tf_sparse_ff), the logits within float rounding; so
  does the fully unfused step. The float kernels (the attentions) take
  the path of the same level as the GEMV."""
  gemv_isa(name)
  float_isa({'avx512vnni': 'avx512', 'amx': 'avx512'}.get(name, name))
  logits, tokens, hlo = greedy(build, ('ffi', 'q8'), n_tokens=6,
                               compiled=True)
  targets = [t for t, _ in _calls(hlo)]
  assert targets.count('tf_scaling_block') == 2  # the decoder blocks
  assert targets == ['tf_scaling_block'] * 2 + ['tf_q8_matmul']
  assert 'input_output_alias' in hlo.splitlines()[0]
  assert not re.findall(r'= f32\[4,64,16\]\{2,1,0\} copy\(', hlo)
  b_targets = _same_decode_as_parts(build, logits, tokens,
                                    _scaling_blocks_as_parts, monkeypatch)
  assert b_targets.count('tf_sparse_qkv_attention') == 2
  assert b_targets.count('tf_sparse_ff') == 2
  assert 'tf_scaling_block' not in b_targets


def test_scaling_block_state_matches_its_parts(gemv_isa, monkeypatch):
  """2 rows whose inputs have different padding: the encoder-decoder
  model's outputs and whole state after the fused blocks (the attentions'
  caches and kept inputs, the cross-attention queries' kept inputs, the
  split encoder keys) equal those after the blocks' own calls, to float
  rounding, step after step; the padded row attends to its own inputs
  only (its tokens change when the padding is made a token)."""
  gemv_isa(kernels.best_gemv_isa())
  inputs = jnp.array([[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 0, 0, 0, 0, 0]],
                     jnp.int32)

  def run(fused, inputs):
    with monkeypatch.context() as patch:
      if not fused:
        _scaling_blocks_as_parts(patch)
      model = _scaling_q8()
      sig = decode_step.predict_signature(model, prompt_len=8, batch=2)
      weights, state = model.init(sig, rng=jax.random.PRNGKey(1))
      step = decode_step.make_step(model, options=('ffi', 'q8'))
      token = jnp.full((2, 1), 5, jnp.int32)
      results = []
      for t in range(4):
        if t == 1:
          text = step.jitted.lower((inputs, token), step.store_weights(
              weights), state, jax.random.PRNGKey(0)).as_text()
        out, state = step((inputs, token), weights, state,
                          jax.random.PRNGKey(0))
        logits = out[0] if isinstance(out, (tuple, list)) else out
        token = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)[:, None]
        results.append((np.asarray(logits), jax.tree_util.tree_map(
            np.asarray, state)))
      return results, text

  (fused, text), (parts, parts_text) = run(True, inputs), run(False, inputs)
  assert text.count('tf_scaling_block') == 2
  assert 'tf_scaling_block' not in parts_text
  _assert_same_steps(fused, parts)
  # The mask counts: without it, the second row would attend to the
  # padding's keys too.
  unpadded, _ = run(True, inputs.at[1, 3:].set(3))
  assert not np.allclose(unpadded[-1][0][1], fused[-1][0][1], atol=1e-5)
  np.testing.assert_allclose(unpadded[-1][0][0], fused[-1][0][0],
                             rtol=1e-5, atol=1e-5)


def test_scaling_block_rejects_mismatched_operands(gemv_isa, monkeypatch):
  """A block call whose operands disagree gets one line naming what is
  wrong, not a crash: an operand of the wrong type, and an encoder mask
  of the wrong length."""
  gemv_isa(kernels.best_gemv_isa())
  model = _scaling_q8()
  sig = decode_step.predict_signature(model, prompt_len=8)
  weights, state = model.init(sig, rng=jax.random.PRNGKey(1))
  step = decode_step.make_step(model, options=('ffi', 'q8'))
  x = (jnp.arange(1, 9, dtype=jnp.int32)[None], jnp.ones((1, 1), jnp.int32))
  _, state = step(x, weights, state, jax.random.PRNGKey(0))
  stored = step.store_weights(weights)
  captured = {}

  def capture(x, attention, ff, cross=None):
    captured.setdefault('call', (x, attention, ff, cross))
    return real(x, attention, ff, cross)

  real = kernels.scaling_block
  with monkeypatch.context() as patch:
    patch.setattr(kernels, 'scaling_block', capture)
    model.pure_fn(x, stored, state, jax.random.PRNGKey(0))
  x0, attention, ff, cross = captured['call']
  assert cross is not None
  # W1ᵀ (operand 37: after x, 18 attention operands, 14 cross-attention
  # operands, C1, C2, C2's scales and c) in int32.
  bad_w1t = dict(ff, w1t=jnp.asarray(ff['w1t'], jnp.int32))
  with pytest.raises(Exception, match='tf_scaling_block: operand 37 has '
                     'the wrong type'):
    jax.block_until_ready(kernels.scaling_block(x0, attention, bad_w1t,
                                                cross))
  bad_mask = dict(cross, mask=jnp.ones((1, 5), jnp.float32))
  with pytest.raises(Exception, match="tf_scaling_block: cross-attention: "
                     "the encoder's mask must have B L elements"):
    jax.block_until_ready(kernels.scaling_block(x0, attention, ff, bad_mask))


def test_scaling_transformer_step_attends_with_one_call_per_attention(
    gemv_isa, monkeypatch):
  """A whole 'q8' decoding step of a Scaling Transformer, its blocks as
  their parts' calls: one tf_sparse_qkv_attention call per decoder block,
  its LayerNorm inside, the caches aliased to the step's outputs and never
  copied; each sparse FF
  block's LayerNorm in its tf_sparse_ff call. Its greedy decode has the
  tokens of the unfused step (XLA's LayerNorms, tf_sparse_qkv and
  tf_cache_attention), the logits within float rounding."""
  gemv_isa(kernels.best_gemv_isa())
  with monkeypatch.context() as patch:
    _scaling_blocks_as_parts(patch)
    logits, tokens, hlo = greedy(_scaling_q8, ('ffi', 'q8'), n_tokens=6,
                                 compiled=True)
  calls = _calls(hlo)
  # The LayerNorm's scale and bias [d_model] are the last two operands of
  # every fused attention and of the 2 decoder blocks' sparse FF calls.
  normed = lambda target: [o.endswith('f32[64]{0}, f32[64]{0}')
                           for t, o in calls if t == target]
  assert normed('tf_sparse_qkv_attention') == [True] * 2
  assert sum(normed('tf_sparse_ff')) == 2
  assert 'input_output_alias' in hlo.splitlines()[0]
  # A copy of a cache: f32[batch * heads, 64 positions, 16].
  assert not re.findall(r'= f32\[4,64,16\]\{2,1,0\} copy\(', hlo)
  with monkeypatch.context() as patch:
    _unfused_attention(patch)
    u_logits, u_tokens, u_hlo = greedy(_scaling_q8, ('ffi', 'q8'),
                                       n_tokens=6, compiled=True)
  assert 'tf_sparse_qkv_attention' not in u_hlo
  np.testing.assert_allclose(logits, u_logits, rtol=0, atol=1e-4)
  assert tokens == u_tokens


def _terraformer_tanh_sru():
  with gin.unlock_config():
    gin.bind_parameter('terraformer.LowRankSRU.activation', 'tanh')
  try:
    return _terraformer_q8()
  finally:
    gin.clear_config()


@pytest.mark.parametrize('build', [_terraformer_q8, _terraformer_tanh_sru],
                         ids=['sru', 'tanh_sru'])
@pytest.mark.parametrize('name', GEMV_PATHS)
def test_terraformer_decoder_block_is_one_call(gemv_isa, monkeypatch, name,
                                               build):
  """A whole 'q8' Terraformer decoding step makes one tf_terraformer_block
  call per decoder block (and one for the sparse loss): both attentions,
  the sparse FF, the SRU path and the reversible sums and swaps; the
  caches are aliased to the step's outputs and never copied. Its greedy
  decode has the tokens of the step made of the blocks' own calls (two
  tf_sparse_qkv_attention, tf_sparse_ff and the SRU's two tf_q8_matmul per
  block, with XLA's SRU cell, sums and swaps), the logits and every state
  (caches, kept inputs, the SRU's c) within float rounding; so does the
  fully unfused step (XLA's LayerNorms, tf_sparse_qkv, tf_cache_attention).
  """
  gemv_isa(name)
  logits, tokens, hlo = greedy(build, ('ffi', 'q8'), n_tokens=6,
                               compiled=True)
  targets = [t for t, _ in _calls(hlo)]
  assert targets.count('tf_terraformer_block') == 2  # n_decoder_layers
  assert set(targets) == {'tf_terraformer_block', 'tf_q8_matmul'}
  assert len(targets) == 3
  assert 'input_output_alias' in hlo.splitlines()[0]
  assert not re.findall(r'= f32\[4,64,16\]\{2,1,0\} copy\(', hlo)
  b_targets = _same_decode_as_parts(
      build, logits, tokens,
      lambda patch: patch.setattr(block_layers.KernelReversibleSerial,
                                  'forward', trax_combinators.Serial.forward),
      monkeypatch)
  assert b_targets.count('tf_sparse_qkv_attention') == 4
  assert 'tf_terraformer_block' not in b_targets


@pytest.mark.parametrize('build,switch,block,attentions', [
    (_terraformer_q8, 'terraformer_block_kernel', 'tf_terraformer_block', 4),
    (_scaling_q8, 'scaling_block_kernel', 'tf_scaling_block', 2)],
                         ids=['terraformer', 'scaling_transformer'])
def test_gin_switch_keeps_a_blocks_own_calls(gemv_isa, build, switch, block,
                                             attentions):
  """`switch`.enabled = False: the 2 decoder blocks make their parts' calls
  (tf_sparse_qkv_attention per attention, tf_sparse_ff, ...), with the
  fused step's greedy tokens."""
  gemv_isa(kernels.best_gemv_isa())
  _, tokens, hlo = greedy(build, ('ffi', 'q8'), n_tokens=4, compiled=True)
  assert [t for t, _ in _calls(hlo)].count(block) == 2
  with gin.unlock_config():
    gin.bind_parameter(f'terraformer.{switch}.enabled', False)
  _, parts_tokens, hlo = greedy(build, ('ffi', 'q8'), n_tokens=4,
                                compiled=True)
  targets = [t for t, _ in _calls(hlo)]
  assert block not in targets
  assert targets.count('tf_sparse_qkv_attention') == attentions
  assert targets.count('tf_sparse_ff') == 2
  assert parts_tokens == tokens


@pytest.mark.parametrize('batch', [1, 2])
def test_terraformer_block_state_matches_its_parts(gemv_isa, monkeypatch,
                                                   batch):
  """The decoder stack's step outputs and state after the fused blocks
  (both attentions' caches, positions and kept inputs, the SRU's c) equal
  those after the blocks' own calls, to float rounding, step after step;
  with 2 rows of different encoder lengths too."""
  gemv_isa(kernels.best_gemv_isa())
  model = _terraformer_q8()
  stack = next(s for s in model.sublayers
               if isinstance(s, rev.ReversibleSerial)
               and len(s.sublayers) == 12)
  d = 64
  x = (jax.random.normal(jax.random.PRNGKey(2), (batch, 5, d)),
       jax.random.normal(jax.random.PRNGKey(3), (batch, 5, d)),
       jnp.array([3, 5][:batch]))
  weights, state = stack.init(shapes.signature(x), rng=jax.random.PRNGKey(5))
  kernel_installer.install(stack)
  assert isinstance(stack, block_layers.KernelReversibleSerial)
  stored = kernel_layers.store_weights(stack, weights, 'q8')

  def run(fused):
    """A prompt, then 3 single positions of both streams: [(outputs,
    state)] and the HLO text of a single position's call."""
    with monkeypatch.context() as patch:
      if not fused:
        patch.setattr(block_layers.KernelReversibleSerial, 'forward',
                      trax_combinators.Serial.forward)
      fn = jax.jit(stack.pure_fn)
      _, st = fn(x, stored, state, jax.random.PRNGKey(0))
      results = []
      for t in range(3):
        xt = tuple(jax.random.normal(jax.random.PRNGKey(10 + 2 * t + i),
                                     (batch, 1, d)) for i in range(2)) + x[2:]
        if not results:
          text = fn.lower(xt, stored, st, jax.random.PRNGKey(0)).as_text()
        out, st = fn(xt, stored, st, jax.random.PRNGKey(0))
        results.append((out, st))
      return jax.tree_util.tree_map(np.asarray, results), text

  (fused, text), (parts, parts_text) = run(True), run(False)
  assert text.count('tf_terraformer_block') == 2
  assert 'tf_terraformer_block' not in parts_text
  _assert_same_steps(fused, parts)


def test_terraformer_block_rejects_mismatched_operands(gemv_isa):
  """A block call whose operands disagree gets one line naming what is
  wrong, not a crash: an operand of the wrong type, and an SRU state of
  the wrong width."""
  gemv_isa(kernels.best_gemv_isa())
  model = _terraformer_q8()
  stack = next(s for s in model.sublayers
               if isinstance(s, rev.ReversibleSerial)
               and len(s.sublayers) == 12)
  x = (jnp.ones((1, 1, 64)), jnp.ones((1, 1, 64)), jnp.array([1]))
  weights, state = stack.init(shapes.signature(x), rng=jax.random.PRNGKey(5))
  kernel_installer.install(stack)
  stored = kernel_layers.store_weights(stack, weights, 'q8')
  attentions, ff, sru, _ = stack._block_arguments(  # pylint: disable=protected-access
      x[0], stored, state, 0)
  # W1ᵀ (operand 42, after x1, x2, 2 x 18 attention operands, C1, C2,
  # C2's scales and c) in int32.
  bad_w1t = dict(ff, w1t=jnp.asarray(ff['w1t'], jnp.int32))
  with pytest.raises(Exception, match='tf_terraformer_block: operand 42 has '
                     'the wrong type'):
    jax.block_until_ready(kernels.terraformer_block(
        x[0], x[1], attentions, bad_w1t, sru))
  bad_c = dict(sru, c=jnp.zeros((1, 3), jnp.float32))
  with pytest.raises(Exception, match="tf_terraformer_block: the SRU's "
                     'operands must be'):
    jax.block_until_ready(kernels.terraformer_block(
        x[0], x[1], attentions, ff, bad_c))


@pytest.mark.parametrize('kind', ['attention', 'sparse_ff'])
@pytest.mark.parametrize('storage', ['q8', 'int8', 'float32'])
def test_layer_norm_runs_inside_the_next_kernel_call(gemv_isa, kind,
                                                     storage):
  """A block's branch LayerNorm -> sparse QKV attention (the Terraformer's,
  beside the lengths) or -> sparse FF (the Terraformer's, after
  Select[0]), then Dropout: the decoding step is the kernel's one call
  with the LayerNorm in it (no reduction left to XLA), within float
  rounding of XLA's LayerNorm and the same call without it. The attention
  fuses in 'q8' only; the sparse FF in every storage."""
  gemv_isa(kernels.best_gemv_isa())
  d_model = 64
  if kind == 'attention':
    inner = [tl.Parallel(tl.LayerNorm(), []),
             SelfAttention(d_model, 4, 'full', 4, causal=True,
                           mode='predict', predict_mem_len=16)]
  else:
    inner = [tl.Select([0], n_in=2), tl.LayerNorm(),
             SparseFF(128, 8, 4, mode='predict')]
  layer = composites.mark(tl.Serial(*inner, tl.Dropout(rate=0.1,
                                                       mode='predict')),
                          composites.NORM_BRANCH)
  x = (jax.random.normal(jax.random.PRNGKey(1), (1, 3, d_model)) * 3 + 1,
       jnp.array([2]))
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  weights = jax.tree_util.tree_map(
      lambda w: w + 0.1 * jax.random.normal(jax.random.PRNGKey(4), w.shape)
      if w.dtype == jnp.float32 else w, weights)  # LayerNorm scale != 1.
  kernel_installer.install(layer)
  assert isinstance(layer, block_layers.KernelNormSerial)
  stored = kernel_layers.store_weights(layer, weights, storage)
  fused, text = _attention_steps(layer, x, stored, state, 3)
  target = ('tf_sparse_qkv_attention' if kind == 'attention'
            else 'tf_sparse_ff')
  folds = storage == 'q8' or kind == 'sparse_ff'
  assert (target in text) == folds
  assert ('stablehlo.reduce' not in text) == folds
  saved = block_layers.KernelNormSerial.forward
  try:
    block_layers.KernelNormSerial.forward = trax_combinators.Serial.forward
    apart, text = _attention_steps(layer, x, stored, state, 3)
  finally:
    block_layers.KernelNormSerial.forward = saved
  assert 'stablehlo.reduce' in text  # XLA's LayerNorm.
  for (out, st), (out2, st2) in zip(fused, apart):
    np.testing.assert_allclose(out, out2, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(st),
                    jax.tree_util.tree_leaves(st2)):
      np.testing.assert_allclose(np.asarray(a, np.float32),
                                 np.asarray(b, np.float32),
                                 rtol=1e-5, atol=1e-5)
