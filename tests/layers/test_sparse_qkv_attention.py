"""Sparse QKV attention against a numpy version of §3.2 / Fig. 4b."""
import numpy as np
import pytest
import jax
from trax import shapes

from terraformer.layers import ModuleConv
from terraformer.layers import SparseQKVCausalAttention

S, M, F = 3, 4, 3
D_MODEL = S * M


def _numpy_conv(x, kernel, bias, centred=False):
  """y[l, s, o] = b[o] + sum_{a, c, k} x[l - p + a, s + c - (Fm-1)//2, k] K[a, c, k, o],

  p = F - 1 (causal) or (F - 1) // 2 (centred), zero outside the image.
  """
  batch, length = x.shape[:2]
  f, fm = kernel.shape[:2]
  pad = (f - 1) // 2 if centred else f - 1
  img = x.reshape(batch, length, S, M)
  out = np.zeros((batch, length, S, kernel.shape[-1])) + bias
  for l in range(length):
    for s in range(S):
      for a in range(f):
        for c in range(fm):
          li, si = l - pad + a, s + c - (fm - 1) // 2
          if 0 <= li < length and 0 <= si < S:
            out[:, l, s] += img[:, li, si] @ kernel[a, c]
  return out


def _weights(layer):
  return [np.asarray(w, np.float64) for w in
          jax.tree_util.tree_leaves(layer.weights)]


@pytest.mark.parametrize('length_padding', ['causal', 'centred'])
def test_module_conv_matches_convolution(length_padding):
  x = np.random.RandomState(0).randn(2, 6, D_MODEL).astype(np.float32)
  conv = ModuleConv(S, M, kernel_size=F, module_kernel_sizes=(F, F, 1),
                    length_padding=length_padding)
  conv.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  weights = _weights(conv)
  outputs = conv(x)
  assert len(outputs) == 3
  for i, out in enumerate(outputs):
    kernel, bias = weights[2 * i:2 * i + 2]
    expected = _numpy_conv(x, kernel, bias, length_padding == 'centred')
    np.testing.assert_allclose(np.asarray(out), expected.reshape(2, 6, -1),
                               rtol=1e-4, atol=1e-4)


def test_module_conv_parameter_count():
  conv = ModuleConv(S, M, kernel_size=F, module_kernel_sizes=(F, F, 1))
  conv.init(shapes.ShapeDtype((1, 4, D_MODEL)), rng=jax.random.PRNGKey(0))
  # Q, K: M filters of F x F over M channels; V: F x 1 (Trax's default).
  assert sum(np.size(w) for w in conv.weights) == (
      2 * (F * F * M * M + M) + F * M * M + M)


def test_causal_attention_matches_formula():
  x = np.random.RandomState(1).randn(2, 5, D_MODEL).astype(np.float32)
  layer = SparseQKVCausalAttention(D_MODEL, n_modules=S, kernel_size=F)
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(1))
  d, e, b, *conv_weights = _weights(layer.sublayers[0])  # SparseQKV
  mult = np.einsum('bli,si,im->blsm', x, d, e).reshape(2, 5, D_MODEL) + b
  q, k, v = [_numpy_conv(mult, *conv_weights[2 * i:2 * i + 2])
             for i in range(3)]                       # S heads of size M
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
  assert n_params == (D_MODEL * S + D_MODEL * M + D_MODEL     # D, E, b
                      + 2 * (F * F * M * M + M) + F * M * M + M)


def test_predict_mode_keeps_last_positions():
  x = np.random.RandomState(2).randn(1, 4, D_MODEL).astype(np.float32)
  conv = ModuleConv(S, M, kernel_size=F, mode='predict')
  with pytest.raises(ValueError, match='non-causal'):
    ModuleConv(S, M, length_padding='centred', mode='predict')
  conv.init(shapes.ShapeDtype((1, 1, D_MODEL)))
  for i in range(4):
    conv(x[:, i:i + 1])
  np.testing.assert_array_equal(np.asarray(conv.state),
                                x[:, -(F - 1):].reshape(1, F - 1, S, M))


def test_d_model_must_split_into_modules():
  with pytest.raises(ValueError, match='multiple of the number of modules'):
    SparseQKVCausalAttention(10, n_modules=4)
