"""Scaling Transformer (§3): a Transformer whose every dense layer can be sparse.

Switches (all 0 = the dense baseline):
  ff_sparsity N          SparseFF, one active unit per block of N (§3.1);
  attention_sparsity S   Sparse QKV attention with S heads of size d_model/S,
                         kernel `attention_kernel_size` (§3.2);
  loss_sparsity S        SparseLogits with S modules (§3.3).
"""
import gin
from trax import layers as tl

from terraformer.layers import SparseFF
from terraformer.layers import SparseLogits
from terraformer.layers import SparseQKV
from terraformer.layers import SparseQKVAttention
from terraformer.layers import SparseQKVCausalAttention
from terraformer.layers.prefix_attention import PrefixCausalAttention


@gin.configurable(module='terraformer')
def ScalingTransformerLM(vocab_size=32000, d_model=512, d_ff=2048, n_layers=6,
                         n_heads=8, dropout=0.1, max_len=2048, ff_sparsity=0,
                         d_lowrank=64, ff_temperature=0.1, ff_quant_prob=0.3,
                         attention_sparsity=0, attention_kernel_size=3,
                         loss_sparsity=0, mode='train'):
  """Decoder-only Scaling Transformer: tokens [batch, len] -> logits."""
  sublayers = _Sublayers(d_model, d_ff, n_heads, dropout, max_len, ff_sparsity,
                         d_lowrank, ff_temperature, ff_quant_prob,
                         attention_sparsity, attention_kernel_size, mode)
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      _Embedder(vocab_size, d_model, dropout, max_len, mode),
      [_DecoderOnlyBlock(sublayers) for _ in range(n_layers)],
      tl.LayerNorm(),
      _Logits(vocab_size, loss_sparsity),
  )


@gin.configurable(module='terraformer')
def ScalingTransformer(input_vocab_size=32000, output_vocab_size=None,
                       d_model=512, d_ff=2048, n_encoder_layers=6,
                       n_decoder_layers=6, n_heads=8, dropout=0.1,
                       max_len=2048, ff_sparsity=0, d_lowrank=64,
                       ff_temperature=0.1, ff_quant_prob=0.3,
                       attention_sparsity=0, attention_kernel_size=3,
                       loss_sparsity=0, mode='train'):
  """Encoder-decoder Scaling Transformer (the paper's T5-like 800M model).

  (input tokens, target tokens) -> (logits, target tokens). In predict mode
  the encoder runs once, on the first call, and is cached; the decoder
  decodes token by token.
  """
  output_vocab_size = output_vocab_size or input_vocab_size
  encoder_mode = 'eval' if mode == 'predict' else mode
  sparsity = (ff_sparsity, d_lowrank, ff_temperature, ff_quant_prob,
              attention_sparsity, attention_kernel_size)
  encoder_sublayers = _Sublayers(d_model, d_ff, n_heads, dropout, max_len,
                                 *sparsity, encoder_mode)
  decoder_sublayers = _Sublayers(d_model, d_ff, n_heads, dropout, max_len,
                                 *sparsity, mode)
  encoder = tl.Serial(                           # tok_e
      tl.Branch(
          _Embedder(input_vocab_size, d_model, dropout, max_len, encoder_mode),
          tl.PaddingMask()),                     # vec_e mask_e
      [_EncoderBlock(encoder_sublayers) for _ in range(n_encoder_layers)],
      tl.LayerNorm(),                            # vec_e mask_e
  )
  return tl.Serial(                              # tok_e tok_d
      tl.Select([0, 1, 1]),                      # tok_e tok_d tok_d
      _CachedInPredict(encoder, mode),           # vec_e mask_e tok_d tok_d
      tl.Select([2, 1, 0]),                      # tok_d mask_e vec_e tok_d
      tl.ShiftRight(mode=mode),
      _Embedder(output_vocab_size, d_model, dropout, max_len, mode),
      tl.Branch([], tl.EncoderDecoderMask()),    # vec_d mask_ed vec_e tok_d
      [_EncoderDecoderBlock(decoder_sublayers)
       for _ in range(n_decoder_layers)],
      tl.Select([0], n_in=3),                    # vec_d tok_d
      tl.LayerNorm(),
      _Logits(output_vocab_size, loss_sparsity),  # logits tok_d
  )


class _Sublayers:
  """Builds the (dense or sparse) attention and feed-forward sublayers."""

  def __init__(self, d_model, d_ff, n_heads, dropout, max_len, ff_sparsity,
               d_lowrank, ff_temperature, ff_quant_prob, attention_sparsity,
               attention_kernel_size, mode):
    self.d_model, self.d_ff, self.n_heads = d_model, d_ff, n_heads
    self.dropout, self.max_len, self.mode = dropout, max_len, mode
    self.ff_sparsity, self.d_lowrank = ff_sparsity, d_lowrank
    self.ff_temperature, self.ff_quant_prob = ff_temperature, ff_quant_prob
    self.attention_sparsity = attention_sparsity
    self.kernel_size = attention_kernel_size

  def dropout_layer(self):
    return tl.Dropout(rate=self.dropout, mode=self.mode)

  def feed_forward(self):
    if self.ff_sparsity:
      return SparseFF(self.d_ff, self.ff_sparsity, self.d_lowrank,
                      self.ff_temperature, self.ff_quant_prob, self.dropout,
                      self.mode)
    return tl.Serial(tl.Dense(self.d_ff), tl.Relu(), self.dropout_layer(),
                     tl.Dense(self.d_model))

  def causal_attention(self):
    """x -> y."""
    if self.attention_sparsity:
      return SparseQKVCausalAttention(
          self.d_model, self.attention_sparsity, self.kernel_size,
          self.dropout, self.max_len, self.mode)
    # tl.CausalAttention's layers, with a core that decodes reading only the
    # filled part of its key/value cache.
    return tl.ConfigurableAttention(
        tl.Dense(self.d_model), tl.Dense(self.d_model),
        tl.Dense(self.d_model), tl.Dense(self.d_model),
        PrefixCausalAttention(self.dropout, self.max_len, self.mode),
        n_heads=self.n_heads)

  def bidirectional_attention(self):
    """(x, mask) -> (y, mask)."""
    if self.attention_sparsity:
      return SparseQKVAttention(self.d_model, self.attention_sparsity,
                                self.kernel_size, self.dropout, self.mode)
    return tl.Attention(self.d_model, self.n_heads, self.dropout, self.mode)

  def cross_attention(self):
    """(x_dec, x_enc, mask) -> (y, mask).

    Keys and values come from the encoder and are computed once per input
    (cached in predict mode), so they stay dense, as in the paper's decoding
    cost analysis (§1); sparse attention makes the queries sparse and drops
    the output layer, like its self-attention.
    """
    if self.attention_sparsity:
      queries = SparseQKV(self.d_model, self.attention_sparsity,
                          self.kernel_size, n_outputs=1, causal=True,
                          mode=self.mode)
      n_heads, output = self.attention_sparsity, []
    else:
      queries, n_heads = tl.Dense(self.d_model), self.n_heads
      output = tl.Dense(self.d_model)
    keys_values = _CachedInPredict(
        tl.Branch(tl.Dense(self.d_model), tl.Dense(self.d_model)), self.mode)
    return tl.Serial(
        tl.Parallel(queries, keys_values),       # q k v mask
        tl.PureAttention(n_heads=n_heads, dropout=self.dropout,
                         mode=self.mode),        # y mask
        output,
    )


def _CachedInPredict(layer, mode):
  """Runs `layer` once in predict mode and reuses its outputs.

  Other modes wrap it in a one-layer Serial, so that the weight trees of all
  modes have the same structure as tl.Cache's.
  """
  return tl.Cache(layer) if mode == 'predict' else tl.Serial(layer)


def _Embedder(vocab_size, d_model, dropout, max_len, mode):
  return [tl.Embedding(vocab_size, d_model),
          tl.Dropout(rate=dropout, mode=mode),
          tl.PositionalEncoding(max_len=max_len, mode=mode)]


def _Logits(vocab_size, loss_sparsity):
  if loss_sparsity:
    return SparseLogits(vocab_size, loss_sparsity)
  return tl.Dense(vocab_size)


def _DecoderOnlyBlock(s):
  return [
      tl.Residual(tl.LayerNorm(), s.causal_attention(), s.dropout_layer()),
      tl.Residual(tl.LayerNorm(), s.feed_forward(), s.dropout_layer()),
  ]


def _EncoderBlock(s):                            # vec_e mask_e
  return [
      tl.Residual(tl.LayerNorm(), s.bidirectional_attention(),
                  s.dropout_layer()),
      tl.Residual(tl.LayerNorm(), s.feed_forward(), s.dropout_layer()),
  ]


def _EncoderDecoderBlock(s):                     # vec_d mask_ed vec_e
  return [
      tl.Residual(tl.LayerNorm(), s.causal_attention(), s.dropout_layer()),
      tl.Residual(tl.LayerNorm(),
                  tl.Select([0, 2, 1, 2]),       # vec_d vec_e mask_ed vec_e
                  s.cross_attention(),           # y mask_ed vec_e
                  s.dropout_layer()),
      tl.Residual(tl.LayerNorm(), s.feed_forward(), s.dropout_layer()),
  ]
