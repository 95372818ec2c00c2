"""Sparse QKV attention against a numpy version of §3.2 / Fig. 4b."""
import numpy as np
import pytest
import jax
from trax import shapes

from terraformer.layers import ModuleConv
from terraformer.layers import SparseQKVCausalAttention

S, M, F = 3, 4, 3
D_MODEL = S * M


def _numpy_causal_conv(x, kernel, bias):
  """y[l, s, o] = b[o] + sum_{a, c, k} x[l - (F-1) + a, s + c - (F-1)//2, k] K[a, c, k, o]."""
  batch, length = x.shape[:2]
  img = x.reshape(batch, length, S, M)
  out = np.zeros((batch, length, S, kernel.shape[-1])) + bias
  for l in range(length):
    for s in range(S):
      for a in range(F):
        for c in range(F):
          li, si = l - (F - 1) + a, s + c - (F - 1) // 2
          if 0 <= li < length and 0 <= si < S:
            out[:, l, s] += img[:, li, si] @ kernel[a, c]
  return out


def test_module_conv_matches_causal_convolution():
  x = np.random.RandomState(0).randn(2, 6, D_MODEL).astype(np.float32)
  conv = ModuleConv(S, M, kernel_size=F, n_outputs=3, causal=True)
  conv.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  kernel, bias = [np.asarray(w, np.float64) for w in conv.weights]
  expected = _numpy_causal_conv(x, kernel, bias)
  outputs = conv(x)
  for i, out in enumerate(outputs):
    np.testing.assert_allclose(
        np.asarray(out), expected[..., i * M:(i + 1) * M].reshape(2, 6, -1),
        rtol=1e-4, atol=1e-4)


def test_module_conv_parameter_count():
  conv = ModuleConv(S, M, kernel_size=F, n_outputs=3)
  conv.init(shapes.ShapeDtype((1, 4, D_MODEL)), rng=jax.random.PRNGKey(0))
  # Three convolutions with M filters of F x F over M channels: 3 (F²M² + M).
  assert sum(np.size(w) for w in conv.weights) == 3 * (F * F * M * M + M)


def test_causal_attention_matches_formula():
  x = np.random.RandomState(1).randn(2, 5, D_MODEL).astype(np.float32)
  layer = SparseQKVCausalAttention(D_MODEL, n_modules=S, kernel_size=F)
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(1))
  mult_weights, conv_weights = layer.weights[0]   # the SparseQKV sublayer
  d, e = [np.asarray(w, np.float64) for w in mult_weights]
  kernel, bias = [np.asarray(w, np.float64) for w in conv_weights]
  mult = np.einsum('bli,is,im->blsm', x, d, e).reshape(2, 5, D_MODEL)
  qkv = _numpy_causal_conv(mult, kernel, bias)      # [b, l, S, 3M]
  q, k, v = np.split(qkv, 3, axis=-1)               # S heads of size M each
  dots = np.einsum('bqhm,bkhm->bhqk', q, k) / np.sqrt(M)
  dots = np.where(np.tril(np.ones((5, 5), bool)), dots, -1e9)
  attn = np.exp(dots - dots.max(-1, keepdims=True))
  attn /= attn.sum(-1, keepdims=True)
  expected = np.einsum('bhqk,bkhm->bqhm', attn, v).reshape(2, 5, D_MODEL)
  # No output dense layer: the heads' outputs are the result.
  np.testing.assert_allclose(np.asarray(layer(x)), expected, rtol=1e-4,
                             atol=1e-4)


def test_causal_attention_parameter_count():
  layer = SparseQKVCausalAttention(D_MODEL, n_modules=S, kernel_size=F)
  layer.init(shapes.ShapeDtype((1, 4, D_MODEL)), rng=jax.random.PRNGKey(0))
  n_params = sum(np.size(w) for w in jax.tree_util.tree_leaves(layer.weights))
  assert n_params == D_MODEL * S + D_MODEL * M + 3 * (F * F * M * M + M)


def test_predict_mode_keeps_last_positions():
  x = np.random.RandomState(2).randn(1, 4, D_MODEL).astype(np.float32)
  conv = ModuleConv(S, M, kernel_size=F, mode='predict')
  conv.init(shapes.ShapeDtype((1, 1, D_MODEL)))
  for i in range(4):
    conv(x[:, i:i + 1])
  np.testing.assert_array_equal(np.asarray(conv.state),
                                x[:, -(F - 1):].reshape(1, F - 1, S, M))


def test_d_model_must_split_into_modules():
  with pytest.raises(ValueError, match='multiple of the number of modules'):
    SparseQKVCausalAttention(10, n_modules=4)
