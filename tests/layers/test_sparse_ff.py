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
  """Y = max(0, x W1) ⊙ onehot(argmax(Reshape(x C1 C2 + c, (-1, N))))."""
  c1, c2, c, w1t, w2, b2 = [np.asarray(w, np.float64) for w in weights]
  logits = (x @ c1 @ c2 + c).reshape(x.shape[:-1] + (D_FF // N, N))
  mask = np.eye(N)[logits.argmax(-1)].reshape(x.shape[:-1] + (D_FF,))
  y = np.maximum(0.0, x @ w1t.T) * mask
  return y @ w2 + b2


@pytest.mark.parametrize('mode', ['eval', 'predict'])
def test_matches_formula(mode):
  x = np.random.RandomState(0).randn(2, 5, D_MODEL).astype(np.float32)
  layer = _layer(mode, x)
  # A controller bias of order 1, so that dropping it would show.
  weights = list(layer.weights)
  weights[2] = np.random.RandomState(1).randn(D_FF).astype(np.float32)
  np.testing.assert_allclose(np.asarray(layer(x, weights=tuple(weights))),
                             _numpy_sparse_ff(x, weights),
                             rtol=1e-4, atol=1e-5)


def test_parameter_count():
  layer = _layer('eval', np.zeros((1, 1, D_MODEL), np.float32))
  assert sum(np.size(w) for w in layer.weights) == (
      D_MODEL * D_LOWRANK + D_LOWRANK * D_FF + D_FF  # controller C1, C2, c
      + 2 * D_MODEL * D_FF + D_MODEL)                # W1, W2, b2


def test_predict_reads_only_selected_rows():
  x = np.random.RandomState(1).randn(1, 1, D_MODEL).astype(np.float32)
  layer = _layer('predict', x)
  c1, c2, c, w1t, w2, b2 = [np.array(w) for w in layer.weights]
  expected = np.asarray(layer(x))
  logits = (x[0, 0] @ c1 @ c2 + c).reshape(D_FF // N, N)
  rows = logits.argmax(-1) + np.arange(D_FF // N) * N
  unselected = np.setdiff1d(np.arange(D_FF), rows)
  for w in (w1t, w2):
    w[unselected] = np.nan   # poison every weight the step must not read
  out = np.asarray(layer(x, weights=(c1, c2, c, w1t, w2, b2)))
  np.testing.assert_allclose(out, expected, rtol=1e-6)


def _hard_sample_frequencies(controller, temperature, n_tokens=4000):
  """Train-mode hard units of a controller whose logits are log(probs)."""
  x = np.random.RandomState(3).randn(1, n_tokens, D_MODEL).astype(np.float32)
  layer = _layer('train', x, quant_prob=1.0, temperature=temperature,
                 controller=controller, store_decisions=True)
  c1, c2, _, w1t, w2, b2 = layer.weights
  # C1 = C2 = 0: the logits are the controller bias, log(probs) per block.
  bias = jnp.tile(jnp.log(jnp.asarray(PROBS)), D_FF // N)
  weights = (jnp.zeros_like(c1), jnp.zeros_like(c2), bias, w1t, w2, b2)
  _, state = layer.pure_fn(x, weights, layer.state, jax.random.PRNGKey(4))
  units = np.asarray(state['decisions']).reshape(-1)
  return np.bincount(units, minlength=N) / units.size


PROBS = np.array([0.1, 0.2, 0.3, 0.4], np.float32)


def test_trax_hard_samples_follow_softmax_of_logits_over_temperature():
  freq = _hard_sample_frequencies('trax', temperature=0.1)
  # argmax(log_softmax(l) + T g) ~ softmax(l / T) = p^10 / sum(p^10):
  # [1e-6, 1e-4, .053, .947]; 32000 samples -> std <= 0.0013.
  expected = PROBS.astype(np.float64) ** 10 / np.sum(PROBS.astype(
      np.float64) ** 10)
  np.testing.assert_allclose(freq, expected, atol=0.01)


def test_gumbel_softmax_hard_samples_follow_controller_distribution():
  freq = _hard_sample_frequencies('gumbel_softmax', temperature=0.1)
  # Gumbel-max: P(unit k) = p_k, whatever the temperature.
  np.testing.assert_allclose(freq, PROBS, atol=0.02)


@pytest.mark.parametrize('controller', ['trax', 'gumbel_softmax'])
def test_uses_hard_mask_with_quant_prob(controller):
  x = np.random.RandomState(4).randn(1, 2, D_MODEL).astype(np.float32)
  layer = _layer('train', x, quant_prob=0.3, controller=controller)
  logits = layer.controller_logits(x)

  def mask(rng):
    layer.rng = rng
    return layer._train_mask(logits)[0]

  masks = np.asarray(jax.jit(jax.vmap(mask))(
      jax.random.split(jax.random.PRNGKey(0), 400)))
  hard = np.isin(masks, [0.0, 1.0]).reshape(400, -1).all(axis=1)
  # Binomial(400, 0.3): mean 120, std ~9.
  assert 85 < hard.sum() < 155


def test_trax_soft_mask_is_the_noiseless_softmax():
  x = np.random.RandomState(5).randn(1, 3, D_MODEL).astype(np.float32)
  layer = _layer('train', x, quant_prob=0.0)   # always the soft mask
  logits = layer.controller_logits(x)
  mask, _ = layer._train_mask(logits)
  p = np.exp(np.asarray(logits, np.float64))
  np.testing.assert_allclose(np.asarray(mask), p / p.sum(-1, keepdims=True),
                             rtol=1e-5)


@pytest.mark.parametrize('controller', ['trax', 'gumbel_softmax'])
def test_straight_through_gradient_reaches_controller(controller):
  x = np.random.RandomState(2).randn(2, 3, D_MODEL).astype(np.float32)
  layer = _layer('train', x, quant_prob=1.0, controller=controller)
  weights = layer.weights

  def loss(w):
    y, _ = layer.pure_fn(x, w, layer.state, jax.random.PRNGKey(5))
    return jnp.sum(y ** 2)

  grads = jax.jit(jax.grad(loss))(weights)
  # The forward pass is a hard one-hot, yet C1, C2 and c get gradients.
  for g in grads[:3]:
    assert np.abs(np.asarray(g)).sum() > 0


def test_trax_straight_through_gradient_only_at_selected_unit():
  """Mask before the ReLU: a hard mask's gradient reaches the controller
  only through the selected unit of each block (Trax's _SparseFFMain)."""
  x = np.random.RandomState(6).randn(1, 1, D_MODEL).astype(np.float32)
  layer = _layer('train', x, quant_prob=1.0, store_decisions=True)
  _, state = layer.pure_fn(x, layer.weights, layer.state,
                           jax.random.PRNGKey(7))
  selected = np.asarray(state['decisions']).reshape(-1)
  logits = layer.controller_logits(x).reshape(D_FF // N, N)
  p = np.asarray(jax.nn.softmax(logits, axis=-1), np.float64)

  def loss(c):
    weights = layer.weights[:2] + (c,) + layer.weights[3:]
    y, _ = layer.pure_fn(x, weights, layer.state, jax.random.PRNGKey(7))
    return jnp.sum(y)

  grad_c = np.asarray(jax.jit(jax.grad(loss))(layer.weights[2])).reshape(
      D_FF // N, N)
  # d loss / d mask is zero except at the selected unit k, where it is
  # g_k = d loss / d h_k * (x W1)_k; through the softmax,
  # d/dl_j = g_k p_k (δ_jk - p_j): proportional to (δ_jk - p_j).
  for block, k in enumerate(selected):
    g = grad_c[block]
    if abs(g[k]) < 1e-9:   # the selected unit's ReLU is off: no gradient
      np.testing.assert_allclose(g, 0.0, atol=1e-9)
      continue
    direction = np.eye(N)[k] - p[block]
    np.testing.assert_allclose(g / g[k], direction / direction[k],
                               rtol=1e-3, atol=1e-6)


def test_bad_controller():
  with pytest.raises(ValueError, match='controller'):
    SparseFF(D_FF, N, controller='softmax')


@pytest.mark.parametrize('n', [8, 64, 128, 67])
def test_first_argmax_is_argmax_with_ties(n):
  from terraformer.layers.sparse_ff import _first_argmax  # pylint: disable=g-import-not-at-top
  logits = np.random.RandomState(n).randint(0, 4, size=(5, 7, n)).astype(
      np.float32)                               # many ties per row
  np.testing.assert_array_equal(_first_argmax(jnp.asarray(logits)),
                                np.argmax(logits, axis=-1))
