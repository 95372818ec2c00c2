"""Scaling Transformer (§3): a Transformer whose every dense layer can be sparse.

Switches (all 0 = the dense baseline):
  ff_sparsity N          SparseFF, one active unit per block of N (§3.1);
  attention_sparsity S   Sparse QKV attention: a multiplicative layer with S
                         modules, then convolutions of `attention_kernel_size`
                         positions (§3.2);
  loss_sparsity S        SparseLogits with S modules (§3.3).

The models compute the same function as Trax 1.4.1's
`trax.models.research.configurable_transformer.ConfigurableTransformerLM` and
`ConfigurableTransformer` (which produced the paper's numbers), layer for
layer and weight for weight, so that `terraformer.trax_bridge.checkpoint_import` loads their
checkpoints. Trax options and ours:

  Trax (ConfigurableTransformer(LM) / gin)     ours
  ff_sparsity=(N, d_lowrank[, T, quant_prob])  ff_sparsity=N, d_lowrank,
    (an int N means d_lowrank = d_ff // N)       ff_temperature, ff_quant_prob
  attention_type=MultiplicativeConvCausalAttention,
    .sparsity=S, .length_kernel_size=F          attention_sparsity=S,
                                                 attention_kernel_size=F
  encoder_attention_type=MultiplicativeConv...  encoder_attention_sparsity
    (causal attention in the encoder)            (None: = attention_sparsity),
                                                 sparse_encoder_attention=
                                                 'causal'
  encoder_decoder_attention_type=(same)         attention_sparsity
  enc_dec_attention_sparsity=S                  cross_attention_sparsity (None:
                                                 = attention_sparsity)
  loss_sparsity=S, loss_sparsity_type='mult'    loss_sparsity=S
  dropout, max_len, n_heads, d_ff, ...          same names
  ff_dropout (default 0.1)                      = dropout
  pos_type=None (learned, sinusoidal init)      the same, always

Not mapped (no counterpart here): Trax's ff_use_sru, ff_chunk_size (a memory
option, same function), ff_sparsity_type 'Block'/'Switch', loss_sparsity_type
other than 'mult', loss_d_lowrank, loss_sparsity_prob, attention_chunk_size,
pos_type other than None, dropout_shared_axes, ff_activation other than Relu,
MultiplicativeConvCausalAttention's share_qk / output_layer_type /
v_concat_type other than their defaults, and tuple enc_dec_attention_sparsity.
Our alternatives with no Trax counterpart: sparse_encoder_attention=
'bidirectional' (a padding-masked, bidirectional sparse encoder),
encoder_attention_type 'blockwise', 'cst' or 'lsh' (long inputs),
attention_module_kernel_size other than 3, and local_conv_len > 0 (a
causal convolution sublayer before each self-attention, `LocalConv`).
"""
import gin
from trax import layers as tl

from terraformer.errors import TerraformerError
from terraformer.layers import SparseFF
from terraformer.layers import SparseQKV
from terraformer.layers import SparseQKVAttention
from terraformer.layers.attention import SelfAttention
from terraformer.layers.blockwise_attention import BlockwiseSelfAttention
from terraformer.layers.composite_slice_attention import check_dense_qkv
from terraformer.layers.local_conv import LocalConv
from terraformer.layers.composite_slice_attention import CompositeSliceAttention
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.successive_halving_topk import RepresentationPooling
from terraformer.layers.successive_halving_topk import pooling_schedule
from terraformer.models.common import CachedInPredict
from terraformer.models.common import Embedder
from terraformer.models.common import Logits

ENCODER_ATTENTIONS = ('causal', 'bidirectional')
LM_ATTENTION_TYPES = ('full', 'cst')
ENCODER_ATTENTION_TYPES = ('full', 'blockwise', 'cst', 'lsh')


@gin.configurable(module='terraformer')
def ScalingTransformerLM(vocab_size=32000, d_model=512, d_ff=2048, n_layers=6,
                         n_heads=8, dropout=0.1, max_len=2048, ff_sparsity=0,
                         d_lowrank=64, ff_temperature=0.1, ff_quant_prob=0.3,
                         attention_sparsity=0, attention_kernel_size=3,
                         attention_module_kernel_size=3, loss_sparsity=0,
                         attention_type='full', cst_slice_len=32,
                         cst_extension=3, local_conv_len=0, mode='train'):
  """Decoder-only Scaling Transformer: tokens [batch, len] -> logits.

  Trax's `ConfigurableTransformerLM`: ShiftRight, embedding, dropout,
  positional encoding, n_layers x (attention, feed-forward) pre-norm residual
  blocks, LayerNorm, Dense (or the sparse loss layer).
  `attention_module_kernel_size`: width of the Q/K convolutions across
  modules (Trax: 3; None: `attention_kernel_size`, an F x F kernel).
  `attention_type`: 'full' or 'cst' (causal composite slice attention of
  the Composite Slice Transformer, slices of `cst_slice_len`, extension
  α = `cst_extension`; its Q/K/V are dense, so not with attention_sparsity).
  `local_conv_len`: 0 (the paper's model) or F > 0: a `LocalConv` over F
  positions as its own residual sublayer before each attention (not in the
  papers; see terraformer/layers/local_conv.py).
  """
  _check_choice('attention_type', attention_type, LM_ATTENTION_TYPES)
  sublayers = _Sublayers(d_model, d_ff, n_heads, dropout, max_len, ff_sparsity,
                         d_lowrank, ff_temperature, ff_quant_prob,
                         attention_sparsity, attention_kernel_size,
                         attention_module_kernel_size, mode,
                         attention_type=attention_type,
                         cst=(cst_slice_len, cst_extension),
                         local_conv_len=local_conv_len)
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      _Embedder(vocab_size, d_model, dropout, max_len, mode),
      [_DecoderOnlyBlock(sublayers) for _ in range(n_layers)],
      tl.LayerNorm(),
      Logits(vocab_size, loss_sparsity),
  )


@gin.configurable(module='terraformer')
def ScalingTransformer(input_vocab_size=32000, output_vocab_size=None,
                       d_model=512, d_ff=2048, n_encoder_layers=6,
                       n_decoder_layers=6, n_heads=8, dropout=0.1,
                       max_len=2048, ff_sparsity=0, d_lowrank=64,
                       ff_temperature=0.1, ff_quant_prob=0.3,
                       attention_sparsity=0, attention_kernel_size=3,
                       attention_module_kernel_size=3,
                       encoder_attention_sparsity=None,
                       sparse_encoder_attention='causal',
                       cross_attention_sparsity=None, loss_sparsity=0,
                       encoder_attention_type='full', block_len=512,
                       cst_slice_len=32, cst_extension=3,
                       lsh_chunk_len=128, lsh_n_hashes=1, lsh_n_buckets=None,
                       lsh_eval_seed=0, encoder_pooling=None,
                       pooling_peaked=True, pooling_sort=True,
                       local_conv_len=0, mode='train'):
  """Encoder-decoder Scaling Transformer (the paper's T5-like 800M model).

  (input tokens, target tokens) -> (logits, target tokens). In predict mode
  the encoder runs once, on the first call, and is cached; the decoder
  decodes token by token. Trax's `ConfigurableTransformer`; without
  `output_vocab_size` the decoder shares the encoder's embedding matrix.

  Sparse QKV attention (§3.2) per place:
    decoder self-attention   `attention_sparsity` (Trax's
                             encoder_decoder_attention_type=
                             MultiplicativeConvCausalAttention);
    encoder self-attention   `encoder_attention_sparsity` (None: the same).
                             `sparse_encoder_attention='causal'` (default) is
                             what Trax computes with encoder_attention_type=
                             MultiplicativeConvCausalAttention: causal attention
                             (it ignores the padding mask; real tokens never
                             see the padding after them). 'bidirectional' is
                             our alternative with no Trax counterpart: masked
                             bidirectional attention over sparse Q, K, V.
    cross-attention          `cross_attention_sparsity` (None: the same; Trax's
                             enc_dec_attention_sparsity): sparse queries
                             (multiplicative layer + 3 x 3 causal convolution)
                             and no output layer; keys and values stay dense
                             (computed once per input, cached in predict).

  Long inputs (dense encoder attention only):
    `encoder_attention_type`  'full', 'blockwise' (blocks of `block_len`,
                              Pyramidion §3.2), 'cst' (bidirectional
                              composite slice attention, L = cst_slice_len,
                              α = cst_extension) or 'lsh' (the Terraformer's
                              bidirectional LSH attention, Reformer; chunks
                              of `lsh_chunk_len`, which divides the input
                              length, each with its neighbours;
                              `lsh_n_hashes` rounds of `lsh_n_buckets`
                              buckets, None: 2 * length / chunk; block i
                              hashes with key `lsh_eval_seed` + i in eval
                              and predict, None: random);
    `encoder_pooling`         {layer: k}: after encoder block `layer`
                              (0-based) a linear scorer and the successive
                              halving top-k operator pool the sequence to k
                              (Transpooler: the last layer; Pyramidion: more
                              entries); the cross-attention reads the last k
                              (`RepresentationPooling`; `pooling_peaked`,
                              `pooling_sort`). Inputs of at most k pass.
  """
  _check_choice('encoder_attention_type', encoder_attention_type,
                ENCODER_ATTENTION_TYPES)
  if sparse_encoder_attention not in ENCODER_ATTENTIONS:
    raise ValueError(f'sparse_encoder_attention must be one of '
                     f'{ENCODER_ATTENTIONS}, got {sparse_encoder_attention!r}')
  pooling = dict(pooling_schedule(encoder_pooling, n_encoder_layers))
  if encoder_attention_sparsity is None:
    encoder_attention_sparsity = attention_sparsity
  if cross_attention_sparsity is None:
    cross_attention_sparsity = attention_sparsity
  # As Trax: without an output vocabulary, the decoder reuses the encoder's
  # embedding matrix (stored once).
  shared_embedding = (tl.Embedding(input_vocab_size, d_model)
                      if output_vocab_size is None else None)
  output_vocab_size = output_vocab_size or input_vocab_size
  encoder_mode = 'eval' if mode == 'predict' else mode
  ff = (ff_sparsity, d_lowrank, ff_temperature, ff_quant_prob)
  attention = (attention_kernel_size, attention_module_kernel_size)
  if encoder_attention_type != 'full' and encoder_attention_sparsity:
    raise TerraformerError(
        f"encoder_attention_type={encoder_attention_type!r} takes dense Q/K/V;"
        f" set encoder_attention_sparsity=0 (sparse QKV encoders: 'full')")
  encoder_sublayers = _Sublayers(d_model, d_ff, n_heads, dropout, max_len,
                                 *ff, encoder_attention_sparsity, *attention,
                                 encoder_mode,
                                 attention_type=encoder_attention_type,
                                 cst=(cst_slice_len, cst_extension),
                                 block_len=block_len,
                                 local_conv_len=local_conv_len,
                                 lsh=(lsh_chunk_len, lsh_n_hashes,
                                      lsh_n_buckets, lsh_eval_seed))
  decoder_sublayers = _Sublayers(d_model, d_ff, n_heads, dropout, max_len,
                                 *ff, attention_sparsity, *attention, mode,
                                 cross_attention_sparsity,
                                 local_conv_len=local_conv_len)
  def encoder_attention(index):
    if encoder_attention_sparsity and sparse_encoder_attention == 'causal':
      return encoder_sublayers.causal_attention()
    return encoder_sublayers.bidirectional_attention(index)

  encoder = tl.Serial(                           # tok_e
      tl.Branch(
          _Embedder(input_vocab_size, d_model, dropout, max_len, encoder_mode,
                    shared_embedding),
          tl.PaddingMask()),                     # vec_e mask_e
      [[_EncoderBlock(encoder_sublayers, encoder_attention(i)),
        _Pooling(pooling.get(i), pooling_peaked, pooling_sort)]
       for i in range(n_encoder_layers)],        # vec_e mask_e (pooled)
      tl.LayerNorm(),                            # vec_e mask_e
  )
  return tl.Serial(                              # tok_e tok_d
      tl.Select([0, 1, 1]),                      # tok_e tok_d tok_d
      CachedInPredict(encoder, mode),            # vec_e mask_e tok_d tok_d
      tl.Select([2, 1, 0]),                      # tok_d mask_e vec_e tok_d
      tl.ShiftRight(mode=mode),
      _Embedder(output_vocab_size, d_model, dropout, max_len, mode,
                shared_embedding),
      tl.Branch([], tl.EncoderDecoderMask()),    # vec_d mask_ed vec_e tok_d
      [_EncoderDecoderBlock(decoder_sublayers)
       for _ in range(n_decoder_layers)],
      tl.Select([0], n_in=3),                    # vec_d tok_d
      tl.LayerNorm(),
      Logits(output_vocab_size, loss_sparsity),   # logits tok_d
  )


class _Sublayers:
  """Builds the (dense or sparse) attention and feed-forward sublayers."""

  def __init__(self, d_model, d_ff, n_heads, dropout, max_len, ff_sparsity,
               d_lowrank, ff_temperature, ff_quant_prob, attention_sparsity,
               attention_kernel_size, attention_module_kernel_size, mode,
               cross_attention_sparsity=0, attention_type='full',
               cst=(32, 3), block_len=512, local_conv_len=0,
               lsh=(128, 1, None, 0)):
    self.d_model, self.d_ff, self.n_heads = d_model, d_ff, n_heads
    self.dropout, self.max_len, self.mode = dropout, max_len, mode
    self.ff_sparsity, self.d_lowrank = ff_sparsity, d_lowrank
    self.ff_temperature, self.ff_quant_prob = ff_temperature, ff_quant_prob
    self.attention_sparsity = attention_sparsity
    self.kernel_size = attention_kernel_size
    self.module_kernel_size = attention_module_kernel_size
    self.cross_attention_sparsity = cross_attention_sparsity
    self.attention_type, self.cst, self.block_len = attention_type, cst, block_len
    self.lsh = lsh
    if isinstance(local_conv_len, bool) or not isinstance(
        local_conv_len, int) or local_conv_len < 0:
      raise TerraformerError(f'local_conv_len must be an integer >= 0, got '
                             f'{local_conv_len!r}')
    self.local_conv_len = local_conv_len
    if attention_type == 'cst':
      check_dense_qkv(attention_sparsity)

  def composite_slice_attention(self, causal):
    return CompositeSliceAttention(
        self.d_model, self.n_heads, *self.cst, causal=causal,
        max_len=self.max_len, dropout=self.dropout, mode=self.mode)

  def local_conv(self):
    """[] or a residual LocalConv sublayer (x -> x; a mask passes under)."""
    if not self.local_conv_len:
      return []
    return tl.Residual(tl.LayerNorm(),
                       LocalConv(self.d_model, self.local_conv_len,
                                 self.mode), self.dropout_layer())

  def dropout_layer(self):
    return tl.Dropout(rate=self.dropout, mode=self.mode)

  def feed_forward(self):
    """x -> y; the residual's dropout follows (in SparseFF's place too)."""
    if self.ff_sparsity:
      return SparseFF(self.d_ff, self.ff_sparsity, self.d_lowrank,
                      self.ff_temperature, self.ff_quant_prob, mode=self.mode)
    # Trax's _FeedForward: its dropout mask is shared along the length axis.
    return tl.Serial(tl.Dense(self.d_ff),
                     tl.Dropout(rate=self.dropout, shared_axes=[-2],
                                mode=self.mode),
                     tl.Relu(), tl.Dense(self.d_model))

  def causal_attention(self):
    """x -> y."""
    if self.attention_type == 'cst':
      return self.composite_slice_attention(causal=True)
    if self.attention_sparsity:
      # Trax's MultiplicativeConvCausalAttention: S modules for Q/K/V, split
      # into n_heads heads for attention (the same when S == n_heads), no
      # output layer.
      heads = lambda: tl.SplitIntoHeads(self.n_heads)
      return tl.Serial(
          SparseQKV(self.d_model, self.attention_sparsity, self.kernel_size,
                    3, causal=True, mode=self.mode,
                    module_kernel_size=self.module_kernel_size),
          tl.Parallel(heads(), heads(), heads()),
          PrefixCausalAttention(dropout=self.dropout,
                                max_inference_length=self.max_len,
                                mode=self.mode),
          tl.MergeHeads(self.n_heads),
      )
    # tl.CausalAttention's layers, with a core that decodes reading only the
    # filled part of its key/value cache.
    return tl.ConfigurableAttention(
        tl.Dense(self.d_model), tl.Dense(self.d_model),
        tl.Dense(self.d_model), tl.Dense(self.d_model),
        PrefixCausalAttention(self.dropout, self.max_len, self.mode),
        n_heads=self.n_heads)

  def bidirectional_attention(self, index=0):
    """(x, mask) -> (y, mask); `index`: the encoder block (LSH's eval key)."""
    if self.attention_type == 'lsh':
      chunk_len, n_hashes, n_buckets, eval_seed = self.lsh
      return _OnFlatMask(SelfAttention(
          self.d_model, self.n_heads, 'lsh', causal=False,
          dropout=self.dropout, lsh_chunk_len=chunk_len,
          lsh_n_hashes=n_hashes, lsh_n_buckets=n_buckets,
          lsh_eval_seed=None if eval_seed is None else eval_seed + index,
          mode=self.mode))
    if self.attention_type == 'blockwise':
      return _OnFlatMask(BlockwiseSelfAttention(self.d_model, self.n_heads,
                                                self.block_len))
    if self.attention_type == 'cst':
      return _OnFlatMask(self.composite_slice_attention(causal=False))
    if self.attention_sparsity:
      return SparseQKVAttention(self.d_model, self.attention_sparsity,
                                self.kernel_size, self.dropout, self.mode)
    return tl.Attention(self.d_model, self.n_heads, self.dropout, self.mode)

  def cross_attention(self):
    """(x_dec, x_enc, mask) -> (y, mask).

    Trax's `AttentionQKV(cache_KV_in_predict=True, q_sparsity=S,
    result_sparsity='noop')`. Keys and values come from the encoder and are
    computed once per input (cached in predict mode), so they stay dense, as
    in the paper's decoding cost analysis (§1); sparse attention makes the
    queries sparse (a 3 x 3 causal convolution, as Trax) and drops the
    output layer.
    """
    if self.cross_attention_sparsity:
      queries = SparseQKV(self.d_model, self.cross_attention_sparsity, 3,
                          n_outputs=1, causal=True, mode=self.mode,
                          module_kernel_size=3)
      output = []
    else:
      queries, output = tl.Dense(self.d_model), tl.Dense(self.d_model)
    keys_values = CachedInPredict(
        tl.Branch(tl.Dense(self.d_model), tl.Dense(self.d_model)), self.mode)
    return tl.Serial(
        tl.Parallel(queries, keys_values),       # q k v mask
        tl.PureAttention(n_heads=self.n_heads, dropout=self.dropout,
                         mode=self.mode),        # y mask
        output,
    )


def _check_choice(name, value, choices):
  if value not in choices:
    raise TerraformerError(f'{name} must be one of {choices}, got {value!r}')


def _FlatMask():
  """tl.PaddingMask's [B, 1, 1, L] -> [B, L]."""
  return tl.Fn('FlatMask', lambda mask: mask.reshape(mask.shape[0], -1))


def _OnFlatMask(attention):
  """(x, mask) -> (attention(x, flat mask), mask): a long-input attention,
  which reads the [B, L] mask, where the encoder carries PaddingMask's."""
  return tl.Branch([tl.Parallel([], _FlatMask()), attention],
                   tl.Select([1], n_in=2))


def _Pooling(k, peaked, sort):                   # vec_e mask_e
  if k is None:
    return []
  return [tl.Parallel([], _FlatMask()),
          RepresentationPooling(k, peaked, sort=sort),
          tl.Parallel([], tl.Fn('PaddingMaskShape',
                                lambda mask: mask[:, None, None, :]))]


def _Embedder(vocab_size, d_model, dropout, max_len, mode, embedding=None):
  """Token embedding (or the shared `embedding` layer), dropout, positions.

  As Trax's `EmbeddingAndPositionalEncodings`: learned positional vectors
  initialized sinusoidally (`tl.PositionalEncoding`, which applies dropout
  too), one per embedder (never shared).
  """
  return Embedder(
      embedding or tl.Embedding(vocab_size, d_model), dropout,
      tl.PositionalEncoding(max_len=max_len, dropout=dropout, mode=mode),
      mode)


def _DecoderOnlyBlock(s):
  return [
      s.local_conv(),
      tl.Residual(tl.LayerNorm(), s.causal_attention(), s.dropout_layer()),
      tl.Residual(tl.LayerNorm(), s.feed_forward(), s.dropout_layer()),
  ]


def _EncoderBlock(s, attention):                 # vec_e mask_e
  """`attention`: s.causal_attention() (x -> y; the mask passes under it) or
  s.bidirectional_attention() ((x, mask) -> (y, mask))."""
  return [
      s.local_conv(),
      tl.Residual(tl.LayerNorm(), attention, s.dropout_layer()),
      tl.Residual(tl.LayerNorm(), s.feed_forward(), s.dropout_layer()),
  ]


def _EncoderDecoderBlock(s):                     # vec_d mask_ed vec_e
  return [
      s.local_conv(),
      tl.Residual(tl.LayerNorm(), s.causal_attention(), s.dropout_layer()),
      tl.Residual(tl.LayerNorm(),
                  tl.Select([0, 2, 1, 2]),       # vec_d vec_e mask_ed vec_e
                  s.cross_attention(),           # y mask_ed vec_e
                  s.dropout_layer()),
      tl.Residual(tl.LayerNorm(), s.feed_forward(), s.dropout_layer()),
  ]
