"""Successive Halving Top-k operator and its scorer: trainable pooling.

Pietruszka et al., "Sparsifying Transformer Models with Trainable
Representation Pooling" (ACL 2022), §3.1, §4 and App. B (Algorithm 1).

A scorer gives each of the n representations E_i a score v_i (§3.1, the
linear scorer S(e) = eᵀw + b of App. A). The operator Γ: R^{n×d} × R^n ->
R^{k×d} then runs log2(n/k) rounds of (Algorithm 1):

  SORT        permute E and v together so that v is descending;
  TOURNAMENT  pair the i-th best with the i-th worst, (i, n+1-i), and replace
              each pair by its convex combination
                E'_i = w_i E_i + (1 - w_i) E_{n+1-i},
                v'_i = w_i v_i + (1 - w_i) v_{n+1-i}        (App. B.3 eq. 5),
              w_i a softmax over the pair's scores.

Two forms of w (a switch, `peaked`):
  plain   w_i = e^{v_i} / (e^{v_i} + e^{v_{n+1-i}})        (App. B.3 eq. 6);
  peaked  the "PeakedSoftmax" of §4 as the authors' code computes it: the
          scores are sigmoid(S(e)) in (0, 1) and the pair's softmax is taken
          over base^{v} (base 20), w_i = σ(base^{v_i} − base^{v_{n+1-i}});
          the new score mixes the raw v, not base^v.

Gradients reach the scorer through w only; sorting is a constant
permutation (App. B.1 eq. 4, B.3-B.4). Padding always loses: it is sorted
last and its weight in a pair with a real element is exactly 0, so a padding
vector never enters an output whose pair held a real one. The output keeps
the original order of the selected elements (§3.1: "in line with their
original position"): each output carries the original position of its
pair's winner, and the k outputs are sorted by it at the end (`keep_order`).
n and k are static Python ints; n/k must be a power of 2 (App. B.3).

The scorers of App. A's ablation (Table 4) are a switch of
`RepresentationPooling` (`scorer`): 'linear' (the paper's, the default),
'nonlinear' (RoBERTa's classification head), 'random' (uniform scores, a
new draw per call), 'index' (1 on every (n/k)-th position, 0 elsewhere),
each followed by the operator, and 'mean' / 'max' (windows of n/k, stride
n/k, no scorer and no operator). `scorer_norm` lets a trained scorer read
the LayerNorm of the stream instead of the pre-norm residual stream itself
(the authors' post-norm encoder hands the scorer normalized vectors).
"""
import contextlib
import math

import gin
import jax
import jax.numpy as jnp
from trax import layers as tl
from trax.layers import initializers as init

from terraformer.errors import TerraformerError

PEAKED_BASE = 20.0


def halving_rounds(n, k):
  """log2(n / k), the number of tournament rounds; TerraformerError if none.

  App. B.3 assumes n and k powers of 2; what the operator needs is that the
  ratio n / k is one (each round halves the sequence exactly).
  """
  if not (isinstance(n, int) and isinstance(k, int)) or k < 1 or n < 1:
    raise TerraformerError(f'top-k pooling needs positive integer lengths, '
                           f'got n={n!r}, k={k!r}')
  if n % k or (n // k) & (n // k - 1):
    raise TerraformerError(
        f'successive-halving top-k pools n={n} representations to k={k}: '
        f'the ratio n/k must be a power of 2 (1, 2, 4, ...), got {n / k:g}')
  return int(math.log2(n // k))


def _take(values, indices):
  """values[b, indices[b, j], ...] for [B, n, ...] values, [B, m] indices."""
  index = indices.reshape(indices.shape + (1,) * (values.ndim - 2))
  return jnp.take_along_axis(values, index, axis=1)


def successive_halving_topk(vectors, scores, k, mask=None, peaked=True,
                            base=PEAKED_BASE, sort=True, keep_order=True):
  """Soft top-k of Algorithm 1, batched: (E, v) -> (E', v', mask', positions).

  Args:
    vectors: [B, n, d] representations E.
    scores: [B, n] scores v (in (0, 1) for the peaked form).
    k: output length; n / k must be a power of 2.
    mask: [B, n] bool, True on real elements; None: all real.
    peaked: True: w = σ(base^{v_a} − base^{v_b}) (the authors' code);
      False: w = σ(v_a − v_b), the pair softmax of App. B.3 eq. 6.
    base: base of the peaked form.
    sort: sort by score before each round (Algorithm 1); False pairs the
      elements (i, n+1-i) in their current order (App. B.2/B.5 "w/o sorting").
    keep_order: sort the k outputs by the original position of their winners.

  Returns:
    pooled [B, k, d], pooled scores [B, k], pooled mask [B, k] (True where
    the pair held a real element), positions [B, k] (int32, the original
    index of each output's winner).
  """
  batch, n = scores.shape
  rounds = halving_rounds(n, k)
  if mask is None:
    mask = jnp.ones((batch, n), dtype=bool)
  mask = mask.astype(bool)
  positions = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
  for _ in range(rounds):
    if sort:
      # Padding sorts last; ties keep the current order (stable sort).
      key = jnp.where(mask, scores, -jnp.inf)
      order = jnp.argsort(-key, axis=1, stable=True)
      vectors, scores = _take(vectors, order), _take(scores, order)
      mask, positions = _take(mask, order), _take(positions, order)
    half = scores.shape[1] // 2
    # Pair i with n - 1 - i: the best with the worst (Algorithm 1, l. 20).
    a = slice(0, half)
    v_a, v_b = scores[:, a], scores[:, half:][:, ::-1]
    m_a, m_b = mask[:, a], mask[:, half:][:, ::-1]
    e_a, e_b = vectors[:, a], vectors[:, half:][:, ::-1]
    p_a, p_b = positions[:, a], positions[:, half:][:, ::-1]
    if peaked:
      w_a = jax.nn.sigmoid(jnp.power(base, v_a) - jnp.power(base, v_b))
    else:
      w_a = jax.nn.sigmoid(v_a - v_b)
    # Padding loses: weight 0 against a real element.
    w_a = jnp.where(m_a & ~m_b, 1.0, jnp.where(m_b & ~m_a, 0.0, w_a))
    w_a = w_a.astype(vectors.dtype)
    w_b = 1.0 - w_a
    vectors = w_a[..., None] * e_a + w_b[..., None] * e_b
    scores = w_a * v_a + w_b * v_b
    a_wins = w_a >= 0.5
    positions = jnp.where(a_wins, p_a, p_b)
    mask = m_a | m_b
  if keep_order and rounds:
    order = jnp.argsort(positions, axis=1)
    vectors, scores = _take(vectors, order), _take(scores, order)
    mask, positions = _take(mask, order), _take(positions, order)
  return vectors, scores, mask, positions


def hard_topk(vectors, scores, k, keep_order=True):
  """Exact top-k (App. B.1 eq. 2): the k highest-scoring vectors, [B, k, d]."""
  _, indices = jax.lax.top_k(scores, k)
  if keep_order:
    indices = jnp.sort(indices, axis=1)
  return _take(vectors, indices)


# Open `recording_selections()` lists: each SuccessiveHalvingTopK call adds
# its winners' positions to every one (nothing is done when none is open).
_SELECTION_SINKS = []


@contextlib.contextmanager
def recording_selections():
  """Collects which input positions each pooling's operator selects.

  Yields a list that every `SuccessiveHalvingTopK` run while the block is
  open appends to, in call order (the encoder's first pooling first): the
  original positions [B, k] (int32) of its k outputs' winners (the element
  that outweighed its partner in every round). Inside `jax.jit` the
  entries are the traced values: return them from the jitted function.
  Window pooling ('mean' / 'max') selects nothing and adds nothing.
  """
  sink = []
  _SELECTION_SINKS.append(sink)
  try:
    yield sink
  finally:
    _SELECTION_SINKS.remove(sink)


@gin.configurable(module='terraformer')
class SuccessiveHalvingTopK(tl.Layer):
  """(E [B, n, d], v [B, n], mask [B, n]) -> (pooled [B, k, d], mask [B, k]).

  The operator of Algorithm 1 as a weightless layer; the scores come from a
  scorer (see `RepresentationPooling`). A sequence of n <= k passes
  unchanged (nothing to pool: shorter inputs than the schedule expects).
  """

  def __init__(self, k, peaked=True, base=PEAKED_BASE, sort=True,
               keep_order=True):
    super().__init__(n_in=3, n_out=2, name=f'SuccessiveHalvingTopK_{k}')
    if not isinstance(k, int) or k < 1:
      raise TerraformerError(f'top-k pooling length must be a positive '
                             f'integer, got {k!r}')
    self._k = k
    self._peaked = peaked
    self._base = base
    self._sort = sort
    self._keep_order = keep_order

  def forward(self, inputs):
    vectors, scores, mask = inputs
    if vectors.shape[1] <= self._k:
      return vectors, mask
    pooled, _, pooled_mask, positions = successive_halving_topk(
        vectors, scores, self._k, mask, self._peaked, self._base, self._sort,
        self._keep_order)
    for sink in _SELECTION_SINKS:
      sink.append(positions)
    return pooled, pooled_mask


@gin.configurable(module='terraformer')
class LinearScorer(tl.Layer):
  """x [B, n, d] -> v [B, n]: S(e) = eᵀw + b (§3.1, App. A).

  With `sigmoid` (the peaked operator's input) v = σ(eᵀw + b) + 1e-5, in
  (0, 1], as in the authors' code.
  """

  def __init__(self, sigmoid=True,
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(name='LinearScorer')
    self._sigmoid = sigmoid
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    w, b = self.weights
    v = jnp.einsum('bnd,d->bn', x, w) + b
    return jax.nn.sigmoid(v) + 1e-5 if self._sigmoid else v

  def init_weights_and_state(self, input_signature):
    d = input_signature.shape[-1]
    rng_w, rng_b = jax.random.split(self.rng)
    w = self._kernel_initializer((d, 1), rng_w)[:, 0]
    b = self._bias_initializer((1,), rng_b)[0]
    self.weights = (w, b)


@gin.configurable(module='terraformer')
class NonlinearScorer(tl.Layer):
  """x [B, n, d] -> v [B, n]: S(e) = tanh(eᵀW1 + b1)·w2 + b2 (App. A).

  The "nonlinear" scorer of Table 4, RoBERTa's classification head (Liu et
  al., 2019): W1 [d, h] (h = `d_hidden`, None: d, as RoBERTa's head), b1
  [h], w2 [h], b2 a scalar (the paper's "w1 ∈ R^d" would give a scalar
  tanh, so we read W1 as RoBERTa's d x d dense layer). With `sigmoid`, as
  `LinearScorer`: v = σ(S(e)) + 1e-5 for the peaked operator.
  """

  def __init__(self, sigmoid=True, d_hidden=None,
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(name='NonlinearScorer')
    self._sigmoid = sigmoid
    self._d_hidden = d_hidden
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    w1, b1, w2, b2 = self.weights
    hidden = jnp.tanh(jnp.einsum('bnd,dh->bnh', x, w1) + b1)
    v = jnp.einsum('bnh,h->bn', hidden, w2) + b2
    return jax.nn.sigmoid(v) + 1e-5 if self._sigmoid else v

  def init_weights_and_state(self, input_signature):
    d = input_signature.shape[-1]
    h = self._d_hidden or d
    rng_w1, rng_b1, rng_w2, rng_b2 = jax.random.split(self.rng, 4)
    self.weights = (self._kernel_initializer((d, h), rng_w1),
                    self._bias_initializer((h,), rng_b1),
                    self._kernel_initializer((h, 1), rng_w2)[:, 0],
                    self._bias_initializer((1,), rng_b2)[0])


class RandomScorer(tl.Layer):
  """x [B, n, d] -> v [B, n] ~ U[0, 1): the "random" scorer of App. A.

  A new draw at every call (the layer's rng, as Dropout's); no weights, so
  no gradient. The scores lie in the peaked operator's range.
  """

  def __init__(self):
    super().__init__(name='RandomScorer')

  def forward(self, x):
    return jax.random.uniform(self.rng, x.shape[:2], x.dtype)


class IndexScorer(tl.Layer):
  """x [B, n, d] -> v [B, n]: the "index-based" scorer of App. A.

  v_i = 1 when i ≡ 0 (mod n/k), else 0 (i the position in the sequence
  being pooled; the paper's "nonzero for every k-th token" names the stride
  k, ours is n/k for k outputs): the operator keeps every (n/k)-th vector,
  the paper's "groups of the four nearest token neighbors" at a 4x
  reduction. No weights.
  """

  def __init__(self, k):
    super().__init__(name=f'IndexScorer_{k}')
    self._k = k

  def forward(self, x):
    batch, n = x.shape[:2]
    stride = max(n // self._k, 1)
    v = (jnp.arange(n) % stride == 0).astype(x.dtype)
    return jnp.broadcast_to(v, (batch, n))


class WindowPooling(tl.Layer):
  """(x [B, n, d], mask [B, n]) -> (pooled [B, k, d], mask [B, k]).

  The "mean pooling" / "max pooling" baselines of App. A: windows of n/k
  consecutive vectors with stride n/k (4 and 4 at a 4x reduction), each
  reduced to its mean or its elementwise max over the window's real
  elements (padding is left out; a window of padding only gives 0 and a
  False mask). No scorer, no top-k. A sequence of n <= k passes unchanged,
  as `SuccessiveHalvingTopK`.
  """

  def __init__(self, k, reduce='mean'):
    super().__init__(n_in=2, n_out=2, name=f'WindowPooling_{reduce}_{k}')
    if reduce not in ('mean', 'max'):
      raise TerraformerError(f"window pooling reduces by 'mean' or 'max', "
                             f'got {reduce!r}')
    self._k = k
    self._reduce = reduce

  def forward(self, inputs):
    x, mask = inputs
    batch, n, d = x.shape
    if n <= self._k:
      return x, mask
    if n % self._k:
      raise TerraformerError(
          f'{self._reduce} pooling of n={n} representations to k={self._k}:'
          f' windows of n/k need k to divide n')
    window = n // self._k
    x = x.reshape(batch, self._k, window, d)
    real = mask.astype(bool).reshape(batch, self._k, window)
    any_real = real.any(axis=2)
    if self._reduce == 'mean':
      count = real.sum(axis=2, keepdims=True).astype(x.dtype)
      pooled = (x * real[..., None]).sum(axis=2) / jnp.maximum(count, 1.0)
    else:
      pooled = jnp.where(real[..., None], x, -jnp.inf).max(axis=2)
      pooled = jnp.where(any_real[..., None], pooled, 0.0).astype(x.dtype)
    return pooled, any_real


# App. A's scorers (Table 4), the values of `RepresentationPooling.scorer`.
SCORERS = ('linear', 'nonlinear', 'random', 'index', 'mean', 'max')


def _scorer_layer(scorer, k, peaked, scorer_norm):
  """The scorer x -> v of a `RepresentationPooling` that uses the operator."""
  if scorer == 'random':
    return RandomScorer()
  if scorer == 'index':
    return IndexScorer(k)
  layer = (LinearScorer(sigmoid=peaked) if scorer == 'linear'
           else NonlinearScorer(sigmoid=peaked))
  # The authors' post-norm layers hand the scorer normalized vectors; our
  # pre-norm stream is not normalized until the encoder's final LayerNorm.
  return [tl.LayerNorm(), layer] if scorer_norm else layer


@gin.configurable(module='terraformer')
def RepresentationPooling(k, peaked=True, base=PEAKED_BASE, sort=True,
                          keep_order=True, scorer='linear',
                          scorer_norm=False):
  """(x [B, n, d], mask [B, n]) -> (pooled [B, k, d], pooled mask [B, k]).

  Scores each representation with a linear scorer and keeps k of them with
  the Successive Halving Top-k operator (§3.1, §4, Algorithm 1); k = n is the
  identity. The pooled mask is True on outputs that contain a real element.

  `scorer` (App. A, Table 4): 'linear' (S(e) = eᵀw + b, the paper's; the
  default), 'nonlinear' (`NonlinearScorer`), 'random' (`RandomScorer`),
  'index' (`IndexScorer`), each followed by the operator; 'mean' / 'max'
  (`WindowPooling`: windows of n/k, stride n/k, instead of scorer and
  operator). `scorer_norm`: a trained scorer ('linear', 'nonlinear') reads
  LayerNorm(x) (its own gain and bias) instead of x; the pooled vectors are
  x either way.
  """
  if scorer not in SCORERS:
    raise TerraformerError(f'pooling scorer must be one of {SCORERS}, got '
                           f'{scorer!r}')
  if scorer in ('mean', 'max'):
    return tl.Serial(WindowPooling(k, scorer),
                     name=f'RepresentationPooling_{k}')
  return tl.Serial(                       # x mask
      tl.Branch([], _scorer_layer(scorer, k, peaked, scorer_norm)),  # x v mask
      SuccessiveHalvingTopK(k, peaked, base, sort, keep_order),
      name=f'RepresentationPooling_{k}')


def pooling_schedule(encoder_pooling, n_encoder_layers):
  """An encoder pooling schedule {layer: k} -> [(layer, k)] sorted by layer.

  As the reference code's `--enc-layers-and-token-width`: pool to k after
  encoder block `layer` (0-based). TerraformerError on a layer outside the
  encoder or lengths that do not shrink with depth.
  """
  if not encoder_pooling:
    return []
  schedule = sorted(dict(encoder_pooling).items())
  lengths = [k for _, k in schedule]
  for layer, k in schedule:
    if not (isinstance(layer, int) and 0 <= layer < n_encoder_layers):
      raise TerraformerError(
          f'encoder_pooling: layer {layer!r} is not an encoder block index '
          f'(0..{n_encoder_layers - 1})')
    if not (isinstance(k, int) and k > 0):
      raise TerraformerError(f'encoder_pooling: length {k!r} after layer '
                             f'{layer} is not a positive integer')
  if any(a <= b for a, b in zip(lengths, lengths[1:])):
    raise TerraformerError(f'encoder_pooling: lengths must shrink with '
                           f'depth, got {dict(schedule)}')
  return schedule
