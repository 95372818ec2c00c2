"""Self-attention of a block, its mechanism a switch (§4, Pyramidion §3.2).

The one place that turns an `attention_type` (and the sparsity of §3.2) into
layers; both models build their attention here, each in the layout of its
Trax counterpart so that Trax checkpoints import layer for layer:

  `SelfAttention`             the Terraformer's: causal (x, lengths) -> y,
                              bidirectional (x, mask) -> y, mask [batch, L];
  `TransformerSelfAttention`  the Scaling Transformer's (Trax's
                              `ConfigurableTransformer` layers): causal
                              x -> y, bidirectional (x, mask) -> (y, mask)
                              with `tl.PaddingMask`'s [batch, 1, 1, L] mask;
                              its long-input types are `SelfAttention`'s.

`SelfAttention` is built from three parts:

  projections   dense Q, K, V (+ a dense output layer), or the sparse QKV of
                §3.2 (multiplicative layer + convolution, no output layer);
  core          'full' dot-product attention, 'lsh' (Reformer, `LSHCore`),
                'blockwise' (encoder blocks, `BlockwiseAttentionCore`) or
                'cst' (composite slice attention, `CompositeSliceAttention`,
                which brings its own projections);
  merge         heads back to d_model.

The cores have no weights, so a model pre-trained with full attention on
short sequences can be fine-tuned with LSH attention on long ones from the
same checkpoint. Causal (decoder) attention reads (x, lengths), bidirectional
(encoder) attention (x, mask): see `terraformer.layers.lsh_attention`.
"""
from trax import layers as tl

from terraformer.errors import TerraformerError
from terraformer.layers import composites
from terraformer.layers.blockwise_attention import BlockwiseAttentionCore
from terraformer.layers.composite_slice_attention import check_dense_qkv
from terraformer.layers.composite_slice_attention import CompositeSliceAttention
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.lsh_attention import decode_bucket_count
from terraformer.layers.lsh_attention import DecoderLSHCore
from terraformer.layers.lsh_attention import LSHCore
from terraformer.layers.lsh_attention import PerExamplePrefill
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.sparse_qkv_attention import SparseQKV
from terraformer.layers.sparse_qkv_attention import SparseQKVAttention

ATTENTION_TYPES = ('full', 'lsh', 'blockwise', 'cst')
# The types each builder has a causal (decoder) attention for.
CAUSAL_TYPES = ('full', 'lsh', 'cst')
TRANSFORMER_CAUSAL_TYPES = ('full', 'cst')


def SelfAttention(d_model, n_heads, attention_type='full',
                  attention_sparsity=0, *, attention_kernel_size=3,
                  causal=True, dropout=0.0, lsh_chunk_len=128,
                  lsh_n_hashes=1, lsh_n_buckets=None, predict_mem_len=2048,
                  predict_drop_len=256, lsh_eval_seed=0, mode='train',
                  block_len=512, cst_slice_len=32, cst_extension=3,
                  max_len=2048):
  """Self-attention: causal `(x, lengths) -> y`, bidirectional `(x, mask) -> y`.

  Args:
    d_model: width of x and y.
    n_heads: number of heads with dense projections; sparse QKV has
      `attention_sparsity` heads (one per module, §3.2).
    attention_type: 'full', 'lsh', 'blockwise' (bidirectional only: each
      token attends to its block of `block_len`, Pyramidion §3.2) or 'cst'
      (composite slice attention, `CompositeSliceAttention`: slices of
      `cst_slice_len`, extension α = `cst_extension`; dense Q/K/V shared by
      its local and global parts, so not with `attention_sparsity`).
    attention_sparsity: S > 0: sparse QKV with S modules; 0: dense.
    attention_kernel_size: sparse QKV convolution size F.
    causal: decoder (causal, with the encoder lengths of the module
      docstring) or encoder (bidirectional, padding mask [batch, length] with
      True on tokens).
    dropout: attention dropout.
    lsh_chunk_len: LSH chunk length (divides the sequence length).
    lsh_n_hashes: LSH rounds of hashing.
    lsh_n_buckets: LSH buckets per round; None: 2 * length / chunk_len
      (Trax's), and when decoding (causal, predict) the count of a sequence
      of `predict_mem_len` (`decode_bucket_count`), fixed for the prefill and
      every step.
    predict_mem_len: positions kept by a decoding cache (the encoder length
      plus the target length, to keep them all).
    predict_drop_len: positions LSH drops when its cache is full.
    lsh_eval_seed: LSH hashing key in eval and predict (None: random).
    mode: 'train', 'eval' or 'predict'.
    block_len: 'blockwise' block length.
    cst_slice_len: 'cst' slice length L.
    cst_extension: 'cst' slice extension α (1, 2 or 3).
    max_len: 'cst' longest sequence (rows of its global position table).
  """
  _check_type(attention_type, causal, CAUSAL_TYPES)
  if attention_type == 'cst':
    cst = _CompositeSlice(d_model, n_heads, attention_sparsity,
                          slice_len=cst_slice_len, extension=cst_extension,
                          causal=causal, max_len=max_len, dropout=dropout,
                          mode=mode)
    if causal:                                   # x lengths
      return PerExamplePrefill(cst, mode)
    return cst                                   # x mask
  if attention_sparsity:
    heads = attention_sparsity
    projections = SparseQKV(d_model, attention_sparsity,
                            attention_kernel_size, 3, causal=causal,
                            mode=mode)
    output = []
  else:
    heads = n_heads
    projections = tl.Branch(tl.Dense(d_model), tl.Dense(d_model),
                            tl.Dense(d_model))
    output = tl.Dense(d_model)
  if d_model % heads:
    raise ValueError(f'd_model={d_model} is not a multiple of the number of '
                     f'heads ({heads}).')
  d_head = d_model // heads
  split = tl.SplitIntoHeads(heads)
  if causal and attention_sparsity:              # x lengths
    # The convolution keeps state when decoding.
    projections = [tl.Select([0, 1, 1]),         # x lengths lengths
                   PerExamplePrefill(projections, mode)]  # q k v lengths

  if attention_type == 'lsh':
    if causal and mode == 'predict' and lsh_n_buckets is None:
      lsh_n_buckets = decode_bucket_count(predict_mem_len, lsh_chunk_len)
    lsh = LSHCore(n_heads=heads, d_qk=d_head, d_v=d_head, causal=causal,
                  masked=not causal, chunk_len=lsh_chunk_len,
                  n_chunks_before=1, n_chunks_after=0 if causal else 1,
                  n_hashes=lsh_n_hashes, n_buckets=lsh_n_buckets, mode=mode,
                  predict_mem_len=predict_mem_len,
                  predict_drop_len=predict_drop_len,
                  attention_dropout=dropout, eval_seed=lsh_eval_seed)
    core = [
        tl.Fn('SharedQK', lambda q, k: (q + k) / 2, n_out=1),   # qk v mask|len
        tl.Parallel(split, split),
        DecoderLSHCore(lsh, heads, mode) if causal else lsh,
        tl.MergeHeads(heads),
    ]
  elif attention_type == 'blockwise':
    core = BlockwiseAttentionCore(heads, block_len)   # q k v mask
  elif causal:
    core = [                                     # q k v lengths
        tl.Parallel(split, split, split),
        CausalDotProductAttention(heads, dropout=dropout,
                                  max_len=predict_mem_len, mode=mode),
        tl.MergeHeads(heads),
    ]
  else:
    core = [                                     # q k v mask
        tl.Parallel([], [], [], tl.Fn('AttentionMask',
                                      lambda m: m[:, None, None, :])),
        tl.PureAttention(n_heads=heads, dropout=dropout, mode=mode),
        tl.Select([0], n_in=2),
    ]
  attention = tl.Serial(projections, core, output,
                        name=f'{attention_type.upper()}SelfAttention')
  if causal and attention_sparsity and attention_type == 'full':
    composites.mark(attention, composites.SPARSE_QKV_CAUSAL_ATTENTION)
  return attention


def TransformerSelfAttention(d_model, n_heads, attention_type='full',
                             attention_sparsity=0, *, attention_kernel_size=3,
                             attention_module_kernel_size=3, causal=True,
                             dropout=0.0, max_len=2048, mode='train',
                             block_len=512, cst_slice_len=32, cst_extension=3,
                             lsh_chunk_len=128, lsh_n_hashes=1,
                             lsh_n_buckets=None, lsh_eval_seed=0):
  """The Scaling Transformer's self-attention, in Trax's layouts.

  Causal: x -> y (a decoder; or an encoder that ignores its padding, as
  Trax's sparse encoders do: real tokens never see the padding after them).
  Bidirectional: (x, mask) -> (y, mask), mask `tl.PaddingMask`'s.

    'full', dense    causal: `tl.CausalAttention`'s layers
                     (`tl.ConfigurableAttention`) with `PrefixCausalAttention`
                     as the core, which decodes reading only the filled part
                     of its cache; bidirectional: `tl.Attention`.
    'full', sparse   causal: Trax's `MultiplicativeConvCausalAttention`: S =
                     `attention_sparsity` modules for Q/K/V (Q/K
                     convolutions `attention_kernel_size` x
                     `attention_module_kernel_size`, None: F x F), split into
                     `n_heads` heads, no output layer; bidirectional:
                     `SparseQKVAttention` (S heads).
    'cst'            `CompositeSliceAttention` (causal or not).
    'lsh',           bidirectional only: `SelfAttention`'s, reading the
    'blockwise'      [batch, L] mask (`OnFlatMask`); block i of the encoder
                     passes lsh_eval_seed + i.

  Other arguments as `SelfAttention`'s.
  """
  _check_type(attention_type, causal, TRANSFORMER_CAUSAL_TYPES)
  if attention_type == 'cst' and causal:         # x
    return _CompositeSlice(d_model, n_heads, attention_sparsity,
                           slice_len=cst_slice_len, extension=cst_extension,
                           causal=True, max_len=max_len, dropout=dropout,
                           mode=mode)
  if causal:                                     # x
    # Trax's DotProductCausalAttention, decoding from a prefix of its cache.
    core = PrefixCausalAttention(dropout=dropout, max_inference_length=max_len,
                                 mode=mode)
    if not attention_sparsity:
      return tl.ConfigurableAttention(
          tl.Dense(d_model), tl.Dense(d_model), tl.Dense(d_model),
          tl.Dense(d_model), core, n_heads=n_heads)
    return composites.mark(tl.Serial(
        SparseQKV(d_model, attention_sparsity, attention_kernel_size, 3,
                  causal=True, mode=mode,
                  module_kernel_size=attention_module_kernel_size),
        tl.Parallel(tl.SplitIntoHeads(n_heads), tl.SplitIntoHeads(n_heads),
                    tl.SplitIntoHeads(n_heads)),
        core,
        tl.MergeHeads(n_heads),
    ), composites.SPARSE_QKV_CAUSAL_ATTENTION)
  if attention_type != 'full':                   # x mask
    return OnFlatMask(SelfAttention(
        d_model, n_heads, attention_type, attention_sparsity, causal=False,
        dropout=dropout, mode=mode, block_len=block_len,
        cst_slice_len=cst_slice_len, cst_extension=cst_extension,
        max_len=max_len, lsh_chunk_len=lsh_chunk_len,
        lsh_n_hashes=lsh_n_hashes, lsh_n_buckets=lsh_n_buckets,
        lsh_eval_seed=lsh_eval_seed))
  if attention_sparsity:
    return SparseQKVAttention(d_model, n_modules=attention_sparsity,
                              kernel_size=attention_kernel_size,
                              dropout=dropout, mode=mode)
  return tl.Attention(d_model, n_heads=n_heads, dropout=dropout, mode=mode)


def FlatMask():
  """tl.PaddingMask's [batch, 1, 1, L] -> [batch, L]."""
  return tl.Fn('FlatMask', lambda mask: mask.reshape(mask.shape[0], -1))


def OnFlatMask(attention):
  """(x, mask) -> (attention(x, flat mask), mask): a long-input attention,
  which reads the [batch, L] mask, where the encoder carries PaddingMask's."""
  return tl.Branch([tl.Parallel([], FlatMask()), attention],
                   tl.Select([1], n_in=2))


def _CompositeSlice(d_model, n_heads, attention_sparsity, *, slice_len,
                    extension, causal, max_len, dropout, mode):
  check_dense_qkv(attention_sparsity)
  return CompositeSliceAttention(d_model, n_heads, slice_len, extension,
                                 causal=causal, max_len=max_len,
                                 dropout=dropout, mode=mode)


def _check_type(attention_type, causal, causal_types):
  if attention_type not in ATTENTION_TYPES:
    raise TerraformerError(f'attention_type must be one of {ATTENTION_TYPES}, '
                           f'got {attention_type!r}')
  if causal and attention_type not in causal_types:
    raise TerraformerError(
        f'attention_type={attention_type!r} is an encoder (bidirectional) '
        f'attention here; decoders take one of {causal_types}')
