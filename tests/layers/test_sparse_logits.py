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
  expected = np.einsum('bli,is,im->blsm', x, d, e).reshape(2, 3, vocab) + b
  np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-5,
                             atol=1e-5)
  assert d.size + e.size + b.size == d_model * (s + vocab // s) + vocab


def test_vocab_must_divide_into_modules():
  with pytest.raises(ValueError, match='multiple of the loss sparsity'):
    SparseLogits(30, n_modules=4)
