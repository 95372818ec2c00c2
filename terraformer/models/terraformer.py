"""Terraformer (§4, Fig. 8): a Scaling Transformer for long sequences.

  * Encoder: reversible blocks of bidirectional attention and feed-forward,
    then the mean of the two streams, a Dense layer and a LayerNorm.
  * No encoder-decoder attention: the decoder runs causally over the encoder
    output with its padding removed, followed by the decoder embeddings
    ([e_1..e_n, d_1..d_m, zeros], Trax's `ConcatWithPadding`); each decoder
    block has two attentions before its feed-forward (§4.1):
        y1 = x + Dropout(Attention(LayerNorm(x)))
        y2 = y1 + Dropout(Attention(LayerNorm(y1)))
        y  = y2 + FFN(y2)
    Only the decoder positions reach the logits and the loss (Trax's
    `StripFromConcatenateWithPadding`). The logits of real positions do not
    depend on how much padding the inputs have (full attention; LSH hashes
    and chunks a sequence whose length includes the padding).
  * Reversible (§4.2): blocks run on two residual streams (x1, x2), each
    residual a half-residual followed by a swap (two swaps per encoder block,
    three per decoder block); discrete decisions (sparse FF controller, LSH
    buckets) are stored and replayed when reversing.
  * Recurrence (§4.3): a low-rank SRU (d_model -> d_sru -> d_model) with its
    own LayerNorm is added to every feed-forward block:
    FFN(x) = Dropout(FF(LN(x))) + SRU-path(LN'(x)).
  * Sparsity (§3): `ff_sparsity`, `attention_sparsity`, `loss_sparsity` as in
    `ScalingTransformer`; attention mechanism 'full' or 'lsh' per stack.

Model contract (as `ScalingTransformer`): (inputs [B, Lin], targets [B, Lt])
-> (logits [B, Lt, V], targets); inputs are padded with 0 at the end. In
predict mode the first call, (inputs, prev_token = 0), runs the encoder and
primes the decoder's caches with each example's real encoder positions and
the first token; then one token per call. With full attention decoding
reproduces the evaluation forward pass (to float error) for any padding, also
with per-example lengths in a batch. With LSH it does not: evaluation hashes
the whole sequence once (with a fixed key, so it is deterministic), decoding
hashes the growing cache, and junk cache positions of shorter examples are
not masked; see `terraformer/layers/lsh_attention.py`.

Correspondence with Trax 1.4.1's `ConfigurableTerraformer`
(`trax.models.research.terraformer`), the code the paper measured:
  same by default: reversible encoder blocks (two swaps) and decoder blocks
    (`n_decoder_attention_layers=2`); `reversible_encoder=False` (stream mean,
    Dense, LayerNorm after the encoder); `ConcatWithPadding` /
    `StripFromConcatenateWithPadding`; `pos_type='fixed-base'` (our own
    `FixedBasePositionalEncoding`, same weights and eval/predict function;
    training draws its random starts with other random numbers); embeddings
    shared between encoder and decoder when `output_vocab_size` is None;
    `ff_use_sru=(1, d_sru)` as `tl.Residual([LayerNorm, Dense(d_sru), SRU,
    Dense(d_model)], shortcut=[LayerNorm, FF, Dropout])`; ReLU feed-forward;
    `ff_sparsity` (`SparseFF`); `loss_sparsity` with
    `loss_sparsity_type='mult'`; full attention = `tl.SelfAttention`
    (efficient), LSH = `tl.LSHSelfAttention` / `PureLSHSelfAttention`.
  differs (weights map, function equal): attention projections are
    `tl.Dense` layers with biases (Trax's `SelfAttention`: per-head
    [n_heads, d_model, d_head] matrices without biases, w_o
    [n_heads, d_head, d_model]; import with zero biases); LSH uses q and k
    averaged (Trax's `LSHSelfAttention` has one shared w_qk: import it as
    both); the feed-forward's dropout sits after the ReLU (same values).
  not supported: `d_attention_key/value` != d_model / n_heads,
    `n_layers_forget`, `half_before_layer`, `double_after_layer`,
    `reversible_encoder=True`, `ff_chunk_size`, `attention_chunk_size`,
    `use_bfloat16`, `center_layernorm=False`, `loss_d_lowrank`,
    `loss_sparsity_prob`, `pos_type` other than 'fixed-base'/None,
    `pos_start_from_zero_prob`, embedded (vector) inputs.
Switches back to our earlier variants: `pos_type='sinusoidal'`,
`share_embeddings=False`, `encoder_output_dense=False`.
"""
import gin
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

from terraformer.layers import composites
from terraformer.layers import reversible as rev
from terraformer.layers.successive_halving_topk import LinearScorer
from terraformer.layers.successive_halving_topk import pooling_schedule
from terraformer.layers.successive_halving_topk import successive_halving_topk
from terraformer.models.common import Embedder
from terraformer.models.common import EncodeOnce
from terraformer.models.common import Logits
from terraformer.models.common import Sublayers

POS_TYPES = ('fixed-base', 'sinusoidal')


@gin.configurable(module='terraformer')
def Terraformer(input_vocab_size=32000, output_vocab_size=None, d_model=512,
                d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, n_heads=8,
                dropout=0.1, max_len=2048, ff_sparsity=0, d_lowrank=64,
                ff_temperature=0.1, ff_quant_prob=0.3,
                encoder_attention_type='lsh', decoder_attention_type='lsh',
                attention_sparsity=0, attention_kernel_size=3,
                loss_sparsity=0, lsh_chunk_len=128, lsh_n_hashes=1,
                lsh_n_buckets=None, lsh_decode_n_buckets=None,
                lsh_eval_seed=0, predict_mem_len=2048,
                predict_drop_len=256, use_sru=True, d_sru=32,
                pos_type='fixed-base', share_embeddings=True,
                encoder_output_dense=True, encoder_pooling=None,
                pooling_peaked=True, pooling_sort=True, block_len=512,
                cst_slice_len=32, cst_extension=3, reversible=True,
                mode='train'):
  """Terraformer: (inputs, targets) -> (logits, targets).

  Args:
    input_vocab_size: encoder vocabulary size.
    output_vocab_size: decoder vocabulary size (default: input_vocab_size).
    d_model: width of the residual streams.
    d_ff: feed-forward width.
    n_encoder_layers: encoder blocks.
    n_decoder_layers: decoder blocks.
    n_heads: attention heads (dense projections).
    dropout: dropout rate (embeddings, residuals, attention, feed-forward).
    max_len: longest input or target (sinusoidal positions).
    ff_sparsity: N > 0: sparse FF with one active unit per block of N.
    d_lowrank: sparse FF controller bottleneck.
    ff_temperature: Gumbel-softmax temperature of the controller.
    ff_quant_prob: probability of the hard one-hot in training.
    encoder_attention_type: 'full', 'lsh', 'blockwise' (blocks of
      `block_len`) or 'cst' (composite slice attention).
    decoder_attention_type: 'full', 'lsh' or 'cst' (causal).
    attention_sparsity: S > 0: sparse QKV with S modules (both stacks).
    attention_kernel_size: sparse QKV convolution size.
    loss_sparsity: S > 0: multiplicative final layer with S modules.
    lsh_chunk_len: LSH chunk length; must divide Lin and Lin + Lt.
    lsh_n_hashes: LSH hashing rounds.
    lsh_n_buckets: LSH buckets (None: from the length).
    lsh_decode_n_buckets: LSH buckets of the decoder when decoding, for the
      prefill and every token (None: lsh_n_buckets, or if None the count of a
      training sequence of predict_mem_len positions). Set it to the count
      the decoder had in training (2 * (Lin + Lt) / lsh_chunk_len) when
      predict_mem_len is not the training length.
    lsh_eval_seed: hashing key of LSH in eval and predict (layer i uses
      lsh_eval_seed + i), so evaluation is deterministic; None: a fresh rng
      every call, as in training.
    predict_mem_len: decoder cache length in predict mode (>= Lin + Lt to
      attend to everything).
    predict_drop_len: positions LSH drops from a full cache.
    use_sru: add the low-rank SRU to every feed-forward block.
    d_sru: SRU width.
    pos_type: 'fixed-base' (Trax's Terraformer default, learned digit
      embeddings, `FixedBasePositionalEncoding`) or 'sinusoidal'
      (`tl.PositionalEncoding`).
    share_embeddings: one embedding matrix for inputs and targets when
      output_vocab_size is None (as Trax); False: two.
    encoder_output_dense: a Dense layer between the encoder's stream mean
      and its final LayerNorm (as Trax); False: none.
    encoder_pooling: {layer: k}: after encoder block `layer` (0-based) the
      representations are pooled to k by a linear scorer and the successive
      halving top-k operator (Pyramidion, Pietruszka et al. §3-4; the
      reference code's `--enc-layers-and-token-width`); the decoder reads
      the last k. {n_encoder_layers - 1: k} is the Transpooler, more entries
      a Pyramidion. An input of at most k tokens passes unpooled. None: no
      pooling.
    pooling_peaked: the reference code's peaked pairwise softmax (False: the
      paper's plain softmax, App. B.3 eq. 6).
    pooling_sort: sort before each tournament round (Algorithm 1).
    block_len: 'blockwise' encoder attention block length.
    cst_slice_len: 'cst' slice length L.
    cst_extension: 'cst' slice extension α.
    reversible: reversible blocks (False: the same function with plain
      backpropagation, for comparisons).
    mode: 'train', 'eval' or 'predict'.
  """
  if pos_type not in POS_TYPES:
    raise ValueError(f'pos_type must be one of {POS_TYPES}, got {pos_type!r}')
  pooling = pooling_schedule(encoder_pooling, n_encoder_layers)
  shared = share_embeddings and output_vocab_size is None
  output_vocab_size = output_vocab_size or input_vocab_size
  encoder_mode = 'eval' if mode == 'predict' else mode
  stack = dict(layout='terraformer', d_model=d_model, d_ff=d_ff,
               n_heads=n_heads, dropout=dropout, ff_sparsity=ff_sparsity,
               d_lowrank=d_lowrank, ff_temperature=ff_temperature,
               ff_quant_prob=ff_quant_prob, d_sru=d_sru if use_sru else 0,
               reversible=reversible,
               store_decisions=reversible and mode != 'predict')
  attention = dict(attention_sparsity=attention_sparsity,
                   attention_kernel_size=attention_kernel_size,
                   lsh_chunk_len=lsh_chunk_len, lsh_n_hashes=lsh_n_hashes,
                   lsh_n_buckets=lsh_n_buckets, lsh_eval_seed=lsh_eval_seed,
                   predict_mem_len=predict_mem_len,
                   predict_drop_len=predict_drop_len, block_len=block_len,
                   cst_slice_len=cst_slice_len, cst_extension=cst_extension)
  enc = Sublayers(mode=encoder_mode, causal=False,
                  attention=dict(attention,
                                 attention_type=encoder_attention_type,
                                 max_len=max_len),
                  **stack)
  if mode == 'predict' and lsh_decode_n_buckets is not None:
    attention = dict(attention, lsh_n_buckets=lsh_decode_n_buckets)
  dec = Sublayers(mode=mode, causal=True,
                  attention=dict(attention,
                                 attention_type=decoder_attention_type,
                                 max_len=predict_mem_len),
                  **stack)
  blocks = [_EncoderBlock(enc) for _ in range(n_encoder_layers)]
  encoder_blocks, start = [], 0
  for layer, k in pooling:                       # x1 x2 mask_e
    encoder_blocks += [
        rev.ReversibleSerial(blocks[start:layer + 1], reversible=reversible),
        StreamPooling(k, pooling_peaked, pooling_sort)]
    start = layer + 1
  encoder_blocks.append(
      rev.ReversibleSerial(blocks[start:], reversible=reversible))
  in_embedding = tl.Embedding(input_vocab_size, d_model)
  out_embedding = (in_embedding if shared
                   else tl.Embedding(output_vocab_size, d_model))

  encoder = tl.Serial(                           # tok_e
      tl.Branch(Embedder(in_embedding,
                         _PositionalEncoding(pos_type, max_len, encoder_mode),
                         dropout=dropout, mode=encoder_mode,
                         dropout_shared_axes=[-2]),
                _TokenMask()),                   # vec_e mask_e
      tl.Dup(),                                  # vec_e vec_e mask_e
      encoder_blocks,                            # x1 x2 mask_e (pooled)
      _StreamMean(),                             # vec_e mask_e
      tl.Dense(d_model) if encoder_output_dense else [],
      tl.LayerNorm(),                            # vec_e mask_e
  )
  decoder_blocks = composites.mark(rev.ReversibleSerial(
      [_DecoderBlock(dec, i) for i in range(n_decoder_layers)],
      reversible=reversible), composites.TERRAFORMER_DECODER)
  return tl.Serial(                              # tok_e tok_d
      EncodeOnce(encoder, mode),                 # vec_e mask_e tok_d tok_d
      tl.Select([2, 0, 1]),                      # tok_d vec_e mask_e tok_d
      tl.ShiftRight(mode=mode),
      Embedder(out_embedding, _PositionalEncoding(pos_type, max_len, mode),
               dropout=dropout, mode=mode, dropout_shared_axes=[-2]),
      EncoderDecoderConcat(mode),                # vec_ed len_e tok_d
      tl.Dup(),                                  # x1 x2 len_e tok_d
      decoder_blocks,                            # x1 x2 len_e tok_d
      _StreamMean(),                             # vec_ed len_e tok_d
      tl.LayerNorm(),
      DecoderPositions(mode),                    # vec_d tok_d
      Logits(output_vocab_size, loss_sparsity),   # logits tok_d
  )


class StreamPooling(tl.Layer):
  """(x1, x2, mask) -> the same, pooled to k positions (Pyramidion §3.1).

  A linear scorer reads the mean of the two residual streams; the successive
  halving top-k operator (Algorithm 1) pools both streams with the same
  pair weights, so the pooled mean is the pooled input mean. Order, padding
  and the peaked/plain forms: `successive_halving_topk`. A sequence of at
  most k positions passes unchanged. Between reversible segments: its
  activations are stored, not recomputed.
  """

  def __init__(self, k, peaked=True, sort=True):
    super().__init__(n_in=3, n_out=3, name=f'StreamPooling_{k}')
    self._k, self._peaked, self._sort = k, peaked, sort
    self._sublayers = (LinearScorer(sigmoid=peaked),)

  def forward(self, inputs):
    x1, x2, mask = inputs
    if x1.shape[1] <= self._k:
      return x1, x2, mask
    scores, _ = self.sublayers[0].pure_fn((x1 + x2) / 2.0, self.weights[0],
                                          self.state[0], self.rng)
    both, _, pooled_mask, _ = successive_halving_topk(
        jnp.concatenate([x1, x2], axis=-1), scores, self._k, mask,
        self._peaked, sort=self._sort)
    d = x1.shape[-1]
    return both[..., :d], both[..., d:], pooled_mask

  def init_weights_and_state(self, input_signature):
    weights, state = self.sublayers[0].init(input_signature[0])
    self.weights, self.state = (weights,), (state,)


def _EncoderBlock(s):                            # x1 x2 mask
  return [s.attention_block(), tl.ReversibleSwap(),
          s.feed_forward_block(), tl.ReversibleSwap()]


def _DecoderBlock(s, index):                     # x1 x2 len_e
  """Two attentions before the feed-forward (§4.1); LSH evaluation keys
  1 + 2 * index and 2 + 2 * index (the encoder's blocks all use 0)."""
  return [s.attention_block(1 + 2 * index), tl.ReversibleSwap(),
          s.attention_block(2 + 2 * index), tl.ReversibleSwap(),
          s.feed_forward_block(), tl.ReversibleSwap()]


def _PositionalEncoding(pos_type, max_len, mode):
  if pos_type == 'fixed-base':
    return FixedBasePositionalEncoding(mode=mode)
  return tl.PositionalEncoding(max_len=max_len, mode=mode)


@gin.configurable(module='terraformer')
class FixedBasePositionalEncoding(tl.Layer):
  """Positions written in several bases, each digit scaling a learned vector.

  The Terraformer's positional encoding (Trax's `pos_type='fixed-base'`,
  `tl.FixedBasePositionalEncoding`; same weights and eval/predict function):
  for every base b and digit i, (digit i of the position in base b) * w[b][i]
  ([1, d / n_digits]); the digits' vectors are concatenated, the bases
  summed, and a learned start vector is added at position 0. Training starts
  at a random position with probability 1 - 1/start_from_zero_one_in and
  drops all the position embeddings of an example with probability
  1/base_dropout_one_in (Trax's regularization; our own random draws).
  Predict mode counts positions in its state.
  """

  def __init__(self, bases=(11, 13, 14, 15), n_digits=8,
               start_from_zero_one_in=2, base_dropout_one_in=100,
               mode='train', initializer=init.RandomUniformInitializer(1e-4)):
    super().__init__(name='FixedBasePositionalEncoding')
    self._bases = tuple(bases)
    self._n_digits = n_digits
    self._start_from_zero_one_in = start_from_zero_one_in
    self._base_dropout_one_in = base_dropout_one_in
    self._mode = mode
    self._initializer = initializer

  def forward(self, x):
    base_weights, start_vec = self.weights
    batch, length = x.shape[0], x.shape[1]
    max_pos = min(self._bases) ** self._n_digits
    positions = jnp.broadcast_to(jnp.arange(length)[None, :], (batch, length))
    first = jnp.ones((batch, 1, 1), x.dtype)     # Position 0 is the start.
    keep = jnp.ones((batch, 1, 1), x.dtype)
    if self._mode == 'train':
      rng_start, rng_offset, rng_drop = fastmath.random.split(self.rng, 3)
      offset = fastmath.random.randint(rng_offset, (batch,), 0,
                                       max_pos - length)
      moved = fastmath.random.randint(
          rng_start, (batch,), 0, self._start_from_zero_one_in) > 0
      positions = positions + jnp.where(moved, offset, 0)[:, None]
      keep = (fastmath.random.randint(rng_drop, (batch,), 0,
                                      self._base_dropout_one_in) > 0)
      keep = keep.astype(x.dtype)[:, None, None]
    elif self._mode == 'predict':
      positions = positions + self.state
      first = jnp.where(self.state == 0, first, 0.0)
      self.state = self.state + length
    embedding = 0.0
    for base, digit_weights in zip(self._bases, base_weights):
      digits, rest = [], positions
      for w in digit_weights:
        digits.append((rest % base).astype(x.dtype)[..., None] * w)
        rest = rest // base
      embedding = embedding + jnp.concatenate(digits, axis=-1) * keep
    is_first = (jnp.arange(length) == 0)[None, :, None] * first
    return x + embedding + is_first * start_vec

  def init_weights_and_state(self, input_signature):
    d = input_signature.shape[-1]
    if d % self._n_digits:
      raise ValueError(f'd_model={d} is not a multiple of n_digits='
                       f'{self._n_digits} (fixed-base positions).')
    rng_digits, rng_start = fastmath.random.split(self.rng)
    base_weights = tuple(
        tuple(self._initializer((1, d // self._n_digits), r)
              for r in fastmath.random.split(rng_digits, self._n_digits))
        for _ in self._bases)
    self.weights = (base_weights,
                    self._initializer((1, 1, d), rng_start))
    if self._mode == 'predict':
      self.state = jnp.zeros((), jnp.int32)


def _TokenMask():
  """Tokens -> padding mask [batch, length], True on non-zero tokens."""
  return tl.Fn('TokenMask', lambda tokens: tokens != 0)


def _StreamMean():
  return tl.Fn('StreamMean', lambda x1, x2: (x1 + x2) / 2.0)


class _PrefillThenSteps(tl.Layer):
  """A 3 -> 2 layer before or after the decoder blocks whose predict mode
  tells its first call (the prefill, with the encoder positions) from the
  later ones (one decoder position each) by a Python-level flag in its state
  (like `tl.Cache`), so that each has its own static shapes."""

  def __init__(self, mode='train'):
    super().__init__(n_in=3, n_out=2, name=type(self).__name__)
    self._mode = mode

  def after_prefill(self):
    return self._mode == 'predict' and bool(self.state)


class EncoderDecoderConcat(_PrefillThenSteps):
  """(vec_d, vec_e, mask_e) -> (vec_ed, len_e): padding removed (§4.1).

  vec_ed[b] = [vec_e[b, :n_b], vec_d[b], zeros(Lin - n_b)] with n_b = len_e[b]
  the number of real encoder tokens (Trax's `ConcatWithPadding`; padding at
  the end of the inputs). In predict mode only the first call (the first
  decoder token) prepends the encoder positions, which primes the decoder's
  caches with them; later calls pass the new decoder position alone.
  """

  def forward(self, inputs):
    vec_d, vec_e, mask_e = inputs
    if self.after_prefill():                     # Encoder already prepended.
      return vec_d, self.state[0]
    len_e = jnp.sum(mask_e, axis=1, dtype=jnp.int32)
    if self._mode == 'predict':
      self.state = (len_e,)
    l_in, l_out = vec_e.shape[1], vec_d.shape[1]
    pos = jnp.arange(l_in + l_out)[None, :]
    n = len_e[:, None]
    source = jnp.where(pos < n, pos, l_in + pos - n)
    source = jnp.clip(source, 0, l_in + l_out - 1)
    both = jnp.concatenate([vec_e, vec_d], axis=1)
    vec_ed = jnp.take_along_axis(both, source[..., None], axis=1)
    return vec_ed * (pos < n + l_out)[..., None].astype(vec_ed.dtype), len_e


class DecoderPositions(_PrefillThenSteps):
  """(vec_ed, len_e, tok_d) -> (vec_d, tok_d): the decoder positions.

  vec_d[b] = vec_ed[b, n_b : n_b + Ld] (Trax's
  `StripFromConcatenateWithPadding`); in predict mode, after the first call,
  vec_ed holds the decoder position alone.
  """

  def forward(self, inputs):
    vec_ed, len_e, tok_d = inputs
    if self.after_prefill():
      return vec_ed, tok_d
    if self._mode == 'predict':
      self.state = (jnp.zeros((), jnp.int32),)
    rows = len_e[:, None] + jnp.arange(tok_d.shape[1])[None, :]
    return jnp.take_along_axis(vec_ed, rows[..., None], axis=1), tok_d
