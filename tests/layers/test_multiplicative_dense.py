"""MultiplicativeDense against the paper's formula and Theorem 1 (§3.2, 6.1)."""
import numpy as np
import pytest
import jax
from trax import shapes

from terraformer.layers import MultiplicativeDense


def _init(layer, x, seed=0):
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(seed))
  return [np.asarray(w) for w in layer.weights]


def test_matches_formula():
  x = np.random.RandomState(0).randn(3, 5, 12).astype(np.float32)
  layer = MultiplicativeDense(n_modules=4, d_module=6, use_bias=True)
  d, e, b = _init(layer, x)
  # y[s, m] = sum_i x[i] D[s, i] E[i, m]   (§3.2), flattened to s * M + m.
  expected = np.einsum('bli,si,im->blsm', x, d, e).reshape(3, 5, 24) + b
  np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('use_bias', [False, True])
def test_parameter_count(use_bias):
  d_model, s, m = 20, 4, 5
  layer = MultiplicativeDense(s, m, use_bias=use_bias)
  weights = _init(layer, np.zeros((1, 1, d_model), np.float32))
  assert sum(w.size for w in weights) == (
      d_model * s + d_model * m + (s * m if use_bias else 0))


def test_theorem_1_represents_any_permutation():
  d_model, s, m = 24, 4, 6
  rng = np.random.RandomState(7)
  f = rng.permutation(d_model)           # i -> flat output index s * M + m
  d = np.zeros((s, d_model), np.float32)
  e = np.zeros((d_model, m), np.float32)
  d[f // m, np.arange(d_model)] = 1.0    # D[s', i] = 1 iff s' = s(i)
  e[np.arange(d_model), f % m] = 1.0     # E[i, m'] = 1 iff m' = m(i)
  layer = MultiplicativeDense(s, m)
  x = rng.randn(2, 3, d_model).astype(np.float32)
  _init(layer, x)
  y = np.asarray(layer(x, weights=(d, e)))
  expected = np.empty_like(x)
  expected[..., f] = x                   # y_{f(i)} = x_i
  np.testing.assert_array_equal(y, expected)
