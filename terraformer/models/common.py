"""Builders both models use: sublayers, embedding, logits, encoding once."""
import dataclasses

from trax import layers as tl

from terraformer.errors import TerraformerError
from terraformer.layers import composites
from terraformer.layers import reversible as rev
from terraformer.layers.attention import SelfAttention
from terraformer.layers.attention import TransformerSelfAttention
from terraformer.layers.cross_attention import EncoderDecoderAttention
from terraformer.layers.local_conv import LocalConv
from terraformer.layers.low_rank_sru import LowRankSRU
from terraformer.layers.lsh_attention import PerExamplePrefill
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_logits import SparseLogits
from terraformer.layers.sparse_qkv_attention import SparseQKV

LAYOUTS = ('transformer', 'terraformer')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sublayers:
  """Builds the residual sublayers of one stack (an encoder or a decoder).

  Each call returns new layers (their own weights). `layout` is the model's,
  whose Trax counterpart stores the same weights in the same order (so that
  its checkpoints import, `terraformer.trax_bridge.checkpoint_import`):

    'transformer'  the Scaling Transformer (Trax's ConfigurableTransformer):
                   `TransformerSelfAttention`; feed-forward Dense, Dropout
                   (its mask shared along the length), ReLU, Dense (Trax's
                   `_FeedForward`); pre-norm `tl.Residual` blocks, and the
                   optional `LocalConv` and cross-attention sublayers.
    'terraformer'  the Terraformer (§4): `SelfAttention`, which reads the
                   encoder lengths (decoder) or the mask (encoder) beside x;
                   feed-forward Dense, ReLU, Dropout, Dense; reversible
                   half-residuals (§4.2) and, with `d_sru` > 0, the low-rank
                   SRU added to every feed-forward block (§4.3).

  `attention`: the keyword arguments of the stack's attention builder
  (attention_type, attention_sparsity, lsh_*, max_len, ...) but d_model,
  n_heads, causal, dropout and mode, which are the stack's.
  """

  layout: str
  d_model: int
  d_ff: int
  n_heads: int
  dropout: float
  mode: str
  causal: bool                  # Causal (decoder) or bidirectional attention.
  attention: dict
  ff_sparsity: int = 0          # N > 0: SparseFF, blocks of N (§3.1).
  d_lowrank: int = 64
  ff_temperature: float = 0.1
  ff_quant_prob: float = 0.3
  store_decisions: bool = False  # SparseFF keeps its choices for a re-run.
  reversible: bool = False      # 'terraformer': reversible half-residuals.
  d_sru: int = 0                # 'terraformer': SRU width (0: no SRU).
  local_conv_len: int = 0       # 'transformer': LocalConv width (0: none).
  cross_attention_sparsity: int = 0  # 'transformer': sparse queries.

  def __post_init__(self):
    if self.layout not in LAYOUTS:
      raise ValueError(f'layout must be one of {LAYOUTS}, got {self.layout!r}')
    if isinstance(self.local_conv_len, bool) or not isinstance(
        self.local_conv_len, int) or self.local_conv_len < 0:
      raise TerraformerError(f'local_conv_len must be an integer >= 0, got '
                             f'{self.local_conv_len!r}')

  def residual(self, *layers, branch=None):
    """x -> x + layers(x): `tl.Residual`, or the reversible half-residual;
    its branch f (the Serial of `layers`) marked as the composition `branch`
    (`layers.composites`) when given, a tl.Residual as RESIDUAL."""
    if self.layout == 'terraformer':
      half = rev.HalfResidual(*layers, reversible=self.reversible)
      if branch:
        composites.mark(half.sublayers[0], branch)
      return half
    f = tl.Serial(*layers)  # What tl.Residual(*layers) makes of them.
    f = f.sublayers[0] if len(f.sublayers) == 1 else f
    if branch:
      composites.mark(f, branch)
    return composites.mark(tl.Residual(f), composites.RESIDUAL)

  def dropout_layer(self):
    return tl.Dropout(rate=self.dropout, mode=self.mode)

  def attention_layer(self, index=0):
    """The stack's self-attention; `index` (the block's) offsets LSH's
    evaluation key, so that each block hashes with its own."""
    options = dict(self.attention)
    if options.get('lsh_eval_seed') is not None:
      options['lsh_eval_seed'] += index
    build = (SelfAttention if self.layout == 'terraformer'
             else TransformerSelfAttention)
    return build(self.d_model, self.n_heads, causal=self.causal,
                 dropout=self.dropout, mode=self.mode, **options)

  def attention_block(self, index=0):
    """x + Dropout(Attention(LayerNorm(x))); what attention reads beside x
    (lengths, a mask) passes around the LayerNorm."""
    norm = (tl.Parallel(tl.LayerNorm(), []) if self.layout == 'terraformer'
            else tl.LayerNorm())
    return self.residual(norm, self.attention_layer(index),
                         self.dropout_layer(), branch=composites.NORM_BRANCH)

  def feed_forward(self):
    """x -> y: SparseFF (§3.1) or Dense, ReLU, Dense with dropout."""
    if self.ff_sparsity:
      return SparseFF(self.d_ff, self.ff_sparsity, self.d_lowrank,
                      temperature=self.ff_temperature,
                      quant_prob=self.ff_quant_prob, mode=self.mode,
                      store_decisions=self.store_decisions)
    if self.layout == 'terraformer':
      return tl.Serial(tl.Dense(self.d_ff), tl.Relu(), self.dropout_layer(),
                       tl.Dense(self.d_model))
    # Trax's _FeedForward: its dropout mask is shared along the length axis.
    return tl.Serial(tl.Dense(self.d_ff),
                     tl.Dropout(rate=self.dropout, shared_axes=[-2],
                                mode=self.mode),
                     tl.Relu(), tl.Dense(self.d_model))

  def feed_forward_block(self):
    """x + Dropout(FF(LayerNorm(x))), + SRU-path(LayerNorm'(x)) with d_sru.

    A decoder's SRU reads (x, len_e): its decoding state is taken at each
    example's last real position (`PerExamplePrefill`).
    """
    ff_path = [tl.LayerNorm(), self.feed_forward(), self.dropout_layer()]
    if not self.d_sru:
      return self.residual(*ff_path, branch=composites.NORM_BRANCH)
    sru = LowRankSRU(self.d_model, self.d_sru, mode=self.mode)
    if self.causal:                              # x len_e
      ff_branch = composites.mark(tl.Serial(tl.Select([0], n_in=2), *ff_path),
                                  composites.NORM_BRANCH)
      return self.residual(
          tl.Branch(ff_branch,
                    [tl.Parallel(tl.LayerNorm(), []),
                     PerExamplePrefill(sru, self.mode)]),
          tl.Add(), branch=composites.SRU_FEED_FORWARD)
    ff_branch = composites.mark(tl.Serial(*ff_path), composites.NORM_BRANCH)
    return self.residual(tl.Branch(ff_branch, [tl.LayerNorm(), sru]),
                         tl.Add())

  def local_conv_block(self):
    """[] or x + Dropout(LocalConv(LayerNorm(x))) (a mask passes under)."""
    if not self.local_conv_len:
      return []
    return self.residual(tl.LayerNorm(),
                         LocalConv(self.d_model, self.local_conv_len,
                                   self.mode), self.dropout_layer())

  def cross_attention_block(self):
    """(x_dec, mask, x_enc) -> (x_dec + Dropout(cross_attention(LayerNorm(
    x_dec), x_enc, mask)), mask, x_enc)."""
    return self.residual(tl.LayerNorm(),
                         tl.Select([0, 2, 1, 2]),  # vec_d vec_e mask vec_e
                         self.cross_attention(),   # y mask vec_e
                         self.dropout_layer(),
                         branch=composites.CROSS_ATTENTION_BRANCH)

  def cross_attention(self):
    """(x_dec, x_enc, mask) -> (y, mask).

    Trax's `AttentionQKV(cache_KV_in_predict=True, q_sparsity=S,
    result_sparsity='noop')`, its `tl.PureAttention` a `CrossAttention`
    (the same math; decoding splits the cached keys and values into heads
    once; gin `cross_attention_split_once.enabled = False` keeps Trax's).
    Keys and values come from the encoder and are computed once per input
    (cached in predict mode), so they stay dense, as in the paper's decoding
    cost analysis (§1); sparse attention makes the queries sparse (a 3 x 3
    causal convolution, as Trax) and drops the output layer.
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
    attention = tl.Serial(
        tl.Parallel(queries, keys_values),       # q k v mask
        EncoderDecoderAttention(n_heads=self.n_heads, dropout=self.dropout,
                                mode=self.mode),  # y mask
        output,
    )
    if self.cross_attention_sparsity:
      composites.mark(attention, composites.SPARSE_QUERY_CROSS_ATTENTION)
    return attention


def Embedder(embedding, positions, *, dropout, mode, dropout_shared_axes=None):
  """Tokens -> vectors: `embedding`, dropout, then the `positions` layer.

  `dropout_shared_axes`: axes along which the dropout mask is shared (None:
  none).
  """
  return [embedding,
          tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode),
          positions]


def Logits(vocab_size, loss_sparsity):
  """Vectors -> logits: dense, or the sparse output layer (§3.4)."""
  if loss_sparsity:
    return SparseLogits(vocab_size, loss_sparsity)
  return tl.Dense(vocab_size)


def CachedInPredict(layer, mode):
  """Runs `layer` once in predict mode and reuses its outputs (tl.Cache).

  Other modes wrap it in a one-layer Serial, so that the weight trees of all
  modes have the same structure as tl.Cache's.
  """
  return tl.Cache(layer) if mode == 'predict' else tl.Serial(layer)


def EncodeOnce(encoder, mode):
  """(tok_e, tok_d) -> (encoder(tok_e)..., tok_d, tok_d).

  The encoder of an encoder-decoder model, run once per input when decoding
  token by token (`CachedInPredict`); the targets are kept twice, for the
  decoder and for the loss.
  """
  return [tl.Select([0, 1, 1]),                  # tok_e tok_d tok_d
          CachedInPredict(encoder, mode)]
