"""Bytes of weights and caches one decoding step reads (the speed bound).

An unbatched decoding step is memory-bound: it reads every weight it touches
once and does little arithmetic per byte. `step_bytes` counts those bytes
per layer class, from the model's predict-mode structure, its weights and
its state (arrays or `jax.ShapeDtypeStruct`s): a sparse layer counts only the
rows it selects, an attention cache only the bucket the step reads (its
filled positions with the `tf_cache_attention` kernel). Divided
by a measured GEMV bandwidth (`decode_speed.gemv_bandwidth`) they give the
lower bound of a step's time that `terraformer-bench` prints beside it.
`walk_step` is the walk over the layers a step runs that this and
`step_macs` (the multiply-adds of the same step) share.
"""
import collections

import jax
import numpy as np
from trax import layers as tl
from trax.layers import attention as trax_attention
from trax.layers import combinators as trax_combinators
from trax.layers import core as trax_core

from terraformer.kernels.layers import is_q8
from terraformer.layers.cross_attention import CrossAttention
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.ops import bucket_for
from terraformer.layers.sparse_ff import SparseFF


def nbytes(tree):
  """Bytes of the arrays (or shapes) of `tree`."""
  return sum(int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
             for leaf in jax.tree_util.tree_leaves(tree))


def _row_bytes(array, n_rows):
  """Bytes of `n_rows` slices array[i] (rows of the leading axis)."""
  return n_rows * int(np.prod(array.shape[1:], dtype=np.int64)) * (
      array.dtype.itemsize)


def positions_read(layer, filled, keys):
  """Cache positions a step reads with `filled` positions written: the
  smallest bucket holding them, or just them when the step attends with
  the in-place kernel (`kernels.layers.KernelPrefixCausalAttention`)."""
  in_place = getattr(layer, 'reads_cache_in_place', None)
  if in_place is not None and in_place() and keys.dtype == np.float32:
    return min(filled, keys.shape[1])
  return bucket_for(filled, keys.shape[1], min_bucket=layer.buckets[0])


def _leaf_layer_bytes(layer, weights, state, position, n_tokens,
                      encoder_len=0):
  """Bytes one step reads from a layer without sublayers.

  Default: all its weights and all its state (caches). Layers known to read
  less say so here; the code they describe is their predict-mode forward.
  """
  if isinstance(layer, SparseFF):
    # Controller (C1, C2, c), b2; one row of W1ᵀ and W2 per block per token
    # (SparseFF._forward_selected_rows).
    c1, c2, c, w1t, w2, b2, *rest = weights
    rows = n_tokens * layer.n_blocks
    # 'q8' storage (terraformer/kernels): C2 packed, its scales last, all
    # read; int8 and 'q8': one scale per selected row of W1ᵀ and W2 too.
    c2_scale = (rest.pop(),) if is_q8(c2) else ()
    scales = sum(_row_bytes(s, rows) for s in rest)
    return (nbytes((c1, c2, c, b2) + c2_scale) + _row_bytes(w1t, rows)
            + _row_bytes(w2, rows) + scales)
  if isinstance(layer, CrossAttention):
    # Its state is the encoder's keys and values split into heads: the
    # bytes of the tl.Cache outputs it replaces, counted there.
    return 0
  if isinstance(layer, trax_core.Dropout) and layer._mode != 'train':  # pylint: disable=protected-access
    return 0  # Its state (the rate) is only read in train mode.
  if isinstance(layer, trax_core.Embedding):
    return _row_bytes(weights, n_tokens)
  if isinstance(layer, trax_attention.PositionalEncoding):
    table = weights[0] if isinstance(weights, (tuple, list)) else weights
    return _row_bytes(table.reshape((-1, table.shape[-1])), n_tokens) + (
        nbytes(state))
  if isinstance(layer, PrefixCausalAttention) and len(state) == 3:
    # Keys and values [batch * heads, max_len, d_head]: the step reads the
    # smallest bucket holding positions 0..position.
    keys, values, index = state
    size = positions_read(layer, position + n_tokens, keys)
    per_position = lambda a: nbytes(a) // a.shape[1]
    return size * (per_position(keys) + per_position(values)) + nbytes(index)
  if isinstance(layer, CausalDotProductAttention) and len(state) == 4:
    # The Terraformer's decoder cache [batch * heads, max_len, ...] holds the
    # encoder_len encoder positions, then the decoder's: the step reads the
    # keys, values and validity of the smallest bucket holding them all.
    keys, values, valid, index = state
    size = positions_read(layer, encoder_len + position + n_tokens, keys)
    per_position = lambda a: nbytes(a) // a.shape[1]
    return size * sum(per_position(a) for a in (keys, values, valid)) + (
        nbytes(index))
  return nbytes(weights) + nbytes(state)


def walk_step(model, weights, state, leaf, cached=None):
  """Walks the layers one predict step of `model` runs: the one traversal
  of `step_bytes` and `step_macs.step_macs`.

  Calls `leaf(layer, weights, state)` at each layer without sublayers, with
  its weights and state (`()` where its parent's do not split over its
  sublayers), and `cached(layer, outputs)` at each `tl.Cache` already
  filled (after the first call the step reads its cached outputs and does
  not run its sublayer; an empty one is walked into). A shared layer
  (weights GET_WEIGHTS_FROM_CACHE) is walked with its own weights at each
  use: each use runs it.
  """
  if isinstance(weights, dict) and weights == tl.GET_WEIGHTS_FROM_CACHE:
    weights = model.weights  # A shared layer, run again at each use.
  if isinstance(model, trax_combinators.Cache):
    outputs, sub_state = state
    if not (isinstance(outputs, tuple) and not outputs):
      if cached is not None:
        cached(model, outputs)
      return
    walk_step(model.sublayer, weights[0], sub_state, leaf, cached)
    return
  subs = model.sublayers
  if subs:
    for i, sub in enumerate(subs):
      sub_w = weights[i] if len(weights) == len(subs) else ()
      sub_s = state[i] if (isinstance(state, (tuple, list))
                           and len(state) == len(subs)) else ()
      walk_step(sub, sub_w, sub_s, leaf, cached)
    return
  leaf(model, weights, state)


def step_bytes(model, weights, state, position, n_tokens=1, encoder_len=0):
  """Bytes of weights and caches one predict step reads, by layer class.

  Args:
    model: predict-mode Trax layer.
    weights: its weights (arrays or ShapeDtypeStructs).
    state: its state (or shapes) at the step, after the first call (the
      encoder then is cached and not run again).
    position: decoder position of the token the step decodes (0 first).
    n_tokens: tokens per step (batch size; 1 unbatched).
    encoder_len: encoder positions ahead of the decoder's in a decoder cache
      that holds both (the Terraformer's `CausalDotProductAttention`: its
      first call primes the cache with the encoder_len encoder positions, so
      decoder position p sits at cache index encoder_len + p).

  Returns:
    {layer class name: bytes}; activations (vectors of d_model floats) are
    not counted.
  """
  out = collections.Counter()

  def leaf(layer, w, s):
    n = _leaf_layer_bytes(layer, w, s, position, n_tokens, encoder_len)
    if n:
      out[type(layer).__name__] += n

  def cached(layer, outputs):
    del layer
    # After the first call: the cached outputs are read, the layer not run.
    out['Cache'] += nbytes(outputs)

  walk_step(model, weights, state, leaf, cached)
  return dict(out)
