"""Multiply-adds one decoding step performs, int8 and float (the compute bound).

`bytes_read.step_bytes` bounds a step by the bytes it reads; some steps are
bound by arithmetic instead (the multiplicative layers: S*d*M multiply-adds
for the d*(S + M) weights of D and E). `step_macs` counts the multiply-adds
(MACs) of the same step, per layer class, walking the same layers with the
same arguments (`bytes_read.walk_step`): what each leaf layer's predict-mode
forward multiplies for `n_tokens` tokens, split by the kind of product:

  'int8'   products on int8 operands of the Q8 kernels: matrices stored
           'q8' (`kernels.layers.pack_q8`: Dense's W, MultiplicativeDense's
           E, ModuleConv's kernels, SparseFF's controller C2), whose inputs
           the kernel quantizes to int8 too (`quantize_activations`);
  'float'  every other product: float32 / bfloat16 weights, 'int8' weights
           (per-row scales, dequantized: float activations times float
           weights), attention over the caches, MultiplicativeDense's x ⊙ D.

The split follows the storage, not the path that runs: a 'q8' layer whose
kernel does not run (XLA's fallback, `q8_product`) computes the same
quantized products with XLA's float dots and still counts 'int8'. The
kernel layers (`kernels.layers`) count what the layer they replace counts;
the fused blocks (`kernels.block_layers`) are Serials whose sublayers are
counted. Elementwise work (embeddings, LayerNorm, activations, Dropout, the
softmax, biases, SRU's gates and recurrence) is not counted.
"""
import jax
import numpy as np
from trax.layers import attention as trax_attention
from trax.layers import core as trax_core
from trax.layers import normalization as trax_normalization

from terraformer.benchmarks import bytes_read
from terraformer.kernels.layers import is_q8
from terraformer.layers.blockwise_attention import BlockwiseAttentionCore
from terraformer.layers.composite_slice_attention import (
    CompositeSliceAttention)
from terraformer.layers.cross_attention import CrossAttention
from terraformer.layers.low_rank_sru import SRU
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.lsh_attention import LSHCore
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_qkv_attention import ModuleConv
from terraformer.models.terraformer import FixedBasePositionalEncoding

# Leaf layers with weights whose forward is elementwise or a row lookup.
_NO_PRODUCTS = (trax_core.Embedding, trax_attention.PositionalEncoding,
                FixedBasePositionalEncoding, trax_normalization.LayerNorm)
# Weightless leaves that multiply activations by activations, which
# `_leaf_macs` does not count: it raises rather than report 0.
_NOT_COUNTED = (trax_attention.PureAttention,
                trax_attention.DotProductCausalAttention, LSHCore,
                CompositeSliceAttention, BlockwiseAttentionCore)


def _size(array):
  return int(np.prod(array.shape, dtype=np.int64))


def _dense_macs(layer, weights, n_tokens):
  """tl.Dense (and `KernelDense`): y = x W (+ b), K*N per token.

  'q8' packs W [K, N] as [N / 16, K' / 4, 16, 4], K' = K rounded up to a
  multiple of Q8_BLOCK (zero rows, `pack_q8`), and no weight keeps K: the
  count uses K' (what the Q8 GEMV multiplies), K itself whenever K is a
  multiple of 32 (d_model, d_ff and the default d_sru of the models).
  """
  w = weights[0] if isinstance(weights, (tuple, list)) else weights
  n = layer._n_units  # pylint: disable=protected-access
  if is_q8(w):
    return n_tokens * w.shape[1] * w.shape[3] * n, 0  # K' * N.
  return 0, n_tokens * w.shape[0] * n


def _sparse_ff_macs(layer, weights, n_tokens):
  """`SparseFF._forward_selected_rows` (and `KernelSparseFF`'s
  `tf_sparse_ff`): the controller (x C1) C2, d*r + r*d_ff, then per block
  one row of W1ᵀ (a dot with x) and one of W2 (an axpy), d each: rows of
  'int8' storage are dequantized (float products); 'q8' packs C2 only."""
  c1, c2 = weights[0], weights[1]
  d_model, d_lowrank = c1.shape
  d_ff = weights[2].shape[0]  # c [d_ff]: C2 packed keeps d_ff only padded.
  controller_c2 = d_lowrank * d_ff
  floats = d_model * d_lowrank + 2 * layer.n_blocks * d_model
  if is_q8(c2):
    return n_tokens * controller_c2, n_tokens * floats
  return 0, n_tokens * (floats + controller_c2)


def _multiplicative_macs(layer, weights, n_tokens):
  """`MultiplicativeDense.forward`: x ⊙ D[s] for each module (S*d products,
  float: 'q8' stores D in int8 but the kernel multiplies x by the
  dequantized rows, then quantizes them), then (S x d) @ E (d x M),
  S*d*M (int8 when E is 'q8'; `KernelMultiplicativeDense.forward`)."""
  n_modules, d_module = layer._n_modules, layer._d_module  # pylint: disable=protected-access
  d_in = weights[0].shape[1]  # D [S, d] in every storage.
  product = n_tokens * n_modules * d_in * d_module
  scaling = n_tokens * n_modules * d_in
  if is_q8(weights[1]):
    return product, scaling
  return 0, product + scaling


def _module_taps(n_modules, module_kernel):
  """(output module, kernel column) pairs of a convolution along S modules
  with F' columns, zero-padded by ((F'-1)//2, F'//2) (`ModuleConv._convolve`)
  whose input module is a real one: column j of output s reads module
  s + j - (F'-1)//2."""
  low = (module_kernel - 1) // 2
  return sum(max(0, n_modules - abs(j - low)) for j in range(module_kernel))


def _module_conv_macs(layer, weights, n_tokens):
  """`ModuleConv.forward`, predict mode: each output i, at each new
  position, convolves F positions (the F - 1 kept in its state and the new
  one) x F_i modules of M channels with M filters: F * M * M per
  (output module, real input module) pair, `_module_taps` pairs: S * F_i
  less the zero padding past the edge modules. Those zeros are left out,
  as XLA's cost analysis leaves them out, although `KernelModuleConv`'s
  'q8' product multiplies them (they are zeros of its patches,
  `conv_patches`). int8 when the kernels are stored 'q8'
  (`KernelModuleConv._convolve_all`'s test)."""
  s, m, f = layer._n_modules, layer._d_module, layer._kernel_size  # pylint: disable=protected-access
  macs = n_tokens * sum(f * _module_taps(s, fm) * m * m
                        for fm in layer._module_kernel_sizes)  # pylint: disable=protected-access
  if weights[0].dtype == np.int8:
    return macs, 0
  return 0, macs


def _cache_attention_macs(keys, values, size, n_tokens):
  """Each query row's scores q·k and its weighted sum of values over the
  `size` cache positions the step reads (cache [rows, max_len, d_head],
  rows = batch * heads)."""
  rows = keys.shape[0]
  return 0, n_tokens * size * rows * (keys.shape[2] + values.shape[2])


def _leaf_macs(layer, weights, state, position, n_tokens, encoder_len):
  """(int8, float) MACs of a layer without sublayers in one step."""
  if isinstance(layer, SparseFF):
    return _sparse_ff_macs(layer, weights, n_tokens)
  if isinstance(layer, MultiplicativeDense):
    return _multiplicative_macs(layer, weights, n_tokens)
  if isinstance(layer, ModuleConv):
    return _module_conv_macs(layer, weights, n_tokens)
  if isinstance(layer, trax_core.Dense):
    return _dense_macs(layer, weights, n_tokens)
  if isinstance(layer, SRU):
    # x W, W [n, 3n] (`SRU.forward`; float in the fused block too).
    w = weights[0]
    return 0, n_tokens * w.shape[0] * w.shape[1]
  if isinstance(layer, CrossAttention):
    # `CrossAttention.forward`: q against the encoder's keys [B, H, d, L],
    # then the values [B, H, L, d], for every query.
    if len(state) != 2:
      raise ValueError('step_macs needs the state after the first call '
                       '(CrossAttention splits the keys then)')
    keys_t, values = state
    return 0, n_tokens * (_size(keys_t) + _size(values))
  if isinstance(layer, PrefixCausalAttention) and len(state) == 3:
    # `PrefixCausalAttention._attend_cache`: the bucket holding positions
    # 0..position (the in-place kernel: those positions only).
    keys, values, _ = state
    size = bytes_read.positions_read(layer, position + n_tokens, keys)
    return _cache_attention_macs(keys, values, size, n_tokens)
  if isinstance(layer, CausalDotProductAttention) and len(state) == 4:
    # `CausalDotProductAttention._attend_cache`: encoder_len encoder
    # positions precede the decoder's in the cache.
    keys, values, _, _ = state
    size = bytes_read.positions_read(
        layer, encoder_len + position + n_tokens, keys)
    return _cache_attention_macs(keys, values, size, n_tokens)
  if isinstance(layer, _NOT_COUNTED):
    raise NotImplementedError(
        f"step_macs does not count {type(layer).__name__}'s predict step")
  if isinstance(layer, _NO_PRODUCTS) or not jax.tree_util.tree_leaves(
      weights):
    return 0, 0  # Elementwise, a lookup or moving arrays: no products.
  raise NotImplementedError(
      f'step_macs does not know the products of {type(layer).__name__}, a '
      'layer with weights')


def step_macs(model, weights, state, position, n_tokens=1, encoder_len=0):
  """Multiply-adds of one predict step, by layer class, int8 and float.

  Args: those of `bytes_read.step_bytes`, which this follows: the layers
    walked (`bytes_read.walk_step`: a filled tl.Cache is not run, a shared
    layer is counted at each use) and the cache positions an attention
    reads (`bytes_read.positions_read`: its bucket, or the filled positions
    with the in-place kernel) are the same. The `n_tokens` queries of an
    attention attend over all the positions it reads.

  Returns:
    {layer class name: {'int8': MACs, 'float': MACs}} (ints; classes with
    none left out). A MAC is one product (and its sum) of a dot product or
    convolution; MultiplicativeDense's x ⊙ D counts a MAC per product.
    Elementwise work is not counted (see the module docstring).

  Raises:
    NotImplementedError: a leaf layer whose products this does not count
      (LSH, composite slice or Trax's PureAttention in the decoder; a layer
      with weights it does not know).
  """
  out = {}

  def leaf(layer, w, s):
    int8, floats = _leaf_macs(layer, w, s, position, n_tokens, encoder_len)
    if int8 or floats:
      counts = out.setdefault(type(layer).__name__, {'int8': 0, 'float': 0})
      counts['int8'] += int(int8)
      counts['float'] += int(floats)

  bytes_read.walk_step(model, weights, state, leaf)
  return out


def total_macs(counts):
  """{'int8': n, 'float': n} summed over the layer classes of `step_macs`'s
  `counts`."""
  return {kind: sum(c[kind] for c in counts.values())
          for kind in ('int8', 'float')}
