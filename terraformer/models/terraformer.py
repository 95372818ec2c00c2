"""Terraformer (§4, Fig. 8): a Scaling Transformer for long sequences.

  * Encoder: reversible blocks of bidirectional attention and feed-forward.
  * No encoder-decoder attention: the decoder runs causally over
    LengthConcat(encoder output, decoder embeddings); each decoder block has
    two attentions before its feed-forward (§4.1):
        y1 = x + Dropout(Attention(LayerNorm(x)))
        y2 = y1 + Dropout(Attention(LayerNorm(y1)))
        y  = y2 + FFN(y2)
    Only the decoder positions reach the logits and the loss.
  * Reversible (§4.2): blocks run on two residual streams (x1, x2), each
    residual a half-residual followed by a swap (two swaps per encoder block,
    three per decoder block); discrete decisions (sparse FF controller, LSH
    buckets) are stored and replayed when reversing.
  * Recurrence (§4.3): a low-rank SRU (d_model -> d_sru -> d_model) is added
    to every feed-forward block: FFN(x) = FF(LN(x)) + SRU-path(LN(x)).
  * Sparsity (§3): `ff_sparsity`, `attention_sparsity`, `loss_sparsity` as in
    `ScalingTransformer`; attention mechanism 'full' or 'lsh' per stack.

Model contract (as `ScalingTransformer`): (inputs [B, Lin], targets [B, Lt])
-> (logits [B, Lt, V], targets). In predict mode the first call, (inputs,
prev_token = 0), runs the encoder and primes the decoder's caches with the Lin
encoder positions and the first token; then one token per call.

The decoder attends to every encoder position, padding included (their
encoder outputs): training, evaluation and decoding see the same sequence, so
decoding reproduces the evaluation forward pass exactly.
"""
import gin
import jax.numpy as jnp
from trax import layers as tl

from terraformer.layers import reversible as rev
from terraformer.layers.lsh_attention import SelfAttention
from terraformer.layers.low_rank_sru import LowRankSRU
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_logits import SparseLogits


@gin.configurable(module='terraformer')
def Terraformer(input_vocab_size=32000, output_vocab_size=None, d_model=512,
                d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, n_heads=8,
                dropout=0.1, max_len=2048, ff_sparsity=0, d_lowrank=64,
                ff_temperature=0.1, ff_quant_prob=0.3,
                encoder_attention_type='lsh', decoder_attention_type='lsh',
                attention_sparsity=0, attention_kernel_size=3,
                loss_sparsity=0, lsh_chunk_len=128, lsh_n_hashes=1,
                lsh_n_buckets=None, predict_mem_len=2048,
                predict_drop_len=256, use_sru=True, d_sru=32,
                reversible=True, mode='train'):
  """Terraformer: (inputs, targets) -> (logits, targets).

  Args:
    input_vocab_size: encoder vocabulary size.
    output_vocab_size: decoder vocabulary size (default: input_vocab_size).
    d_model: width of the residual streams.
    d_ff: feed-forward width.
    n_encoder_layers: encoder blocks.
    n_decoder_layers: decoder blocks.
    n_heads: attention heads (dense projections).
    dropout: dropout rate (residuals, attention, feed-forward).
    max_len: longest input or target (positional encodings).
    ff_sparsity: N > 0: sparse FF with one active unit per block of N.
    d_lowrank: sparse FF controller bottleneck.
    ff_temperature: Gumbel-softmax temperature of the controller.
    ff_quant_prob: probability of the hard one-hot in training.
    encoder_attention_type: 'full' or 'lsh'.
    decoder_attention_type: 'full' or 'lsh'.
    attention_sparsity: S > 0: sparse QKV with S modules (both stacks).
    attention_kernel_size: sparse QKV convolution size.
    loss_sparsity: S > 0: multiplicative final layer with S modules.
    lsh_chunk_len: LSH chunk length; must divide Lin and Lin + Lt.
    lsh_n_hashes: LSH hashing rounds.
    lsh_n_buckets: LSH buckets (None: from the length).
    predict_mem_len: decoder cache length in predict mode (>= Lin + Lt to
      attend to everything).
    predict_drop_len: positions LSH drops from a full cache.
    use_sru: add the low-rank SRU to every feed-forward block.
    d_sru: SRU width.
    reversible: reversible blocks (False: the same function with plain
      backpropagation, for comparisons).
    mode: 'train', 'eval' or 'predict'.
  """
  output_vocab_size = output_vocab_size or input_vocab_size
  encoder_mode = 'eval' if mode == 'predict' else mode
  common = dict(d_model=d_model, d_ff=d_ff, n_heads=n_heads, dropout=dropout,
                ff_sparsity=ff_sparsity, d_lowrank=d_lowrank,
                ff_temperature=ff_temperature, ff_quant_prob=ff_quant_prob,
                attention_sparsity=attention_sparsity,
                attention_kernel_size=attention_kernel_size,
                lsh_chunk_len=lsh_chunk_len, lsh_n_hashes=lsh_n_hashes,
                lsh_n_buckets=lsh_n_buckets, predict_mem_len=predict_mem_len,
                predict_drop_len=predict_drop_len,
                d_sru=d_sru if use_sru else 0, reversible=reversible,
                store_decisions=reversible and mode != 'predict')
  enc = _Sublayers(attention_type=encoder_attention_type, causal=False,
                   mode=encoder_mode, **common)
  dec = _Sublayers(attention_type=decoder_attention_type, causal=True,
                   mode=mode, **common)

  encoder = tl.Serial(                           # tok_e
      tl.Branch(_Embedder(input_vocab_size, d_model, dropout, max_len,
                          encoder_mode),
                _TokenMask()),                   # vec_e mask_e
      tl.Dup(),                                  # vec_e vec_e mask_e
      rev.ReversibleSerial(
          [_EncoderBlock(enc) for _ in range(n_encoder_layers)],
          reversible=reversible),                # x1 x2 mask_e
      _StreamMean(),                             # vec_e mask_e
      tl.Select([0], n_in=2),
      tl.LayerNorm(),                            # vec_e
  )
  return tl.Serial(                              # tok_e tok_d
      tl.Select([0, 1, 1]),                      # tok_e tok_d tok_d
      _CachedInPredict(encoder, mode),           # vec_e tok_d tok_d
      tl.Swap(),                                 # tok_d vec_e tok_d
      tl.ShiftRight(mode=mode),
      _Embedder(output_vocab_size, d_model, dropout, max_len, mode),
      _EncoderDecoderConcat(mode),               # vec_ed tok_d
      tl.Dup(),                                  # x1 x2 tok_d
      rev.ReversibleSerial(
          [_DecoderBlock(dec) for _ in range(n_decoder_layers)],
          reversible=reversible),                # x1 x2 tok_d
      _StreamMean(),                             # vec_ed tok_d
      tl.LayerNorm(),
      _DecoderPositions(),                       # vec_d tok_d
      _Logits(output_vocab_size, loss_sparsity),  # logits tok_d
  )


class _Sublayers:
  """Builds the attention and feed-forward residual functions of a stack."""

  def __init__(self, d_model, d_ff, n_heads, dropout, ff_sparsity, d_lowrank,
               ff_temperature, ff_quant_prob, attention_type,
               attention_sparsity, attention_kernel_size, lsh_chunk_len,
               lsh_n_hashes, lsh_n_buckets, predict_mem_len, predict_drop_len,
               d_sru, reversible, store_decisions, causal, mode):
    self.__dict__.update(locals())
    del self.__dict__['self']

  def half_residual(self, *layers):
    return rev.HalfResidual(*layers, reversible=self.reversible)

  def dropout_layer(self):
    return tl.Dropout(rate=self.dropout, mode=self.mode)

  def attention(self):
    """Causal: x -> y. Bidirectional: (x, mask) -> y."""
    attention = SelfAttention(
        self.d_model, self.n_heads, self.attention_type,
        self.attention_sparsity, self.attention_kernel_size, self.causal,
        self.dropout, self.lsh_chunk_len, self.lsh_n_hashes,
        self.lsh_n_buckets, self.predict_mem_len, self.predict_drop_len,
        self.mode)
    norm = tl.LayerNorm() if self.causal else tl.Parallel(tl.LayerNorm(), [])
    return self.half_residual(norm, attention, self.dropout_layer())

  def feed_forward(self):
    """x -> FF(LN(x)) [+ LowRankSRU(LN(x))]."""
    if self.ff_sparsity:
      ff = SparseFF(self.d_ff, self.ff_sparsity, self.d_lowrank,
                    self.ff_temperature, self.ff_quant_prob, self.dropout,
                    self.mode, store_decisions=self.store_decisions)
    else:
      ff = tl.Serial(tl.Dense(self.d_ff), tl.Relu(), self.dropout_layer(),
                     tl.Dense(self.d_model))
    if self.d_sru:
      ff = [tl.Branch(ff, LowRankSRU(self.d_model, self.d_sru,
                                     mode=self.mode)),
            tl.Add()]
    return self.half_residual(tl.LayerNorm(), ff, self.dropout_layer())


def _EncoderBlock(s):                            # x1 x2 mask
  return [s.attention(), tl.ReversibleSwap(),
          s.feed_forward(), tl.ReversibleSwap()]


def _DecoderBlock(s):                            # x1 x2
  return [s.attention(), tl.ReversibleSwap(),
          s.attention(), tl.ReversibleSwap(),
          s.feed_forward(), tl.ReversibleSwap()]


def _Embedder(vocab_size, d_model, dropout, max_len, mode):
  return [tl.Embedding(vocab_size, d_model),
          tl.Dropout(rate=dropout, mode=mode),
          tl.PositionalEncoding(max_len=max_len, mode=mode)]


def _TokenMask():
  """Tokens -> padding mask [batch, length], True on non-zero tokens."""
  return tl.Fn('TokenMask', lambda tokens: tokens != 0)


def _StreamMean():
  return tl.Fn('StreamMean', lambda x1, x2: (x1 + x2) / 2.0)


def _DecoderPositions():
  """(vec_ed, tok_d) -> (vec_d, tok_d): the last len(tok_d) positions."""
  return tl.Fn('DecoderPositions',
               lambda x, tok: (x[:, -tok.shape[1]:], tok), n_out=2)


def _Logits(vocab_size, loss_sparsity):
  if loss_sparsity:
    return SparseLogits(vocab_size, loss_sparsity)
  return tl.Dense(vocab_size)


def _CachedInPredict(layer, mode):
  """Runs `layer` once in predict mode and reuses its outputs (tl.Cache)."""
  return tl.Cache(layer) if mode == 'predict' else tl.Serial(layer)


class _EncoderDecoderConcat(tl.Layer):
  """(vec_d, vec_e) -> LengthConcat(vec_e, vec_d) (§4.1).

  In predict mode only the first call (the first decoder token) prepends the
  encoder positions, which primes the decoder's caches with them; later calls
  pass the new decoder position alone. A Python-level flag in the state (like
  `tl.Cache`) tells the two apart, so each has its own static shapes.
  """

  def __init__(self, mode='train'):
    super().__init__(n_in=2, n_out=1, name='EncoderDecoderConcat')
    self._mode = mode

  def forward(self, inputs):
    vec_d, vec_e = inputs
    if self._mode != 'predict':
      return jnp.concatenate([vec_e, vec_d], axis=1)
    if self.state:                               # Encoder already prepended.
      return vec_d
    self.state = (jnp.zeros((), jnp.int32),)
    return jnp.concatenate([vec_e, vec_d], axis=1)
