"""The compositions the fused kernels run, found by the builders' marks.

A builder marks each composition it makes (`terraformer.layers.composites`);
the functions below, one per mark, return a marked layer's parts, checked:
a marked layer whose sublayers are not the composition its mark names raises
`UnknownComposition`, naming the layer and its sublayers. The installer
checks every marked layer of a model so, before it changes any class; the
kernel layers read their parts through the same functions (positions inside
a composition already checked, never to find one).
"""
from trax import layers as tl
from trax.layers import combinators as trax_combinators
from trax.layers import core as trax_core
from trax.layers import normalization as trax_normalization

from terraformer.layers import composites
from terraformer.layers import reversible as rev
from terraformer.layers.low_rank_sru import SRU
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.lsh_attention import PerExamplePrefill
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.sparse_qkv_attention import ModuleConv


class UnknownComposition(ValueError):
  """A layer marked as a composition whose sublayers are not it."""


def _check(ok, layer, composition):
  if not ok:
    subs = ', '.join(s.name for s in layer.sublayers)
    raise UnknownComposition(
        f'{layer.name} is marked {composites.name_of(layer)!r} but is not '
        f'{composition}: its sublayers are [{subs}]')


def _is_serial(layer):
  return isinstance(layer, trax_combinators.Serial)


def _is_fn(layer, name):
  """`layer` is Trax's function layer `name` (tl.SplitIntoHeads and
  tl.MergeHeads are a Serial around their `tl.Fn`)."""
  return layer.name == name or any(s.name == name for s in layer.sublayers)


def layer_norm(layer):
  """The `tl.LayerNorm` that `layer` is, or that a Parallel(LayerNorm,
  no-op) applies to its first input (the Terraformer's, beside the encoder
  lengths); None for other layers."""
  if isinstance(layer, trax_combinators.Parallel):
    subs = layer.sublayers
    if len(subs) != 2 or subs[1].sublayers or subs[1].n_in != 1:
      return None
    layer = subs[0]
  return layer if isinstance(layer, trax_normalization.LayerNorm) else None


def sparse_qkv(layer):
  """(MultiplicativeDense, ModuleConv) of a SPARSE_QKV."""
  subs = layer.sublayers
  _check(_is_serial(layer) and len(subs) == 2
         and isinstance(subs[0], MultiplicativeDense)
         and isinstance(subs[1], ModuleConv),
         layer, 'Serial(MultiplicativeDense, ModuleConv)')
  return tuple(subs)


def sparse_qkv_causal_attention(layer):
  """(index of its sparse QKV, that SPARSE_QKV, whether a PerExamplePrefill
  wraps it, index of the attention over the cache) of a
  SPARSE_QKV_CAUSAL_ATTENTION."""
  subs = layer.sublayers
  i = 1 if subs and subs[0].name.startswith('Select') else 0
  ok = _is_serial(layer) and len(subs) == i + 4
  qkv, wrapped = (subs[i], isinstance(subs[i], PerExamplePrefill)) if ok else (
      None, False)
  if wrapped:
    qkv = qkv.sublayers[0]
  _check(ok and composites.name_of(qkv) == composites.SPARSE_QKV
         and isinstance(subs[i + 1], trax_combinators.Parallel)
         and len(subs[i + 1].sublayers) == 3
         and all(_is_fn(s, 'SplitIntoHeads') for s in subs[i + 1].sublayers)
         and isinstance(subs[i + 2], (PrefixCausalAttention,
                                      CausalDotProductAttention))
         and _is_fn(subs[i + 3], 'MergeHeads'),
         layer, 'Serial([Select, PerExamplePrefill(] sparse QKV [)], '
         'Parallel(SplitIntoHeads x 3), causal attention, MergeHeads)')
  sparse_qkv(qkv)
  return i, qkv, wrapped, i + 2


def sparse_query_cross_attention(layer):
  """(the queries' SPARSE_QKV, the attention) of a
  SPARSE_QUERY_CROSS_ATTENTION."""
  subs = layer.sublayers
  heads = subs[0].sublayers if len(subs) == 2 else ()
  _check(_is_serial(layer) and len(heads) == 2
         and isinstance(subs[0], trax_combinators.Parallel)
         and composites.name_of(heads[0]) == composites.SPARSE_QKV
         and isinstance(heads[1], trax_combinators.Cache)
         and isinstance(subs[1], tl.PureAttention),
         layer, 'Serial(Parallel(sparse QKV, tl.Cache), attention)')
  sparse_qkv(heads[0])
  return heads[0], subs[1]


def norm_branch(layer):
  """(index of its LayerNorm, index of f) of a NORM_BRANCH."""
  subs = layer.sublayers
  i = 1 if subs and subs[0].name == 'Select[0]' and subs[0].n_out == 1 else 0
  _check(_is_serial(layer) and len(subs) == i + 3
         and layer_norm(subs[i]) is not None
         and isinstance(subs[i + 2], tl.Dropout),
         layer, 'Serial([Select([0]),] LayerNorm, f, Dropout)')
  return i, i + 1


def cross_attention_branch(layer):
  """(the LayerNorm, the cross-attention) of a CROSS_ATTENTION_BRANCH."""
  subs = layer.sublayers
  _check(_is_serial(layer) and len(subs) == 4
         and isinstance(subs[0], trax_normalization.LayerNorm)
         and subs[1].name == 'Select[0,2,1,2]'
         and isinstance(subs[3], tl.Dropout),
         layer, 'Serial(LayerNorm, Select([0, 2, 1, 2]), cross-attention, '
         'Dropout)')
  return subs[0], subs[2]


def sru_feed_forward(layer):
  """(its feed-forward NORM_BRANCH, the SRU path's LayerNorm, Dense(d_sru),
  SRU, Dense(d_model)) of an SRU_FEED_FORWARD."""
  subs = layer.sublayers
  ok = (_is_serial(layer) and len(subs) == 2 and subs[1].name == 'Add'
        and len(subs[0].sublayers) == 2
        and isinstance(subs[0].sublayers[1], trax_combinators.Parallel))
  branches = subs[0].sublayers[1].sublayers if ok else ()
  path = branches[1].sublayers if len(branches) == 2 else ()
  low_rank = (path[1].sublayers[0].sublayers
              if len(path) == 2 and isinstance(path[1], PerExamplePrefill)
              else ())
  _check(len(branches) == 2
         and composites.name_of(branches[0]) == composites.NORM_BRANCH
         and layer_norm(path[0]) is not None and len(low_rank) == 3
         and isinstance(low_rank[0], trax_core.Dense)
         and isinstance(low_rank[1], SRU)
         and isinstance(low_rank[2], trax_core.Dense),
         layer, 'Serial(Branch(norm branch, Serial(LayerNorm, '
         'PerExamplePrefill(Dense, SRU, Dense))), Add)')
  norm_branch(branches[0])
  return (branches[0], layer_norm(path[0])) + tuple(low_rank)


def residual(layer):
  """The branch f of a RESIDUAL, tl.Residual(f): Serial(Branch(Select,
  Parallel(no-op, f)), Add)."""
  subs = layer.sublayers
  parallel = (subs[0].sublayers[1]
              if len(subs) == 2 and len(subs[0].sublayers) == 2 else None)
  _check(_is_serial(layer) and parallel is not None
         and subs[0].name == 'Branch' and subs[1].name == 'Add'
         and isinstance(parallel, trax_combinators.Parallel)
         and len(parallel.sublayers) == 2
         and not parallel.sublayers[0].sublayers
         and parallel.sublayers[0].n_in == 1,
         layer, 'tl.Residual(f)')
  return parallel.sublayers[1]


# What a Terraformer decoder block's half-residuals compute, in order.
DECODER_BLOCK = (composites.NORM_BRANCH, composites.NORM_BRANCH,
                 (composites.SRU_FEED_FORWARD, composites.NORM_BRANCH))


def terraformer_decoder(layer):
  """The blocks of a TERRAFORMER_DECODER, six layers each: the
  half-residuals of two attentions' NORM_BRANCHes and of the feed-forward
  (its SRU_FEED_FORWARD, or a NORM_BRANCH without an SRU), each then a
  ReversibleSwap. None of them in a decoder of no blocks (the model a
  benchmark times for its per-block figures)."""
  subs = layer.sublayers
  blocks = [subs[i:i + 6] for i in range(0, len(subs), 6)]
  _check(isinstance(layer, rev.ReversibleSerial) and len(subs) % 6 == 0
         and all(isinstance(h, rev.HalfResidual)
                 and composites.name_of(h.sublayers[0]) in (
                     kinds if isinstance(kinds, tuple) else (kinds,))
                 and isinstance(w, tl.ReversibleSelect)
                 and w.name == 'ReversibleSwap'
                 for block in blocks
                 for h, w, kinds in zip(block[0::2], block[1::2],
                                        DECODER_BLOCK)),
         layer, 'ReversibleSerial of decoder blocks (half-residuals of two '
         'attention branches and a feed-forward branch, each then a swap)')
  return blocks


# The check of each mark.
PARTS = {
    composites.SPARSE_QKV: sparse_qkv,
    composites.SPARSE_QKV_CAUSAL_ATTENTION: sparse_qkv_causal_attention,
    composites.SPARSE_QUERY_CROSS_ATTENTION: sparse_query_cross_attention,
    composites.NORM_BRANCH: norm_branch,
    composites.CROSS_ATTENTION_BRANCH: cross_attention_branch,
    composites.SRU_FEED_FORWARD: sru_feed_forward,
    composites.RESIDUAL: residual,
    composites.TERRAFORMER_DECODER: terraformer_decoder,
}


def parts(layer):
  """The checked parts of a marked layer (its mark's function above);
  None for an unmarked layer."""
  name = composites.name_of(layer)
  return None if name is None else PARTS[name](layer)
