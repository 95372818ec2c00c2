"""Makes a built predict-mode model's layers run the decode kernels.

`install(model, use_ffi)` turns the decoding copies of the layer kinds that
`layers` and `block_layers` list into their kernel-backed subclasses (their
weights, names and every other behaviour stay the same; only the
predict-mode forward changes); the gin switches below leave some out.
Training never sees these classes: only predict-mode models are installed.
"""
import gin
from trax.layers import combinators as trax_combinators
from trax.layers import core as trax_core

from terraformer.kernels.block_layers import KernelNormSerial
from terraformer.kernels.block_layers import KernelReversibleSerial
from terraformer.kernels.block_layers import KernelScalingBlocks
from terraformer.kernels.block_layers import norm_block_parts
from terraformer.kernels.block_layers import scaling_block_starts
from terraformer.kernels.layers import is_sparse_qkv
from terraformer.kernels.layers import is_sparse_qkv_attention
from terraformer.kernels.layers import KernelCausalDotProductAttention
from terraformer.kernels.layers import KernelDense
from terraformer.kernels.layers import KernelMixin
from terraformer.kernels.layers import KernelModuleConv
from terraformer.kernels.layers import KernelMultiplicativeDense
from terraformer.kernels.layers import KernelPrefixCausalAttention
from terraformer.kernels.layers import KernelSparseFF
from terraformer.kernels.layers import KernelSparseQKV
from terraformer.kernels.layers import KernelSparseQKVAttention
from terraformer.layers import reversible as rev
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_qkv_attention import ModuleConv


@gin.configurable(module='terraformer')
def cache_attention_kernel(enabled=True):
  """Whether `install` gives predict-mode causal attention (sparse QKV's and
  dense `PrefixCausalAttention`, the Terraformer's
  `CausalDotProductAttention`) the `tf_cache_attention` kernel; False keeps
  their bucketed XLA attention (a copy of the cache bucket per step)."""
  return enabled


@gin.configurable(module='terraformer')
def terraformer_block_kernel(enabled=True):
  """Whether `install` makes a Terraformer decoder block's 'q8' decoding
  step one `tf_terraformer_block` call (`KernelReversibleSerial`); False
  keeps its parts' own calls (two `tf_sparse_qkv_attention`, `tf_sparse_ff`,
  the SRU's two `tf_q8_matmul`) and XLA's sums, swaps and SRU cell: the
  same step within float rounding, call by call in a profile."""
  return enabled


@gin.configurable(module='terraformer')
def scaling_block_kernel(enabled=True):
  """Whether `install` makes a Scaling Transformer decoder block's 'q8'
  decoding step one `tf_scaling_block` call (`KernelScalingBlocks`); False
  keeps its parts' own calls (`tf_sparse_qkv_attention`, `tf_sparse_ff`,
  the cross-attention queries' two `tf_q8_matmul`) and XLA's residual sums
  and cross-attention: the same step within float rounding."""
  return enabled


_KERNEL_CLASSES = {MultiplicativeDense: KernelMultiplicativeDense,
                   trax_core.Dense: KernelDense}
_PREDICT_KERNEL_CLASSES = {SparseFF: KernelSparseFF,
                           ModuleConv: KernelModuleConv}
_ATTENTION_KERNEL_CLASSES = {
    PrefixCausalAttention: KernelPrefixCausalAttention,
    CausalDotProductAttention: KernelCausalDotProductAttention}


def _kernel_class(layer, attention, block=True):
  if isinstance(layer, KernelMixin):
    return type(layer)
  if is_sparse_qkv(layer):
    return KernelSparseQKV
  if attention and is_sparse_qkv_attention(layer):
    return KernelSparseQKVAttention
  if norm_block_parts(layer) is not None:
    return KernelNormSerial
  if block and type(layer) is rev.ReversibleSerial and layer.sublayers:  # pylint: disable=unidiomatic-typecheck
    return KernelReversibleSerial
  if getattr(layer, '_mode', None) == 'predict':
    if type(layer) in _PREDICT_KERNEL_CLASSES:
      return _PREDICT_KERNEL_CLASSES[type(layer)]
    if attention and type(layer) in _ATTENTION_KERNEL_CLASSES:
      return _ATTENTION_KERNEL_CLASSES[type(layer)]
  return _KERNEL_CLASSES.get(type(layer))


def install(model, use_ffi=True, attention=None, block=None):
  """Makes `model`'s kernel-capable layers kernel-backed; returns how many.

  Changes the layers' classes in place (the model must be a predict-mode
  model used for decoding only). `use_ffi=False` keeps XLA's code (the
  classes still read bf16/int8 storage). `attention` (default: the gin
  switch `cache_attention_kernel`) includes the predict-mode causal
  attention layers; `block` (default: the gin switches
  `terraformer_block_kernel` and `scaling_block_kernel`) the reversible
  stacks and the Serials holding Scaling Transformer decoder blocks, whose
  blocks then run as one call each.
  """
  count = 0
  if attention is None:
    attention = cache_attention_kernel()
  terraformer_blocks = terraformer_block_kernel() if block is None else block
  scaling_blocks = scaling_block_kernel() if block is None else block

  def walk(layer):
    nonlocal count
    cls = _kernel_class(layer, attention, terraformer_blocks)
    if cls is not None:
      layer.__class__ = cls
      layer._tf_use_ffi = use_ffi  # pylint: disable=protected-access
      count += 1
    for sub in layer.sublayers:
      walk(sub)
    # After its sublayers: the blocks are found by their kernel classes.
    if (scaling_blocks and type(layer) is trax_combinators.Serial  # pylint: disable=unidiomatic-typecheck
        and scaling_block_starts(layer.sublayers)):
      layer.__class__ = KernelScalingBlocks
      layer._tf_use_ffi = use_ffi  # pylint: disable=protected-access
      count += 1

  walk(model)
  return count
