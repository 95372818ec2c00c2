"""SparseFF against the paper's formula (§3.1) and its controller."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp
from trax import shapes

from terraformer.layers import SparseFF

D_MODEL, D_FF, N, D_LOWRANK = 12, 32, 4, 3


def _layer(mode, x, seed=0, **kwargs):
  layer = SparseFF(D_FF, n_elements_in_block=N, d_lowrank=D_LOWRANK,
                   mode=mode, **kwargs)
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(seed))
  return layer


def _numpy_sparse_ff(x, weights):
  """Y = max(0, x W1 + b1) ⊙ onehot(argmax(Reshape(x C1 C2, (-1, N))))."""
  c1, c2, w1t, b1, w2, b2 = [np.asarray(w, np.float64) for w in weights]
  logits = (x @ c1 @ c2).reshape(x.shape[:-1] + (D_FF // N, N))
  mask = np.eye(N)[logits.argmax(-1)].reshape(x.shape[:-1] + (D_FF,))
  y = np.maximum(0.0, x @ w1t.T + b1) * mask
  return y @ w2 + b2


@pytest.mark.parametrize('mode', ['eval', 'predict'])
def test_matches_formula(mode):
  x = np.random.RandomState(0).randn(2, 5, D_MODEL).astype(np.float32)
  layer = _layer(mode, x)
  np.testing.assert_allclose(np.asarray(layer(x)),
                             _numpy_sparse_ff(x, layer.weights),
                             rtol=1e-4, atol=1e-5)


def test_parameter_count():
  layer = _layer('eval', np.zeros((1, 1, D_MODEL), np.float32))
  assert sum(np.size(w) for w in layer.weights) == (
      D_MODEL * D_LOWRANK + D_LOWRANK * D_FF      # controller C1, C2
      + 2 * D_MODEL * D_FF + D_FF + D_MODEL)      # W1, b1, W2, b2


def test_predict_reads_only_selected_rows():
  x = np.random.RandomState(1).randn(1, 1, D_MODEL).astype(np.float32)
  layer = _layer('predict', x)
  c1, c2, w1t, b1, w2, b2 = [np.array(w) for w in layer.weights]
  expected = np.asarray(layer(x))
  logits = (x[0, 0] @ c1 @ c2).reshape(D_FF // N, N)
  rows = logits.argmax(-1) + np.arange(D_FF // N) * N
  unselected = np.setdiff1d(np.arange(D_FF), rows)
  for w in (w1t, b1, w2):
    w[unselected] = np.nan   # poison every weight the step must not read
  out = np.asarray(layer(x, weights=(c1, c2, w1t, b1, w2, b2)))
  np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_gumbel_hard_samples_follow_controller_distribution():
  probs = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
  logits = jnp.broadcast_to(jnp.log(probs), (4000, 1, N))
  layer = _layer('train', np.zeros((1, 1, D_MODEL), np.float32),
                 quant_prob=1.0)
  mask = np.asarray(layer._gumbel_mask(logits, jax.random.PRNGKey(3),
                                       jax.random.PRNGKey(4)))
  assert set(np.unique(mask)) <= {0.0, 1.0}
  np.testing.assert_array_equal(mask.sum(-1), 1.0)   # one unit per block
  freq = mask.mean(axis=(0, 1))
  # Gumbel-max: P(unit k) = p_k; 4000 samples -> std <= 0.008.
  np.testing.assert_allclose(freq, probs, atol=0.03)


def test_gumbel_uses_hard_mask_with_quant_prob():
  layer = _layer('train', np.zeros((1, 1, D_MODEL), np.float32),
                 quant_prob=0.3)
  logits = jnp.zeros((1, 2, N))
  hard = [bool(np.all(np.isin(np.asarray(
      layer._gumbel_mask(logits, jax.random.PRNGKey(0),
                         jax.random.PRNGKey(i))), [0.0, 1.0])))
          for i in range(400)]
  # Binomial(400, 0.3): mean 120, std ~9.
  assert 85 < sum(hard) < 155


def test_straight_through_gradient_reaches_controller():
  x = np.random.RandomState(2).randn(2, 3, D_MODEL).astype(np.float32)
  layer = _layer('train', x, quant_prob=1.0)
  weights = layer.weights

  def loss(w):
    y, _ = layer.pure_fn(x, w, layer.state, jax.random.PRNGKey(5))
    return jnp.sum(y ** 2)

  grads = jax.grad(loss)(weights)
  # The forward pass is a hard one-hot, yet C1 and C2 get gradients.
  assert np.abs(np.asarray(grads[0])).sum() > 0
  assert np.abs(np.asarray(grads[1])).sum() > 0
