"""SparseLogits: the multiplicative final layer (§3.3, 6.2)."""
import numpy as np
import pytest
import jax
from trax import shapes

from terraformer.layers import SparseLogits


def test_matches_formula_and_parameter_count():
  d_model, vocab, s = 16, 40, 4
  x = np.random.RandomState(0).randn(2, 3, d_model).astype(np.float32)
  layer = SparseLogits(vocab, n_modules=s)
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  d, e, b = [np.asarray(w) for w in layer.weights]
  expected = np.einsum('bli,si,im->blsm', x, d, e).reshape(2, 3, vocab) + b
  np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5,
                             atol=1e-5)
  assert d.size + e.size + b.size == d_model * (s + vocab // s) + vocab


def test_vocab_not_a_multiple_of_modules_is_padded_and_cut():
  d_model, vocab, s = 8, 30, 4  # modules of 8: 32 outputs, the last 2 dropped
  x = np.random.RandomState(1).randn(2, 3, d_model).astype(np.float32)
  layer = SparseLogits(vocab, n_modules=s)
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  d, e, b = [np.asarray(w) for w in layer.weights[0]]
  assert e.shape == (d_model, 8) and b.shape == (32,)
  full = np.einsum('bli,si,im->blsm', x, d, e).reshape(2, 3, 32) + b
  out = np.asarray(layer(x))
  assert out.shape == (2, 3, vocab)
  np.testing.assert_allclose(out, full[..., :vocab], rtol=1e-5, atol=1e-5)


def test_more_modules_than_tokens_is_an_error():
  with pytest.raises(ValueError, match='loss sparsity S=40'):
    SparseLogits(30, n_modules=40)
