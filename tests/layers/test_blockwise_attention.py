"""Blockwise encoder attention (Pietruszka et al. §2, §3.2, App. C.1)."""
import jax
import numpy as np
from trax import layers as tl
from trax import shapes

from terraformer.layers.blockwise_attention import BlockwiseSelfAttention

D, HEADS = 8, 2


def _numpy_attention(x, mask, weights):
  """Multi-head softmax attention of x over itself, padding keys masked."""
  wq, bq, wk, bk, wv, bv, wo, bo = weights
  n = x.shape[0]
  q, k, v = [(x @ w + b).reshape(n, HEADS, -1) for w, b in
             ((wq, bq), (wk, bk), (wv, bv))]
  dots = np.einsum('qhd,khd->hqk', q, k) / np.sqrt(D // HEADS)
  dots = np.where(mask[None, None, :], dots, -1e9)
  attn = np.exp(dots - dots.max(-1, keepdims=True))
  attn /= attn.sum(-1, keepdims=True)
  return np.einsum('hqk,khd->qhd', attn, v).reshape(n, D) @ wo + bo


def _layer(x, mask, block_len):
  layer = BlockwiseSelfAttention(D, HEADS, block_len)
  layer.init((shapes.signature(x), shapes.signature(mask)),
             rng=jax.random.PRNGKey(0))
  weights = [np.asarray(w, np.float64)
             for w in jax.tree_util.tree_leaves(layer.weights)]
  return layer, weights


def test_each_block_attends_within_itself():
  rng = np.random.RandomState(0)
  x = rng.randn(2, 12, D).astype(np.float32)
  mask = np.ones((2, 12), bool)
  mask[1, 10:] = False
  layer, weights = _layer(x, mask, block_len=4)
  y = np.asarray(layer((x, mask)))
  for b in range(2):
    for start in range(0, 12, 4):
      block = slice(start, start + 4)
      expected = _numpy_attention(x[b, block], mask[b, block], weights)
      np.testing.assert_allclose(y[b, block][mask[b, block]],
                                 expected[mask[b, block]], rtol=1e-4,
                                 atol=1e-4)


def test_one_block_is_full_attention():
  rng = np.random.RandomState(1)
  x = rng.randn(2, 6, D).astype(np.float32)
  mask = np.ones((2, 6), bool)
  mask[0, 4:] = False
  layer, weights = _layer(x, mask, block_len=512)   # block = min(n, 512)
  full = tl.Attention(D, HEADS, mode='eval')
  full_mask = mask[:, None, None, :]
  full.init((shapes.signature(x), shapes.signature(full_mask)))
  full.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(full.weights),
      [np.asarray(w, np.float32) for w in weights])
  expected, _ = full((x, full_mask))
  np.testing.assert_allclose(np.asarray(layer((x, mask)))[mask],
                             np.asarray(expected)[mask], rtol=1e-4,
                             atol=1e-4)


def test_padding_and_other_blocks_do_not_leak():
  rng = np.random.RandomState(2)
  x = rng.randn(1, 10, D).astype(np.float32)     # 10: padded to 3 blocks
  mask = np.ones((1, 10), bool)
  mask[0, 9] = False
  layer, _ = _layer(x, mask, block_len=4)
  y = np.asarray(layer((x, mask)))
  assert y.shape == (1, 10, D)
  changed = x.copy()
  changed[0, 9] += 100.0       # padding
  changed[0, 0:4] += 1.0       # block 0
  y2 = np.asarray(layer((changed, mask)))
  np.testing.assert_allclose(y2[0, 4:9], y[0, 4:9], rtol=1e-5, atol=1e-5)
  assert np.abs(y2[0, :4] - y[0, :4]).max() > 1e-3
