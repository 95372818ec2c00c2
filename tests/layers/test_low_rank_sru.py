"""SRU against a numpy loop of Lei et al.'s equations (Trax's form:
r, f, x̃ from one biased Dense; highway term scaled by √3); predict state."""
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer.layers import LowRankSRU
from terraformer.layers import SRU


def _sigmoid(z):
  return 1.0 / (1.0 + np.exp(-z))


def _sru_loop(x, w, b, activation, highway_scale=3 ** 0.5):
  """SRU step by step, float64."""
  x, w, b = (np.asarray(a, np.float64) for a in (x, w, b))
  n = x.shape[-1]
  g = np.tanh if activation == 'tanh' else (lambda c: c)
  c = np.zeros((x.shape[0], n))
  out = np.zeros_like(x)
  for t in range(x.shape[1]):
    x_t = x[:, t]
    z = x_t @ w + b
    r, f, x_tilde = _sigmoid(z[:, :n]), _sigmoid(z[:, n:2 * n]), z[:, 2 * n:]
    c = f * c + (1.0 - f) * x_tilde
    out[:, t] = r * g(c) + (1.0 - r) * x_t * highway_scale
  return out


def _random_weights(layer, n, seed):
  rng = np.random.RandomState(seed)
  # Biases far from 0 make f and r differ visibly from 1/2.
  return (rng.normal(0.0, 0.5, (n, 3 * n)).astype(np.float32),
          rng.normal(0.0, 1.0, (3 * n,)).astype(np.float32))


@pytest.mark.parametrize('activation,highway_scale',
                         [(None, 3 ** 0.5), ('tanh', 3 ** 0.5), (None, 1.0)])
def test_matches_the_equations(activation, highway_scale):
  x = np.random.RandomState(0).normal(size=(3, 37, 8)).astype(np.float32)
  layer = SRU(activation=activation, highway_scale=highway_scale)
  layer.init(shapes.signature(x))
  layer.weights = _random_weights(layer, 8, seed=1)
  expected = _sru_loop(x, *layer.weights, activation, highway_scale)
  np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=2e-5)
  # Recurrence reaches far: the last output depends on the first input.
  changed = x.copy()
  changed[:, 0] += 1.0
  assert not np.allclose(np.asarray(layer(changed))[:, -1],
                         np.asarray(layer(x))[:, -1], rtol=0, atol=1e-7)


def test_predict_continues_from_its_state():
  x = np.random.RandomState(2).normal(size=(2, 9, 4)).astype(np.float32)
  full = SRU(activation='tanh', mode='eval')
  full.init(shapes.signature(x))
  full.weights = _random_weights(full, 4, seed=3)
  expected = np.asarray(full(x))

  step = SRU(activation='tanh', mode='predict')
  step.init(shapes.ShapeDtype((2, 1, 4), np.float32))
  step.weights = full.weights
  # A chunk of 4 positions, then one position per call.
  outputs = [np.asarray(step(x[:, :4]))]
  outputs += [np.asarray(step(x[:, i:i + 1])) for i in range(4, 9)]
  np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected,
                             atol=1e-5)


def test_gradient_matches_the_loop():
  x = np.random.RandomState(4).normal(size=(2, 11, 4)).astype(np.float32)
  layer = SRU()
  layer.init(shapes.signature(x))
  w, b = _random_weights(layer, 4, seed=5)

  def loss(w, b):
    y, _ = layer.pure_fn(x, (w, b), layer.state, jax.random.PRNGKey(0))
    return (y ** 2).sum()

  grad_w, _ = jax.grad(loss, argnums=(0, 1))(w, b)
  eps, i, j = 1e-3, 1, 5
  w_plus, w_minus = w.copy(), w.copy()
  w_plus[i, j] += eps
  w_minus[i, j] -= eps
  numeric = ((_sru_loop(x, w_plus, b, None) ** 2).sum()
             - (_sru_loop(x, w_minus, b, None) ** 2).sum()) / (2 * eps)
  np.testing.assert_allclose(float(grad_w[i, j]), numeric, rtol=2e-3)


def test_low_rank_sru_projects_to_d_sru_and_back():
  x = np.zeros((2, 5, 64), np.float32)
  layer = LowRankSRU(64, d_sru=32)
  layer.init(shapes.signature(x))
  assert layer(x).shape == x.shape
  sizes = sorted(int(np.prod(w.shape)) for w in
                 jax.tree_util.tree_leaves(layer.weights))
  # Down (64x32 + 32), SRU (32x96 + 96), up (32x64 + 64).
  assert sizes == sorted([64 * 32, 32, 32 * 96, 96, 32 * 64, 64])


def test_bad_activation():
  with pytest.raises(ValueError, match='activation'):
    SRU(activation='relu')
