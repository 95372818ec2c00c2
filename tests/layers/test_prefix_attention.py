"""PrefixCausalAttention: Trax's causal attention, decoding from a cache prefix."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp
from trax import layers as tl
from trax import shapes

from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.ops import bucket_for
from terraformer.layers.ops import cache_buckets

HEADS, D_HEAD, MAX_LEN, MIN_BUCKET = 3, 4, 32, 4


def test_buckets():
  assert cache_buckets(32, 4) == (4, 8, 16, 32)
  assert cache_buckets(48, 4) == (4, 8, 16, 32, 48)
  assert cache_buckets(16, 64) == (16,)
  assert [bucket_for(n, 32, 4) for n in (1, 4, 5, 9, 17, 32)] == [
      4, 4, 8, 16, 32, 32]


def _qkv(length, seed):
  rng = np.random.RandomState(seed)
  return tuple(rng.randn(HEADS, length, D_HEAD).astype(np.float32)
               for _ in range(3))


def _predict_layers():
  ours = PrefixCausalAttention(max_inference_length=MAX_LEN, mode='predict',
                               min_bucket=MIN_BUCKET)
  trax = tl.DotProductCausalAttention(max_inference_length=MAX_LEN,
                                      mode='predict')
  sig = tuple(shapes.ShapeDtype((HEADS, 1, D_HEAD)) for _ in range(3))
  ours.init(sig)
  trax.init(sig)
  return ours, trax


class _Stepper:
  """Calls a predict-mode layer through one jitted pure_fn, keeping state."""

  def __init__(self, layer):
    self.layer, self.state = layer, layer.state
    self._step = jax.jit(layer.pure_fn)

  def __call__(self, x, state=None):
    out, new_state = self._step(x, (), self.state if state is None else state,
                                jax.random.PRNGKey(0))
    if state is None:
      self.state = new_state
    return np.asarray(out)


def test_predict_matches_trax_across_buckets():
  ours, trax = (_Stepper(layer) for layer in _predict_layers())
  q, k, v = _qkv(MAX_LEN, seed=0)
  for t in range(MAX_LEN):   # crosses buckets 4, 8, 16 and fills 32
    x = (q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1])
    np.testing.assert_allclose(ours(x), trax(x), atol=1e-5, rtol=1e-5)
  keys, values, index = ours.state
  np.testing.assert_array_equal(np.asarray(keys), k)
  np.testing.assert_array_equal(np.asarray(values), v)
  assert int(index) == MAX_LEN


def test_predict_matches_eval_forward():
  q, k, v = _qkv(12, seed=1)
  full = PrefixCausalAttention(max_inference_length=MAX_LEN, mode='eval')
  full.init(shapes.signature((q, k, v)))
  expected = np.asarray(full((q, k, v)))
  ours = _Stepper(_predict_layers()[0])
  steps = [ours((q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1]))
           for t in range(12)]
  np.testing.assert_allclose(np.concatenate(steps, axis=1), expected,
                             atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('filled', [3, 6, 13])
def test_step_reads_only_its_bucket(filled):
  """Cache positions past the bucket are poisoned: the output is unchanged."""
  ours_layer, trax_layer = _predict_layers()
  ours, trax = _Stepper(ours_layer), _Stepper(trax_layer)
  q, k, v = _qkv(filled + 1, seed=2)
  for t in range(filled):
    ours((q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1]))
  keys, values, index = ours.state
  step = (q[:, filled:], k[:, filled:], v[:, filled:])
  expected = ours(step, ours.state)
  bucket = bucket_for(filled + 1, MAX_LEN, MIN_BUCKET)
  assert bucket < MAX_LEN
  poisoned = tuple(jnp.asarray(c).at[:, bucket:].set(jnp.nan)
                   for c in (keys, values)) + (index,)
  np.testing.assert_array_equal(ours(step, poisoned), expected)
  # ...while Trax's layer reads the whole cache.
  assert np.isnan(trax(step, poisoned)).all()


@pytest.mark.parametrize('n', [1, 16, 64, 96, 1024, 1280])
def test_one_reduction_softmax_and_logsumexp_match_jax(n):
  from terraformer.layers.ops import logsumexp_last  # pylint: disable=g-import-not-at-top
  from terraformer.layers.ops import softmax_last  # pylint: disable=g-import-not-at-top
  x = np.random.RandomState(n).randn(3, 2, n).astype(np.float32) * 5
  x[0, 0, : n // 2] = -1e9                       # masked positions
  np.testing.assert_allclose(logsumexp_last(x),
                             jax.nn.logsumexp(x, axis=-1, keepdims=True),
                             rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(softmax_last(x), jax.nn.softmax(x, axis=-1),
                             rtol=1e-6, atol=1e-7)
  inf = np.full((1, 40), -np.inf, np.float32)    # all masked: as jax
  np.testing.assert_array_equal(logsumexp_last(inf),
                                jax.nn.logsumexp(inf, axis=-1, keepdims=True))
