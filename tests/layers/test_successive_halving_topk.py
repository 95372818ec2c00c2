"""Successive Halving Top-k (Pietruszka et al. §4, Algorithm 1, App. B)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import shapes

from terraformer.errors import TerraformerError
from terraformer.layers.successive_halving_topk import RepresentationPooling
from terraformer.layers import successive_halving_topk as sh

# Jitted: one compiled program per shape instead of op-by-op dispatch.
successive_halving_topk = jax.jit(
    sh.successive_halving_topk,
    static_argnames=('k', 'peaked', 'base', 'sort', 'keep_order'))


def _nccs(true, approx):
  """App. B.5: (1/k) Σ_i max_j cos(y_i, ŷ_j), averaged over the batch."""
  true = true / np.linalg.norm(true, axis=-1, keepdims=True)
  approx = approx / np.linalg.norm(approx, axis=-1, keepdims=True)
  return np.mean(np.max(np.einsum('bid,bjd->bij', true, approx), axis=-1))


def _exact_topk(vectors, scores, k):
  """numpy: the k highest-scoring vectors, in their original order."""
  index = np.sort(np.argsort(-scores, axis=1)[:, :k], axis=1)
  return np.take_along_axis(vectors, index[..., None], axis=1), index


def _random_inputs(batch=4, n=256, d=32, seed=0):
  rng = np.random.RandomState(seed)
  # App. B.5: E_ij ~ U[-1, 1], v_i ~ U[0, 1].
  return (rng.uniform(-1, 1, (batch, n, d)).astype(np.float32),
          rng.uniform(0, 1, (batch, n)).astype(np.float32))


def test_close_to_exact_topk_and_sorting_helps():
  vectors, scores = _random_inputs()
  k = 16
  true, _ = _exact_topk(vectors, scores, k)
  similarity = {}
  for sort in (True, False):
    pooled = successive_halving_topk(vectors, scores, k=k, peaked=True,
                                     sort=sort)[0]
    similarity[sort] = _nccs(true, np.asarray(pooled))
  # Paper App. B.5 / Fig. 6: close to the real top-k with sorting; sorting
  # removes a large part of the error (45% on average in the paper).
  assert similarity[True] > 0.9
  assert 1 - similarity[True] < 0.6 * (1 - similarity[False])
  # Random k vectors for scale: nCCS well below the operator's.
  random_k = vectors[:, :k]
  assert _nccs(true, random_k) < similarity[True] - 0.2


@pytest.mark.parametrize('peaked', [True, False])
def test_separated_scores_select_exactly_the_topk_in_order(peaked):
  vectors, _ = _random_inputs(batch=3, n=32, d=8, seed=1)
  rng = np.random.RandomState(2)
  ranks = np.stack([rng.permutation(32) for _ in range(3)]).astype(np.float32)
  # Gaps so large that each pair weight is 0 or 1: the hard top-k.
  scores = ranks / 31.0 if peaked else ranks * 50.0
  base = 1e6 if peaked else 20.0
  pooled, _, mask, positions = successive_halving_topk(
      vectors, scores, k=4, peaked=peaked, base=base)
  true, index = _exact_topk(vectors, scores, 4)
  np.testing.assert_array_equal(np.asarray(positions), index)
  np.testing.assert_allclose(np.asarray(pooled), true, atol=1e-5)
  assert np.all(np.asarray(mask))


def test_one_round_pairs_best_with_worst():
  # n = 4, k = 2: sorted (s0 > s1 > s2 > s3) pairs (0, 3) and (1, 2), eq. 5-6.
  vectors = np.arange(4 * 2, dtype=np.float32).reshape(1, 4, 2)
  scores = np.array([[0.1, 0.9, 0.4, 0.6]], np.float32)
  pooled, pooled_scores, _, positions = successive_halving_topk(
      vectors, scores, 2, peaked=False)
  w_best = 1 / (1 + np.exp(0.1 - 0.9))            # (0.9 vs 0.1)
  w_second = 1 / (1 + np.exp(0.4 - 0.6))          # (0.6 vs 0.4)
  best = w_best * vectors[0, 1] + (1 - w_best) * vectors[0, 0]
  second = w_second * vectors[0, 3] + (1 - w_second) * vectors[0, 2]
  # Winners at original positions 1 and 3: kept in that order.
  np.testing.assert_array_equal(np.asarray(positions), [[1, 3]])
  np.testing.assert_allclose(np.asarray(pooled)[0], [best, second],
                             rtol=1e-5)
  np.testing.assert_allclose(
      np.asarray(pooled_scores)[0],
      [w_best * 0.9 + (1 - w_best) * 0.1, w_second * 0.6 + (1 - w_second)
       * 0.4], rtol=1e-5)


@pytest.mark.parametrize('sort', [True, False])
def test_padding_never_selected(sort):
  vectors, scores = _random_inputs(batch=2, n=16, d=4, seed=3)
  mask = np.ones((2, 16), bool)
  mask[0, 5:] = False          # 5 real elements (> k): padding must vanish
  mask[1, 2:] = False          # 2 real elements (< k)
  vectors[~mask] = 1000.0      # padding would show up as huge values
  scores[~mask] = 1.0          # and would win on its scores
  pooled, _, pooled_mask, positions = successive_halving_topk(
      vectors, scores, k=4, mask=mask, sort=sort)
  pooled, pooled_mask = np.asarray(pooled), np.asarray(pooled_mask)
  positions = np.asarray(positions)
  np.testing.assert_array_equal(pooled_mask.sum(axis=1), [4, 2])
  assert np.all(np.abs(pooled[pooled_mask]) <= 1.0)
  assert np.all(mask[np.arange(2)[:, None], positions][pooled_mask])
  assert np.all(np.diff(positions, axis=1) > 0)   # original order


def test_gradients_reach_the_scorer():
  vectors, _ = _random_inputs(batch=2, n=16, d=8, seed=4)
  mask = np.ones((2, 16), bool)
  layer = RepresentationPooling(4)
  layer.init((shapes.signature(vectors), shapes.signature(mask)),
             rng=jax.random.PRNGKey(0))
  target = np.random.RandomState(5).randn(2, 4, 8).astype(np.float32)

  def loss(weights):
    (pooled, _), _ = layer.pure_fn((vectors, mask), weights, layer.state,
                                   jax.random.PRNGKey(0))
    return jnp.sum((pooled - target) ** 2)

  grads = jax.jit(jax.grad(loss))(layer.weights)
  scorer_w, scorer_b = jax.tree_util.tree_leaves(grads)
  assert np.linalg.norm(np.asarray(scorer_w)) > 1e-6
  assert abs(float(scorer_b)) > 1e-8

  # Hard top-k (App. B.1 eq. 4): no gradient w.r.t. the scores.
  def hard_loss(scores):
    _, index = jax.lax.top_k(scores, 4)
    pooled = jnp.take_along_axis(vectors, index[..., None], axis=1)
    return jnp.sum((pooled - target) ** 2)
  assert not np.any(np.asarray(jax.jit(jax.grad(hard_loss))(
      jnp.asarray(np.random.RandomState(6).rand(2, 16), jnp.float32))))


@pytest.mark.parametrize('k_same', [16, 32])
def test_layer_shapes_and_identity_when_k_reaches_n(k_same):
  """k >= n: nothing to pool (an input shorter than the schedule's)."""
  vectors, _ = _random_inputs(batch=2, n=16, d=8, seed=6)
  mask = np.ones((2, 16), bool)
  mask[1, 10:] = False
  layer = RepresentationPooling(4)
  layer.init((shapes.signature(vectors), shapes.signature(mask)))
  pooled, pooled_mask = layer((vectors, mask))
  assert pooled.shape == (2, 4, 8) and pooled_mask.shape == (2, 4)
  same = RepresentationPooling(k_same)
  same.init((shapes.signature(vectors), shapes.signature(mask)))
  out, out_mask = same((vectors, mask))
  np.testing.assert_array_equal(np.asarray(out), vectors)
  np.testing.assert_array_equal(np.asarray(out_mask), mask)


@pytest.mark.parametrize('n,k', [(12, 4), (10, 4), (16, 3)])
def test_ratio_not_a_power_of_two_is_an_error(n, k):
  vectors = np.zeros((1, n, 2), np.float32)
  with pytest.raises(TerraformerError, match='power of 2'):
    successive_halving_topk(vectors, np.zeros((1, n), np.float32), k=k)
  with pytest.raises(TerraformerError, match='power of 2'):
    successive_halving_topk(vectors, np.zeros((1, n), np.float32), k=2 * n)
  layer = RepresentationPooling(k)
  with pytest.raises(Exception, match='power of 2'):
    layer.init((shapes.signature(vectors),
                shapes.ShapeDtype((1, n), bool)))


# ---------------------------------------------------------------------------
# App. A's scorer ablation (Table 4): `RepresentationPooling(scorer=...)`.


def _pool(scorer, vectors, mask, k, rng=0, **kwargs):
  """(pooled, pooled mask, winners' positions or None) of one call."""
  layer = RepresentationPooling(k, scorer=scorer, **kwargs)
  layer.init((shapes.signature(vectors), shapes.signature(mask)),
             rng=jax.random.PRNGKey(rng))
  with sh.recording_selections() as selected:
    (pooled, pooled_mask), _ = layer.pure_fn(
        (vectors, mask), layer.weights, layer.state, jax.random.PRNGKey(rng))
  positions = np.asarray(selected[0]) if selected else None
  return np.asarray(pooled), np.asarray(pooled_mask), positions


def _scorer_of(pooling):
  """The scorer of a RepresentationPooling: Branch([], scorer) is
  Serial(Select, Parallel([], scorer))."""
  branch = pooling.sublayers[0]
  return branch.sublayers[1].sublayers[1]


def test_index_scorer_keeps_every_stride_th_position():
  # n = 8, k = 2: scores 1 at positions 0 and 4 (i ≡ 0 mod n/k = 4), 0
  # elsewhere. Round 1 pairs 0 with 7 and 4 with 6 (weights σ(20 - 1) ≈ 1),
  # round 2 pairs them with the 0-score mixtures: outputs E_0, E_4.
  vectors = np.arange(8 * 3, dtype=np.float32).reshape(1, 8, 3)
  pooled, pooled_mask, positions = _pool(
      'index', vectors, np.ones((1, 8), bool), 2)
  np.testing.assert_array_equal(positions, [[0, 4]])
  np.testing.assert_allclose(pooled[0], vectors[0, [0, 4]], atol=1e-5)
  assert pooled_mask.all()


@pytest.mark.parametrize('reduce,expected', [
    ('mean', [[1.5, 7.5], [5.0, 2.0]]),
    ('max', [[3.0, 20.0], [6.0, 4.0]])])
def test_window_pooling_reduces_windows_of_n_over_k(reduce, expected):
  # n = 8, k = 2: windows [0:4] and [4:8], the second one's last two
  # elements padding (left out of the mean and the max).
  vectors = np.array([[[0, 0], [1, 20], [2, 10], [3, 0],
                       [4, 0], [6, 4], [99, 99], [99, 99]]], np.float32)
  mask = np.array([[1, 1, 1, 1, 1, 1, 0, 0]], bool)
  pooled, pooled_mask, positions = _pool(reduce, vectors, mask, 2)
  np.testing.assert_allclose(pooled[0], expected, rtol=1e-6)
  np.testing.assert_array_equal(pooled_mask, [[True, True]])
  assert positions is None  # Nothing is selected.


def test_window_pooling_of_padding_only_is_zero_and_masked():
  vectors = np.full((1, 8, 2), 7.0, np.float32)
  mask = np.array([[1, 1, 0, 0, 0, 0, 0, 0]], bool)   # window 2: padding
  for reduce in ('mean', 'max'):
    pooled, pooled_mask, _ = _pool(reduce, vectors, mask, 2)
    np.testing.assert_array_equal(pooled[0], [[7.0, 7.0], [0.0, 0.0]])
    np.testing.assert_array_equal(pooled_mask, [[True, False]])


def test_random_scorer_draws_uniform_scores_per_call():
  vectors = np.zeros((2, 64, 4), np.float32)
  layer = sh.RandomScorer()
  layer.init(shapes.signature(vectors), rng=jax.random.PRNGKey(0))
  assert not layer.weights
  draws = [np.asarray(layer.pure_fn(vectors, (), (), jax.random.PRNGKey(s))[0])
           for s in (1, 1, 2)]
  assert draws[0].shape == (2, 64)
  assert np.all((draws[0] >= 0) & (draws[0] < 1)) and draws[0].std() > 0.2
  np.testing.assert_array_equal(draws[0], draws[1])   # The rng decides.
  assert np.abs(draws[0] - draws[2]).max() > 0.1
  # Through the operator: the kept positions follow the draw, not the
  # vectors; a separated draw keeps the top-k of U[0, 1) scores.
  x = np.random.RandomState(0).randn(2, 64, 4).astype(np.float32)
  kept = {s: _pool('random', x, np.ones((2, 64), bool), 8, rng=s)[2]
          for s in (3, 4)}
  assert not np.array_equal(kept[3], kept[4])


def test_nonlinear_scorer_is_robertas_head():
  # d = 2, h = 2: S(e) = tanh(eᵀW1 + b1)·w2 + b2 by hand.
  layer = sh.NonlinearScorer(sigmoid=False)
  x = np.array([[[1.0, 0.0], [0.0, 2.0]]], np.float32)
  layer.init(shapes.signature(x))
  w1 = np.array([[1.0, -1.0], [0.5, 0.0]], np.float32)
  b1 = np.array([0.0, 1.0], np.float32)
  w2 = np.array([2.0, 3.0], np.float32)
  layer.weights = (w1, b1, w2, np.float32(0.25))
  # e = (1, 0): tanh(1, 0) -> 2 tanh(1) + 0.25; e = (0, 2): tanh(1, 1).
  expected = [[2 * np.tanh(1.0) + 0.25, 5 * np.tanh(1.0) + 0.25]]
  np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-6)
  peaked = sh.NonlinearScorer()
  peaked.init(shapes.signature(x))
  peaked.weights = layer.weights
  np.testing.assert_allclose(np.asarray(peaked(x)),
                             1 / (1 + np.exp(-np.array(expected))) + 1e-5,
                             rtol=1e-6)


@pytest.mark.parametrize('scorer', ['linear', 'nonlinear'])
def test_trained_scorers_get_gradients_and_may_read_the_norm(scorer):
  vectors, _ = _random_inputs(batch=2, n=16, d=8, seed=4)
  mask = np.ones((2, 16), bool)
  target = np.random.RandomState(5).randn(2, 4, 8).astype(np.float32)
  for scorer_norm, n_weights in ((False, {'linear': 2, 'nonlinear': 4}),
                                 (True, {'linear': 4, 'nonlinear': 6})):
    layer = RepresentationPooling(4, scorer=scorer, scorer_norm=scorer_norm)
    layer.init((shapes.signature(vectors), shapes.signature(mask)),
               rng=jax.random.PRNGKey(0))

    def loss(weights, layer=layer):
      (pooled, _), _ = layer.pure_fn((vectors, mask), weights, layer.state,
                                     jax.random.PRNGKey(0))
      return jnp.sum((pooled - target) ** 2)

    grads = jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(layer.weights))
    assert len(grads) == n_weights[scorer]
    assert all(np.linalg.norm(np.asarray(g)) > 1e-8 for g in grads)
  # The norm changes what the scorer reads: a stream scaled by 10 gives the
  # linear scorer other scores, its LayerNorm the same ones.
  for scorer_norm in (False, True):
    layer = RepresentationPooling(4, scorer=scorer, scorer_norm=scorer_norm)
    layer.init((shapes.signature(vectors), shapes.signature(mask)),
               rng=jax.random.PRNGKey(1))
    score = _scorer_of(layer)
    same = np.allclose(np.asarray(score(vectors * 10.0)),
                       np.asarray(score(vectors)), atol=1e-4)
    assert same == scorer_norm


def test_default_scorer_is_the_linear_layer_as_before():
  layer = RepresentationPooling(4)
  assert isinstance(_scorer_of(layer), sh.LinearScorer)
  assert isinstance(layer.sublayers[1], sh.SuccessiveHalvingTopK)
  with pytest.raises(TerraformerError, match='scorer must be one of'):
    RepresentationPooling(4, scorer='power')
