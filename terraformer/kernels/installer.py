"""Makes a built predict-mode model's layers run the decode kernels.

`install(model, use_ffi)` turns the decoding copies of the layer kinds that
`layers` and `block_layers` list into their kernel-backed subclasses (their
weights, names and every other behaviour stay the same; only the
predict-mode forward changes); the gin switches below leave some out.
Single layers are found by their type; compositions (sparse QKV, its
attention, a block's residual branches, the Terraformer's decoder stack,
the residuals of a Scaling Transformer's blocks) by the marks their
builders set (`terraformer.layers.composites`), each marked layer checked
first: one whose sublayers are not the composition its mark names stops
the install with `compositions.UnknownComposition`, naming it.
Training never sees these classes: only predict-mode models are installed.
"""
import gin
from trax.layers import combinators as trax_combinators
from trax.layers import core as trax_core

from terraformer.kernels import compositions
from terraformer.kernels.block_layers import KernelNormSerial
from terraformer.kernels.block_layers import KernelReversibleSerial
from terraformer.kernels.block_layers import KernelScalingBlocks
from terraformer.kernels.block_layers import runs_as_one_call
from terraformer.kernels.block_layers import scaling_block_starts
from terraformer.kernels.layers import KernelCausalDotProductAttention
from terraformer.kernels.layers import KernelDense
from terraformer.kernels.layers import KernelMixin
from terraformer.kernels.layers import KernelModuleConv
from terraformer.kernels.layers import KernelMultiplicativeDense
from terraformer.kernels.layers import KernelPrefixCausalAttention
from terraformer.kernels.layers import KernelSparseFF
from terraformer.kernels.layers import KernelSparseQKV
from terraformer.kernels.layers import KernelSparseQKVAttention
from terraformer.layers import composites
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


def _predict(layer):
  return getattr(layer, '_mode', None) == 'predict'


def _composite_class(layer, attention, block):
  """The kernel class of a marked layer (None: it stays), its composition
  checked (`compositions.parts`)."""
  name = composites.name_of(layer)
  parts = compositions.parts(layer)
  if name == composites.SPARSE_QKV:
    return KernelSparseQKV if _predict(parts[1]) else None
  if name == composites.SPARSE_QKV_CAUSAL_ATTENTION:
    fits = attention and _predict(layer.sublayers[parts[3]])
    return KernelSparseQKVAttention if fits else None
  if name == composites.NORM_BRANCH:
    return KernelNormSerial if runs_as_one_call(layer) else None
  if name == composites.TERRAFORMER_DECODER:
    return KernelReversibleSerial if block and parts else None
  return None  # Read by the classes above (block_layers).


def _kernel_class(layer, attention, block=True):
  if isinstance(layer, KernelMixin):
    return type(layer)
  if composites.name_of(layer) is not None:
    return _composite_class(layer, attention, block)
  if _predict(layer):
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
  blocks then run as one call each. Every marked composition is checked
  first (`check`): an unknown one changes nothing.
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
    # After its sublayers: the blocks are found by their marked residuals'
    # kernel classes.
    if (scaling_blocks and type(layer) is trax_combinators.Serial  # pylint: disable=unidiomatic-typecheck
        and scaling_block_starts(layer.sublayers)):
      layer.__class__ = KernelScalingBlocks
      layer._tf_use_ffi = use_ffi  # pylint: disable=protected-access
      count += 1

  check(model)
  walk(model)
  return count


def check(model):
  """Checks every marked layer of `model` (`compositions.parts`): raises
  `compositions.UnknownComposition` for one that is not its composition."""
  compositions.parts(model)
  for sub in model.sublayers:
    check(sub)
