"""Composite slice attention (Lee et al., ICLR 2023, §4.1-4.2, eq. 8-15)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from terraformer.errors import TerraformerError
from terraformer.layers.composite_slice_attention import (
    CompositeSliceAttention)

D, HEADS = 8, 2


def _softmax_attention(q, k, v):
  """Multi-head softmax(q kᵀ/√d_h) v for q [m, D], k, v [n, D]."""
  q, k, v = [a.reshape(a.shape[0], HEADS, -1) for a in (q, k, v)]
  dots = np.einsum('qhd,khd->hqk', q, k) / np.sqrt(D // HEADS)
  attn = np.exp(dots - dots.max(-1, keepdims=True))
  attn /= attn.sum(-1, keepdims=True)
  return np.einsum('hqk,khd->qhd', attn, v).reshape(q.shape[0], D)


def _numpy_csa(x, mask, weights, big_l, alpha, causal, use_global=True):
  """Eq. 11/12, 14, 15, 10 token by token, for one sequence x [N, D]."""
  wq, bq, wk, bk, wv, bv, wo, bo, p_local, p_global = weights
  n = x.shape[0]
  e = (alpha - 1) * big_l // 2
  local = np.zeros((n, D))
  for i in range(n):
    if not mask[i]:
      continue                   # padding queries: no output to check
    s, p = divmod(i, big_l)
    q = (x[i] + p_local[e + p]) @ wq + bq
    keys, values = [], []
    right = 0 if causal else e
    for j in range(s * big_l - e, s * big_l + big_l + right):
      if 0 <= j < n and mask[j] and (not causal or j <= i):
        keys.append((x[j] + p_local[j - s * big_l + e]) @ wk + bk)
        values.append(x[j] @ wv + bv)
    local[i] = _softmax_attention(q[None], np.array(keys),
                                  np.array(values))[0] @ wo + bo
  if not use_global:
    return local
  n_slices = -(-n // big_l)
  summary = np.zeros((n_slices, D))
  real = np.zeros(n_slices, bool)
  for s in range(n_slices):
    rows = [i for i in range(s * big_l, min(n, s * big_l + big_l)) if mask[i]]
    if rows:
      summary[s], real[s] = local[rows].mean(axis=0), True
  q = (summary + p_global[:n_slices]) @ wq + bq
  k = (summary + p_global[:n_slices]) @ wk + bk
  v = summary @ wv + bv
  out = local.copy()
  for t in range(n_slices):
    if causal:
      if t == 0:
        continue                 # no slice before the first
      g = _softmax_attention(q[t - 1][None], k[:t], v[:t])[0] @ wo + bo
    else:
      g = _softmax_attention(q[t][None], k[real], v[real])[0] @ wo + bo
    out[t * big_l:(t + 1) * big_l] += g
  return out


def _layer(x, big_l, alpha, causal, use_global=True, mode='eval',
           max_len=32, position_scale=20.0):
  layer = CompositeSliceAttention(D, HEADS, big_l, alpha, causal=causal,
                                  use_global=use_global, max_len=max_len,
                                  mode=mode)
  signature = (shapes.signature(x) if causal else
               (shapes.signature(x), shapes.ShapeDtype(x.shape[:2], bool)))
  layer.init(signature, rng=jax.random.PRNGKey(0))
  # Positional tables large enough to matter (they start at N(0, 0.02)).
  layer.weights = tuple(
      np.asarray(w) * (position_scale if i >= 8 else 1.0)
      for i, w in enumerate(layer.weights))
  return layer


@pytest.mark.parametrize('alpha', [1, 2, 3])
def test_bidirectional_matches_the_equations(alpha):
  rng = np.random.RandomState(alpha)
  x = rng.randn(2, 11, D).astype(np.float32)     # 11: last slice padded
  mask = np.ones((2, 11), bool)
  mask[1, 6:] = False                            # slice 2 fully padding
  layer = _layer(x, 4, alpha, causal=False)
  y = np.asarray(layer((x, mask)))
  weights = [np.asarray(w, np.float64) for w in layer.weights]
  for b in range(2):
    expected = _numpy_csa(x[b].astype(np.float64), mask[b], weights, 4,
                          alpha, causal=False)
    np.testing.assert_allclose(y[b][mask[b]], expected[mask[b]], rtol=2e-4,
                               atol=2e-4)


@pytest.mark.parametrize('alpha', [1, 3])
def test_causal_matches_the_equations(alpha):
  x = np.random.RandomState(10 + alpha).randn(1, 12, D).astype(np.float32)
  layer = _layer(x, 4, alpha, causal=True)
  weights = [np.asarray(w, np.float64) for w in layer.weights]
  expected = _numpy_csa(x[0].astype(np.float64), np.ones(12, bool), weights,
                        4, alpha, causal=True)
  np.testing.assert_allclose(np.asarray(layer(x))[0], expected, rtol=2e-4,
                             atol=2e-4)


def _with_zero_positions(layer, trax_layer):
  """Copies trax_layer's Q, K, V, O into `layer`, with P_l = P_g = 0."""
  leaves = [np.asarray(w) for w in jax.tree_util.tree_leaves(
      trax_layer.weights)]
  assert len(leaves) == 8
  layer.weights = tuple(leaves) + tuple(
      np.zeros_like(w) for w in layer.weights[8:])


def test_one_slice_without_global_is_full_attention():
  rng = np.random.RandomState(3)
  x = rng.randn(2, 8, D).astype(np.float32)
  mask = np.ones((2, 8), bool)
  mask[0, 5:] = False
  layer = _layer(x, 8, 1, causal=False, use_global=False)
  full = tl.Attention(D, HEADS, mode='eval')
  trax_mask = mask[:, None, None, :]
  full.init((shapes.signature(x), shapes.signature(trax_mask)),
            rng=jax.random.PRNGKey(1))
  _with_zero_positions(layer, full)
  expected, _ = full((x, trax_mask))
  np.testing.assert_allclose(np.asarray(layer((x, mask)))[mask],
                             np.asarray(expected)[mask], rtol=1e-4, atol=1e-4)

  causal = _layer(x, 8, 1, causal=True, use_global=False)
  full_causal = tl.CausalAttention(D, HEADS, mode='eval')
  full_causal.init(shapes.signature(x), rng=jax.random.PRNGKey(2))
  _with_zero_positions(causal, full_causal)
  np.testing.assert_allclose(np.asarray(causal(x)),
                             np.asarray(full_causal(x)), rtol=1e-4,
                             atol=1e-4)


def test_causal_has_no_gradient_from_future_tokens():
  x = np.random.RandomState(4).randn(1, 16, D).astype(np.float32)
  layer = _layer(x, 4, 3, causal=True)

  def output(x):
    y, _ = layer.pure_fn(x, layer.weights, layer.state, jax.random.PRNGKey(0))
    return y[0]

  jacobian = np.asarray(jax.jit(jax.jacrev(output))(jnp.asarray(x)))[:, :, 0]
  influence = np.abs(jacobian).sum(axis=(1, 3))      # [t, s]: dy_t / dx_s
  future = np.triu(np.ones((16, 16), bool), k=1)
  assert np.all(influence[future] == 0)
  # Token 14 (slice 3) sees slice 0 only through the global attention.
  assert np.all(influence[14, 0:4] > 0)
  # The first slice has no global term: nothing from before it to read.
  assert np.all(influence[:4][~future[:4]] > 0)


def _decode(layer, weights, chunks):
  """Runs the predict-mode layer on each chunk in turn (jitted, one state)."""
  step = jax.jit(layer.pure_fn)
  state, outputs = layer.state, []
  for chunk in chunks:
    y, state = step(chunk, weights, state, jax.random.PRNGKey(0))
    outputs.append(np.asarray(y))
  return np.concatenate(outputs, axis=1)


@pytest.mark.parametrize('alpha,use_global', [(3, True), (2, False)])
def test_predict_equals_eval_token_by_token(alpha, use_global):
  x = np.random.RandomState(5).randn(2, 11, D).astype(np.float32)
  evaluated = _layer(x, 4, alpha, causal=True, use_global=use_global)
  expected = np.asarray(evaluated(x))
  predict = _layer(x[:, :1], 4, alpha, causal=True, use_global=use_global,
                   mode='predict')
  weights = tuple(jnp.asarray(w) for w in evaluated.weights)
  tokens = [x[:, i:i + 1] for i in range(11)]
  np.testing.assert_allclose(_decode(predict, weights, tokens), expected,
                             rtol=1e-4, atol=1e-4)
  # A prompt of several positions, then single tokens.
  np.testing.assert_allclose(
      _decode(predict, weights, [x[:, :6]] + tokens[6:]), expected,
      rtol=1e-4, atol=1e-4)


def test_bad_settings_are_clear_errors():
  with pytest.raises(TerraformerError, match='extension'):
    CompositeSliceAttention(D, HEADS, slice_len=4, extension=4)
  with pytest.raises(TerraformerError, match='extension'):
    CompositeSliceAttention(D, HEADS, slice_len=5, extension=2)
  with pytest.raises(TerraformerError, match='predict'):
    CompositeSliceAttention(D, HEADS, causal=False, mode='predict')
  layer = CompositeSliceAttention(D, HEADS, slice_len=4, causal=True,
                                  max_len=8)
  layer.init(shapes.ShapeDtype((1, 8, D)))
  with pytest.raises(Exception, match='max_len'):
    layer(np.zeros((1, 12, D), np.float32))
