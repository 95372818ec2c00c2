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
from terraformer.layers.attention import ATTENTION_TYPES
from terraformer.layers.attention import FlatMask
from terraformer.layers.successive_halving_topk import RepresentationPooling
from terraformer.layers.successive_halving_topk import SCORERS
from terraformer.layers.successive_halving_topk import pooling_schedule
from terraformer.models.common import Embedder
from terraformer.models.common import EncodeOnce
from terraformer.models.common import Logits
from terraformer.models.common import Sublayers

ENCODER_ATTENTIONS = ('causal', 'bidirectional')
LM_ATTENTION_TYPES = ('full', 'cst')
ENCODER_ATTENTION_TYPES = ATTENTION_TYPES


@gin.configurable(module='terraformer')
def ScalingTransformerLM(vocab_size=32000, d_model=512, d_ff=2048, n_layers=6,
                         n_heads=8, dropout=0.1, max_len=2048, ff_sparsity=0,
                         d_lowrank=64, ff_temperature=0.1, ff_quant_prob=0.3,
                         attention_sparsity=0, attention_kernel_size=3,
                         attention_module_kernel_size=3, loss_sparsity=0,
                         attention_type='full', cst_slice_len=32,
                         cst_extension=3, local_conv_len=0, positions=True,
                         mode='train'):
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
  `positions`: True (Trax's model) adds learned positions to the
  embeddings; False adds none, CST's form: its attention carries its own
  tables (MS-VIPE, §4.2: applied in each layer "instead of adding the
  positional embedding ... at the embedding layer").
  """
  _check_choice('attention_type', attention_type, LM_ATTENTION_TYPES)
  sublayers = Sublayers(
      layout='transformer', d_model=d_model, d_ff=d_ff, n_heads=n_heads,
      dropout=dropout, mode=mode, causal=True, ff_sparsity=ff_sparsity,
      d_lowrank=d_lowrank, ff_temperature=ff_temperature,
      ff_quant_prob=ff_quant_prob, local_conv_len=local_conv_len,
      attention=dict(
          attention_type=attention_type,
          attention_sparsity=attention_sparsity,
          attention_kernel_size=attention_kernel_size,
          attention_module_kernel_size=attention_module_kernel_size,
          max_len=max_len, cst_slice_len=cst_slice_len,
          cst_extension=cst_extension))
  return tl.Serial(                              # tok
      tl.ShiftRight(mode=mode),
      (_EmbedTokens(tl.Embedding(vocab_size, d_model), max_len=max_len,
                    dropout=dropout, mode=mode) if positions else
       Embedder(tl.Embedding(vocab_size, d_model), [], dropout=dropout,
                mode=mode)),                     # vec
      [_Block(sublayers) for _ in range(n_layers)],
      tl.LayerNorm(),
      Logits(vocab_size, loss_sparsity),         # logits
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
                       pooling_scorer='linear', pooling_scorer_norm=False,
                       decoder_positions=True, local_conv_len=0,
                       mode='train'):
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
    `pooling_scorer`          App. A's scorers (Table 4): 'linear' (the
                              paper's), 'nonlinear', 'random', 'index',
                              'mean', 'max' (`RepresentationPooling.scorer`).
    `pooling_scorer_norm`     False: the scorer reads the pre-norm residual
                              stream; True: its LayerNorm, as the authors'
                              post-norm encoder hands it normalized vectors.

  `decoder_positions`: True (Trax's model) adds learned positions to the
  decoder's embeddings; False is Pyramidion's decoder (App. C.1: "no
  positional embeddings were used on the decoder side").
  """
  _check_choice('encoder_attention_type', encoder_attention_type,
                ENCODER_ATTENTION_TYPES)
  _check_choice('pooling_scorer', pooling_scorer, SCORERS)
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
  in_embedding = tl.Embedding(input_vocab_size, d_model)
  out_embedding = (in_embedding if output_vocab_size is None
                   else tl.Embedding(output_vocab_size, d_model))
  output_vocab_size = output_vocab_size or input_vocab_size
  encoder_mode = 'eval' if mode == 'predict' else mode
  if encoder_attention_type != 'full' and encoder_attention_sparsity:
    raise TerraformerError(
        f"encoder_attention_type={encoder_attention_type!r} takes dense Q/K/V;"
        f" set encoder_attention_sparsity=0 (sparse QKV encoders: 'full')")
  stack = dict(layout='transformer', d_model=d_model, d_ff=d_ff,
               n_heads=n_heads, dropout=dropout, ff_sparsity=ff_sparsity,
               d_lowrank=d_lowrank, ff_temperature=ff_temperature,
               ff_quant_prob=ff_quant_prob, local_conv_len=local_conv_len)
  attention = dict(attention_kernel_size=attention_kernel_size,
                   attention_module_kernel_size=attention_module_kernel_size,
                   max_len=max_len)
  encoder_sublayers = Sublayers(
      mode=encoder_mode,
      causal=bool(encoder_attention_sparsity
                  and sparse_encoder_attention == 'causal'),
      attention=dict(
          attention, attention_type=encoder_attention_type,
          attention_sparsity=encoder_attention_sparsity, block_len=block_len,
          cst_slice_len=cst_slice_len, cst_extension=cst_extension,
          lsh_chunk_len=lsh_chunk_len, lsh_n_hashes=lsh_n_hashes,
          lsh_n_buckets=lsh_n_buckets, lsh_eval_seed=lsh_eval_seed),
      **stack)
  decoder_sublayers = Sublayers(
      mode=mode, causal=True,
      cross_attention_sparsity=cross_attention_sparsity,
      attention=dict(attention, attention_sparsity=attention_sparsity),
      **stack)

  encoder = tl.Serial(                           # tok_e
      tl.Branch(_EmbedTokens(in_embedding, max_len=max_len, dropout=dropout,
                             mode=encoder_mode),
                tl.PaddingMask()),               # vec_e mask_e
      [[_Block(encoder_sublayers, i),
        _Pooling(pooling.get(i), pooling_peaked, pooling_sort,
                 pooling_scorer, pooling_scorer_norm)]
       for i in range(n_encoder_layers)],        # vec_e mask_e (pooled)
      tl.LayerNorm(),                            # vec_e mask_e
  )
  return tl.Serial(                              # tok_e tok_d
      EncodeOnce(encoder, mode),                 # vec_e mask_e tok_d tok_d
      tl.Select([2, 1, 0]),                      # tok_d mask_e vec_e tok_d
      tl.ShiftRight(mode=mode),
      (_EmbedTokens(out_embedding, max_len=max_len, dropout=dropout,
                    mode=mode) if decoder_positions else
       Embedder(out_embedding, [], dropout=dropout,
                mode=mode)),                     # vec_d mask_e vec_e tok_d
      tl.Branch([], tl.EncoderDecoderMask()),    # vec_d mask_ed vec_e tok_d
      [_EncoderDecoderBlock(decoder_sublayers)
       for _ in range(n_decoder_layers)],
      tl.Select([0], n_in=3),                    # vec_d tok_d
      tl.LayerNorm(),
      Logits(output_vocab_size, loss_sparsity),   # logits tok_d
  )


def _check_choice(name, value, choices):
  if value not in choices:
    raise TerraformerError(f'{name} must be one of {choices}, got {value!r}')


def _EmbedTokens(embedding, *, max_len, dropout, mode):
  """Trax's `EmbeddingAndPositionalEncodings`: `embedding`, dropout, then
  learned positional vectors initialized sinusoidally (one table per
  embedder, never shared; `tl.PositionalEncoding` applies dropout too)."""
  return Embedder(
      embedding,
      tl.PositionalEncoding(max_len=max_len, dropout=dropout, mode=mode),
      dropout=dropout, mode=mode)


def _Pooling(k, peaked, sort, scorer, scorer_norm):  # vec_e mask_e
  if k is None:
    return []
  return [tl.Parallel([], FlatMask()),
          RepresentationPooling(k, peaked, sort=sort, scorer=scorer,
                                scorer_norm=scorer_norm),
          tl.Parallel([], tl.Fn('PaddingMaskShape',
                                lambda mask: mask[:, None, None, :]))]


def _Block(s, index=0):                          # vec [mask]
  """A decoder-only or encoder block: attention, then feed-forward.

  Encoder attention reads and passes the mask (bidirectional) or lets it
  pass under (causal); `index` is the block's (LSH's evaluation key).
  """
  return [s.local_conv_block(), s.attention_block(index),
          s.feed_forward_block()]


def _EncoderDecoderBlock(s):                     # vec_d mask_ed vec_e
  return [
      s.local_conv_block(),
      s.attention_block(),
      s.cross_attention_block(),                 # vec_d mask_ed vec_e
      s.feed_forward_block(),
  ]
