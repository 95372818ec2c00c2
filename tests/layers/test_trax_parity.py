"""Our layers against Trax 1.4.1's, the paper's code, on identical weights.

Trax is the oracle here only: each test builds the Trax layer, copies its
(random) weights into ours through the documented layout mapping, and
compares outputs in train (same rng), eval and predict (token by token) mode,
and the gradients of a scalar of the output in train mode.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes
from trax.layers.research import sparsity as trax_sparsity

from terraformer.layers import SRU
from terraformer.layers import SparseFF
from terraformer.layers import SparseLogits
from terraformer.layers import SparseQKVCausalAttention
from terraformer.layers.sparse_qkv_attention import SparseQKV

TOL = 1e-5
D_MODEL, BATCH, LENGTH = 12, 2, 5


def _x(seed, shape=(BATCH, LENGTH, D_MODEL)):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _leaves(tree):
  return [jnp.asarray(w) for w in jax.tree_util.tree_leaves(tree)]


def _init(layer, x, seed=0):
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(seed))
  return layer


def _close(a, b, tol=TOL):
  a, b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(a) == len(b)
  for u, v in zip(a, b):
    np.testing.assert_allclose(np.asarray(u), np.asarray(v), atol=tol,
                               rtol=tol)


@functools.lru_cache(maxsize=None)
def _compiled(layer):
  """(output, grads of sum(sin(output))) functions of layer, compiled once."""
  def output(x, w, s, r):
    return layer.pure_fn(x, w, s, r)[0]

  def loss(w, x, s, r):
    return jnp.sum(jnp.sin(output(x, w, s, r)))
  return jax.jit(output), jax.jit(jax.grad(loss, argnums=(0, 1)))


def _apply(layer, x, weights, state, rng):
  return _compiled(layer)[0](x, weights, state, rng)


def _grads(layer, x, weights, state, rng):
  """d/d(weights, x) of sum(sin(y)), train mode."""
  return _compiled(layer)[1](weights, x, state, rng)


def _predict_steps(layer, x):
  """Feeds x one position at a time to a predict-mode layer."""
  step = jax.jit(lambda x, w, s: layer.pure_fn(x, w, s, None))
  state, outputs = layer.state, []
  for i in range(x.shape[1]):
    y, state = step(x[:, i:i + 1], layer.weights, state)
    outputs.append(np.asarray(y))
  return np.concatenate(outputs, axis=1)


def _forward(layer, x):
  return _apply(layer, x, layer.weights, layer.state, jax.random.PRNGKey(0))


# --- SparseFF (Trax: tl.SparseFF = _SparseFFController + _SparseFFMain) -----

D_FF, N, D_LOWRANK = 32, 4, 3


def _trax_ff_to_ours(m1, m2, mb, w1, w2, b2):
  """The mapping documented in SparseFF's docstring."""
  d_model = w1.shape[0]
  return (m1, m2.reshape(m1.shape[1], -1), mb.reshape(-1),
          w1.reshape(d_model, -1).T,
          jnp.transpose(w2, (1, 0, 2)).reshape(-1, d_model), b2)


def _ff_pair(mode, x, quant_prob=0.3, temperature=0.1):
  trax_ff = tl.SparseFF(D_FF, n_elements_in_block=N, d_lowrank=D_LOWRANK,
                        temperature=temperature, quant_prob=quant_prob,
                        mode=mode)
  _init(trax_ff, x, seed=7)
  ours = SparseFF(D_FF, N, D_LOWRANK, temperature=temperature,
                  quant_prob=quant_prob, mode=mode)
  _init(ours, x)
  # Controller logits of order 1 (Trax's mb is ~1e-6): a real choice.
  m1, m2, mb, w1, w2, b2 = _leaves(trax_ff.weights)
  rs = np.random.RandomState(3)
  m1 = m1 + rs.normal(0, 1.0, m1.shape).astype(np.float32)
  mb = mb + rs.normal(0, 0.5, mb.shape).astype(np.float32)
  b2 = b2 + rs.normal(0, 0.1, b2.shape).astype(np.float32)
  trax_weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(trax_ff.weights), [m1, m2, mb, w1, w2, b2])
  return trax_ff, trax_weights, ours, _trax_ff_to_ours(m1, m2, mb, w1, w2, b2)


def test_sparse_ff_train_equals_trax_same_rng():
  x = _x(0)
  trax_ff, trax_w, ours, our_w = _ff_pair('train', x)
  used_hard = set()
  for seed in range(5):
    rng = jax.random.PRNGKey(seed)
    expected = _apply(trax_ff, x, trax_w, trax_ff.state, rng)
    got = _apply(ours, x, our_w, ours.state, rng)
    _close(got, expected)
    # Which branch this rng took: Trax's own hard-or-soft draw.
    rng_inner = jax.random.split(jax.random.split(rng, 3)[1], 6)[2]
    used_hard.add(bool(jax.random.uniform(rng_inner, ()) < 0.3))
  assert used_hard == {True, False}   # both the hard and the soft mask


def test_sparse_ff_train_gradients_equal_trax():
  x = _x(1)
  trax_ff, trax_w, ours, our_w = _ff_pair('train', x, quant_prob=0.6)
  for seed in (0, 1, 2, 4):   # the hard mask with rngs 1, 2; soft with 0, 4
    rng = jax.random.PRNGKey(seed)
    trax_gw, trax_gx = _grads(trax_ff, x, trax_w, trax_ff.state, rng)
    our_gw, our_gx = _grads(ours, x, our_w, ours.state, rng)
    _close(our_gx, trax_gx)
    # Gradients are linear in the weights: the same mapping applies.
    _close(our_gw, _trax_ff_to_ours(*_leaves(trax_gw)))
    assert float(jnp.abs(our_gw[1]).sum()) > 0   # the controller learns


def test_sparse_ff_eval_equals_trax():
  x = _x(2)
  trax_ff, trax_w, ours, our_w = _ff_pair('eval', x)
  expected = _apply(trax_ff, x, trax_w, trax_ff.state, None)
  _close(_apply(ours, x, our_w, ours.state, None), expected)


def test_sparse_ff_predict_equals_trax():
  x = _x(3)
  step = x[:, :1]
  trax_ff, trax_w, ours, our_w = _ff_pair('predict', step)
  trax_ff.weights, ours.weights = trax_w, our_w
  _close(_predict_steps(ours, x), _predict_steps(trax_ff, x))


# --- Sparse QKV (Trax: MultiplicativeConvCausalAttention) -------------------

S = 3
M = D_MODEL // S


def _qkv_attention_pair(mode, x):
  trax_attention = trax_sparsity.MultiplicativeConvCausalAttention(
      D_MODEL, n_heads=S, sparsity=S, length_kernel_size=3,
      max_inference_length=16, mode=mode)
  _init(trax_attention, x, seed=5)
  ours = _init(SparseQKVCausalAttention(D_MODEL, n_modules=S, kernel_size=3,
                                        max_len=16, mode=mode), x)
  leaves = _leaves(trax_attention.weights)
  # Biases of order 1 (Trax's start at ~1e-6), so that a misplaced one shows.
  rs = np.random.RandomState(4)
  leaves = [w + rs.normal(0, 0.5, w.shape).astype(np.float32)
            if w.ndim == 1 else w for w in leaves]
  trax_attention.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(trax_attention.weights), leaves)
  # Same leaves in the same order and shapes: D, E, b, (K, b) for Q, K, V.
  ours.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(ours.weights), leaves)
  return trax_attention, ours


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_sparse_qkv_attention_equals_trax(mode):
  x = _x(4)
  trax_attention, ours = _qkv_attention_pair(mode, x)
  _close(_forward(ours, x), _forward(trax_attention, x))


def test_sparse_qkv_attention_train_gradients_equal_trax():
  x = _x(5)
  trax_attention, ours = _qkv_attention_pair('train', x)
  rng = jax.random.PRNGKey(0)
  trax_g = _grads(trax_attention, x, trax_attention.weights,
                  trax_attention.state, rng)
  our_g = _grads(ours, x, ours.weights, ours.state, rng)
  _close(_leaves(our_g[0]), _leaves(trax_g[0]))   # |values| up to ~20
  _close(our_g[1], trax_g[1])


def test_sparse_qkv_attention_predict_equals_trax():
  x = _x(6, (BATCH, 7, D_MODEL))
  trax_attention, ours = _qkv_attention_pair('predict', x[:, :1])
  _close(_predict_steps(ours, x), _predict_steps(trax_attention, x))


@pytest.mark.parametrize('n_outputs', [1, 3])
def test_sparse_qkv_projections_equal_trax_pieces(n_outputs):
  """Encoder Q/K/V (causal convolution, the default) and cross-attention
  queries (Trax's AttentionQKV q_sparsity: FactoredDense + LocallyConvDense).
  """
  x = _x(7)
  module_kernels = [3] if n_outputs == 1 else [3, 3, 1]
  trax_qkv = tl.Serial(
      trax_sparsity.FactoredDense(S, D_MODEL, D_MODEL),
      tl.Branch(*[trax_sparsity.LocallyConvDense(
          S, M, mode='train', kernel_size=k, length_kernel_size=3)
                  for k in module_kernels]))
  _init(trax_qkv, x, seed=8)
  leaves = [w + 0.5 if w.ndim == 1 else w for w in _leaves(trax_qkv.weights)]
  ours = _init(SparseQKV(D_MODEL, S, 3, n_outputs, causal=False,
                         length_padding='causal'), x)
  ours.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(ours.weights), leaves)
  trax_qkv.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(trax_qkv.weights), leaves)
  _close(_forward(ours, x), _forward(trax_qkv, x))


# --- SRU (Trax: tl.SRU) ------------------------------------------------------

N_SRU = 4


def _sru_pair(mode, x):
  trax_sru = _init(tl.SRU(N_SRU, mode=mode), x, seed=9)
  w, b = _leaves(trax_sru.weights)
  b = b + jnp.asarray(np.random.RandomState(5).normal(0, 1.0, b.shape),
                      jnp.float32)   # gates visibly away from 1/2
  trax_sru.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(trax_sru.weights), [w, b])
  ours = _init(SRU(mode=mode), x)
  ours.weights = (w, b)               # Trax's Dense(3n) kernel and bias
  return trax_sru, ours


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_sru_equals_trax(mode):
  x = _x(8, (BATCH, 9, N_SRU))
  trax_sru, ours = _sru_pair(mode, x)
  _close(_forward(ours, x), _forward(trax_sru, x))


def test_sru_train_gradients_equal_trax():
  x = _x(9, (BATCH, 9, N_SRU))
  trax_sru, ours = _sru_pair('train', x)
  rng = jax.random.PRNGKey(0)
  trax_gw, trax_gx = _grads(trax_sru, x, trax_sru.weights, trax_sru.state,
                            rng)
  our_gw, our_gx = _grads(ours, x, ours.weights, ours.state, rng)
  _close(list(our_gw), _leaves(trax_gw))
  _close(our_gx, trax_gx)


def test_sru_predict_equals_trax():
  x = _x(10, (BATCH, 6, N_SRU))
  trax_sru, ours = _sru_pair('predict', x[:, :1])
  _close(_predict_steps(ours, x), _predict_steps(trax_sru, x))


# --- SparseLogits (Trax: SparseDenseWithOptions 'mult' = FactoredDense) ------

VOCAB, S_LOSS = 40, 4


def _logits_pair(mode, x):
  trax_logits = trax_sparsity.SparseDenseWithOptions(
      VOCAB, d_input=D_MODEL, sparsity_type='mult', sparsity=S_LOSS,
      mode=mode)
  _init(trax_logits, x, seed=11)
  leaves = [w + 0.5 if w.ndim == 1 else w for w in _leaves(trax_logits.weights)]
  trax_logits.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(trax_logits.weights), leaves)
  ours = _init(SparseLogits(VOCAB, S_LOSS), x)
  ours.weights = tuple(leaves)        # gating D, projection E, bias
  return trax_logits, ours


@pytest.mark.parametrize('mode', ['train', 'eval', 'predict'])
def test_sparse_logits_equal_trax(mode):
  x = _x(11)
  trax_logits, ours = _logits_pair(mode, x)
  if mode == 'predict':
    _close(_predict_steps(ours, x), _predict_steps(trax_logits, x))
  else:
    _close(_forward(ours, x), _forward(trax_logits, x))


def test_sparse_logits_train_gradients_equal_trax():
  x = _x(12)
  trax_logits, ours = _logits_pair('train', x)
  rng = jax.random.PRNGKey(0)
  trax_gw, trax_gx = _grads(trax_logits, x, trax_logits.weights,
                            trax_logits.state, rng)
  our_gw, our_gx = _grads(ours, x, ours.weights, ours.state, rng)
  _close(list(our_gw), _leaves(trax_gw))
  _close(our_gx, trax_gx)
