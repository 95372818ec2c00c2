"""Names the builders give the compositions that other code must find.

A builder marks a layer it composes with one of the names below
(`mark(layer, NORM_BRANCH)`); the decode kernels' installer
(`terraformer.kernels.install`) finds the compositions a fused kernel runs
by these marks and the layers' types, never by the shape of a built tree,
and refuses a marked layer whose sublayers are not the composition its mark
names. A mark is an attribute: the layer's Trax name, its weights, state
and checkpoint paths stay as they are.
"""

# Sparse QKV (§3.2): Serial(MultiplicativeDense, ModuleConv)
# (`sparse_qkv_attention.SparseQKV`).
SPARSE_QKV = 'sparse_qkv'
# A decoder's causal self-attention with sparse QKV: Serial([Select,
# PerExamplePrefill(] SparseQKV [)], Parallel(SplitIntoHeads x 3), causal
# attention over a cache, MergeHeads) (`attention.SelfAttention`,
# `attention.TransformerSelfAttention`, `SparseQKVCausalAttention`).
SPARSE_QKV_CAUSAL_ATTENTION = 'sparse_qkv_causal_attention'
# An encoder-decoder attention with sparse queries: Serial(Parallel(
# SparseQKV (queries), the encoder's keys and values under tl.Cache),
# CrossAttention) (`models.common.Sublayers.cross_attention`).
SPARSE_QUERY_CROSS_ATTENTION = 'sparse_query_cross_attention'
# A pre-norm residual branch: Serial([Select([0]),] LayerNorm (or
# Parallel(LayerNorm, []) beside the lengths), f, Dropout)
# (`models.common.Sublayers`).
NORM_BRANCH = 'norm_branch'
# A cross-attention's residual branch: Serial(LayerNorm, Select([0, 2, 1,
# 2]), the cross-attention, Dropout) (`models.scaling_transformer`).
CROSS_ATTENTION_BRANCH = 'cross_attention_branch'
# The Terraformer decoder's feed-forward branch with its SRU (§4.3):
# Serial(Branch(a norm branch of the feed-forward, Serial(Parallel(
# LayerNorm, []), PerExamplePrefill(LowRankSRU))), Add).
SRU_FEED_FORWARD = 'sru_feed_forward'
# tl.Residual(branch): Serial(Branch(Select, Parallel([], branch)), Add)
# (`models.common.Sublayers.residual`, the Scaling Transformer's layout).
RESIDUAL = 'residual'
# The Terraformer decoder's reversible stack: its blocks
# (`models.terraformer._DecoderBlock`), six layers each.
TERRAFORMER_DECODER = 'terraformer_decoder'

NAMES = (SPARSE_QKV, SPARSE_QKV_CAUSAL_ATTENTION, SPARSE_QUERY_CROSS_ATTENTION,
         NORM_BRANCH, CROSS_ATTENTION_BRANCH, SRU_FEED_FORWARD, RESIDUAL,
         TERRAFORMER_DECODER)

_ATTRIBUTE = '_terraformer_composite'


def mark(layer, name):
  """`layer`, marked as the composition `name` (one of NAMES)."""
  if name not in NAMES:
    raise ValueError(f'not a composite name: {name!r}')
  setattr(layer, _ATTRIBUTE, name)
  return layer


def name_of(layer):
  """The composition `layer` is marked as, or None."""
  return getattr(layer, _ATTRIBUTE, None)
