"""Self-attention with a full/LSH switch over the same weights; LSH replay."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import shapes
from trax.layers.research import efficient_attention

from terraformer.trax_bridge import compat
from terraformer.errors import TerraformerError
from terraformer.layers import LSHCore
from terraformer.layers import SelfAttention
from terraformer.layers.lsh_attention import decode_bucket_count

compat.apply()  # LSH layers on numpy inputs.

LSH = dict(lsh_chunk_len=4, lsh_n_hashes=2)


def _weight_shapes(layer, signature):
  layer.init(signature, rng=jax.random.PRNGKey(0))
  return [w.shape for w in jax.tree_util.tree_leaves(layer.weights)]


@pytest.mark.parametrize('sparsity', [0, 4])
@pytest.mark.parametrize('causal', [True, False])
def test_full_and_lsh_share_weights(sparsity, causal):
  x = shapes.ShapeDtype((2, 16, 32), np.float32)
  sig = (x, shapes.ShapeDtype((2,), np.int32) if causal
         else shapes.ShapeDtype((2, 16), np.bool_))
  full = SelfAttention(32, 4, 'full', sparsity, causal=causal)
  lsh = SelfAttention(32, 4, 'lsh', sparsity, causal=causal, **LSH)
  assert _weight_shapes(full, sig) == _weight_shapes(lsh, sig)
  # Sparse QKV has no dense d_model x d_model layer (§3.2).
  assert ((32, 32) in _weight_shapes(full, sig)) == (not sparsity)


def _init(layer, signature, seed=0):
  layer.init(signature, rng=jax.random.PRNGKey(seed))
  return layer


@pytest.mark.parametrize('attention_type', ['full', 'lsh'])
def test_causal_attention_ignores_the_future(attention_type):
  """Outputs before position 11 do not depend on inputs from 11 on.

  (For LSH this is a statement about gradients: which earlier positions share
  a chunk can depend on later ones, but no position attends to a later one.)
  """
  x = np.random.RandomState(0).normal(size=(2, 16, 32)).astype(np.float32)
  lengths = np.zeros((2,), np.int32)  # Decoder input: encoder lengths.
  layer = _init(SelfAttention(32, 4, attention_type, causal=True,
                              mode='eval', **LSH),
                shapes.signature((x, lengths)))

  def head(x, upto):
    y, _ = layer.pure_fn((x, lengths), layer.weights, layer.state,
                         jax.random.PRNGKey(0))
    return jnp.sum(jnp.sin(y[:, :upto]))

  grad = np.asarray(jax.grad(head)(jnp.asarray(x), 11))
  assert np.abs(grad[:, 11:]).max() == 0.0
  assert np.abs(grad[:, :11]).min(axis=-1).max() > 0
  grad_all = np.asarray(jax.grad(head)(jnp.asarray(x), 16))
  assert np.abs(grad_all[:, 11:]).max() > 0


@pytest.mark.parametrize('attention_type', ['full', 'lsh'])
def test_encoder_attention_masks_padding(attention_type):
  rs = np.random.RandomState(1)
  x = rs.normal(size=(2, 16, 32)).astype(np.float32)
  mask = np.ones((2, 16), np.bool_)
  mask[0, 10:] = False
  layer = _init(SelfAttention(32, 4, attention_type, causal=False,
                              mode='eval', **LSH),
                (shapes.signature(x), shapes.signature(mask)))
  state = layer.state
  changed = x.copy()
  changed[0, 10:] = rs.normal(size=(6, 32))
  a = np.asarray(layer((x, mask)))
  layer.state = state  # The same hashing rotations for both calls.
  b = np.asarray(layer((changed, mask)))
  np.testing.assert_allclose(a[0, :10], b[0, :10], atol=1e-5)
  np.testing.assert_allclose(a[1], b[1], atol=1e-5)
  # Bidirectional: a change at the end reaches the start.
  changed[1, 15] += 3.0
  layer.state = state
  c = np.asarray(layer((changed, mask)))
  assert not np.allclose(a[1, :4], c[1, :4], atol=1e-6)


def test_lsh_core_replays_its_buckets():
  rs = np.random.RandomState(2)
  n_heads, batch, length, d_head = 2, 2, 16, 8
  qk = jnp.asarray(rs.normal(size=(batch * n_heads, length, d_head)),
                   jnp.float32)
  v = jnp.asarray(rs.normal(size=qk.shape), jnp.float32)
  core = LSHCore(n_heads=n_heads, d_qk=d_head, d_v=d_head, causal=True,
                 chunk_len=4, n_hashes=2, n_buckets=4)
  core.init(shapes.signature((qk, v)), rng=jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(1)
  out, new_state = core.pure_fn((qk, v), (), core.state, rng)
  buckets = np.asarray(new_state[0])
  assert buckets.shape == (batch * n_heads, 2 * length)
  # The forward pass hashed anew: buckets are not the initial zeros.
  assert (buckets != np.asarray(core.state[0])).any()
  replay = core.replay_state(core.state, new_state)
  replayed, replayed_state = core.pure_fn((qk, v), (), replay, rng)
  np.testing.assert_allclose(np.asarray(replayed), np.asarray(out), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(replayed_state[0]), buckets)
  # Other queries: the replay keeps the stored buckets, a fresh pass does not.
  other = qk[:, ::-1]
  _, fresh_state = core.pure_fn((other, v), (), core.state, rng)
  _, kept_state = core.pure_fn((other, v), (), replay, rng)
  np.testing.assert_array_equal(np.asarray(kept_state[0]), buckets)
  assert (np.asarray(fresh_state[0]) != buckets).any()


def test_gradients_flow_through_replayed_lsh():
  rs = np.random.RandomState(3)
  qk = jnp.asarray(rs.normal(size=(4, 16, 8)), jnp.float32)
  v = jnp.asarray(rs.normal(size=qk.shape), jnp.float32)
  core = LSHCore(n_heads=2, d_qk=8, d_v=8, causal=True, chunk_len=4,
                 n_hashes=1)
  core.init(shapes.signature((qk, v)), rng=jax.random.PRNGKey(0))
  rng = jax.random.PRNGKey(1)
  _, new_state = core.pure_fn((qk, v), (), core.state, rng)

  def loss(qk, v, state):
    y, _ = core.pure_fn((qk, v), (), state, rng)
    return jnp.sum(y ** 2)

  fresh = jax.grad(loss, argnums=(0, 1))(qk, v, core.state)
  replayed = jax.grad(loss, argnums=(0, 1))(
      qk, v, core.replay_state(core.state, new_state))
  for a, b in zip(fresh, replayed):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
    assert float(jnp.max(jnp.abs(a))) > 0


@pytest.mark.parametrize('length,chunk_len', [(16, 4), (640, 64),
                                              (17408, 128)])
def test_decode_bucket_count_is_traxs_count_for_that_length(length,
                                                             chunk_len):
  # Trax derives the count from the length (n_buckets=None); the fixed count
  # must hash a sequence of that length the same way.
  vecs = jnp.asarray(np.random.RandomState(0).normal(size=(length, 4)),
                     jnp.float32)
  rng = jax.random.PRNGKey(3)

  def hashed(n_buckets):
    layer = efficient_attention.PureLSHSelfAttention(
        n_heads=1, d_qk=4, d_v=4, causal=True, chunk_len=chunk_len,
        n_hashes=2, n_buckets=n_buckets)
    return np.asarray(layer.hash_vectors(vecs, rng))

  np.testing.assert_array_equal(
      hashed(decode_bucket_count(length, chunk_len)), hashed(None))


def _decoder_buckets(layer):
  """The LSH bucket table [batch * heads, rounds * memory] of a decoder."""
  tables = [x for x in jax.tree_util.tree_leaves(layer.state)
            if x.dtype == jnp.int32 and x.ndim == 2]
  assert len(tables) == 1
  return np.asarray(tables[0])


def test_decoding_hashes_each_token_as_the_prefill_does():
  # Prefill 8 positions and decode the 9th, or prefill all 9: the same
  # buckets for every position. With Trax's length-derived count the two
  # prefills would hash into 4 and 6 buckets and the decoded token into 2.
  d_model, heads, length = 16, 2, 9
  x = np.random.RandomState(4).normal(size=(1, length, d_model)).astype(
      np.float32)
  lengths = np.full((1,), length, np.int32)   # No encoder padding: no junk.

  def decoder():
    layer = SelfAttention(d_model, heads, 'lsh', causal=True, mode='predict',
                          predict_mem_len=16, predict_drop_len=8, **LSH)
    layer.init((shapes.signature(x[:, :8]), shapes.signature(lengths)),
               rng=jax.random.PRNGKey(0))
    return layer

  stepped = decoder()
  stepped((x[:, :8], lengths))
  stepped((x[:, 8:], lengths))
  whole = decoder()
  whole((x, lengths))
  np.testing.assert_array_equal(
      _decoder_buckets(stepped).reshape(heads, 2, 16)[:, :, :length],
      _decoder_buckets(whole).reshape(heads, 2, 16)[:, :, :length])


def test_decoding_step_equals_traxs_step_without_junk():
  # LSHCore's own decoding step (it masks junk positions) is Trax's step
  # when there is none: prefill of 6, then 5 steps, same state and rngs.
  rs = np.random.RandomState(5)
  rows, d_head, total = 4, 8, 11
  qk = jnp.asarray(rs.normal(size=(rows, total, d_head)), jnp.float32)
  v = jnp.asarray(rs.normal(size=qk.shape), jnp.float32)
  config = dict(n_heads=2, d_qk=d_head, d_v=d_head, causal=True,
                chunk_len=4, n_hashes=2, n_buckets=4, mode='predict',
                predict_mem_len=16, predict_drop_len=8)
  ours = LSHCore(**config)
  trax_layer = efficient_attention.PureLSHSelfAttention(**config)
  outputs = []
  for layer in (ours, trax_layer):
    layer.init(shapes.signature((qk[:, :6], v[:, :6])),
               rng=jax.random.PRNGKey(0))
    state, rng, out = layer.state, jax.random.PRNGKey(1), []
    for start, stop in [(0, 6)] + [(t, t + 1) for t in range(6, total)]:
      y, state = layer.pure_fn((qk[:, start:stop], v[:, start:stop]), (),
                               state, rng)
      out.append(np.asarray(y))
    outputs.append(np.concatenate(out, axis=1))
  np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-6)


def test_bad_attention_type():
  with pytest.raises(TerraformerError, match='attention_type'):
    SelfAttention(32, 4, 'linear')


def _causal_predict_steps(layer, q, k, v, lengths, prefill, state=None):
  """Prefill with `prefill` positions, then one position per jitted call."""
  step = jax.jit(layer.pure_fn)
  state = layer.state if state is None else state
  rng = jax.random.PRNGKey(0)
  out, state = step((q[:, :prefill], k[:, :prefill], v[:, :prefill],
                     lengths), (), state, rng)
  outputs = [np.asarray(out)]
  for t in range(prefill, q.shape[1]):
    out, state = step((q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], lengths),
                      (), state, rng)
    outputs.append(np.asarray(out))
  return np.concatenate(outputs, axis=1), state


def test_causal_decoding_reads_only_the_filled_cache_prefix():
  from terraformer.layers.lsh_attention import CausalDotProductAttention
  heads, batch, d_head, max_len, length, prefill = 2, 2, 4, 32, 20, 5
  rng = np.random.RandomState(0)
  q, k, v = (rng.randn(batch * heads, length, d_head).astype(np.float32)
             for _ in range(3))
  lengths = np.array([4, 2], np.int32)     # example 1: positions 3, 4 junk
  layer = CausalDotProductAttention(heads, max_len=max_len, mode='predict',
                                    min_bucket=4)
  assert layer.buckets == (4, 8, 16, 32)
  layer.init(tuple(shapes.signature(a) for a in (q[:, :1], k[:, :1],
                                                  v[:, :1], lengths)))
  fresh = layer.state
  steps, state = _causal_predict_steps(layer, q, k, v, lengths, prefill)
  # Oracle: the same steps attending over the whole cache (one bucket).
  whole = CausalDotProductAttention(heads, max_len=max_len, mode='predict',
                                    min_bucket=max_len)
  whole.init(tuple(shapes.signature(a) for a in (q[:, :1], k[:, :1],
                                                  v[:, :1], lengths)))
  expected, whole_state = _causal_predict_steps(whole, q, k, v, lengths,
                                                prefill)
  np.testing.assert_allclose(steps, expected, atol=1e-6, rtol=1e-6)
  for a, b in zip(state, whole_state):
    np.testing.assert_array_equal(a, b)
  # Real positions (not junk) match evaluation: the eval forward over the
  # whole sequence sees every position as a key.
  evaluate = CausalDotProductAttention(heads, mode='eval')
  full = np.asarray(evaluate((q, k, v, lengths)))
  np.testing.assert_allclose(steps[:heads], full[:heads], atol=1e-5,
                             rtol=1e-5)
  # Cache positions past the step's bucket are never read: poisoning them
  # leaves the output unchanged (10 filled + 1: the 16-position bucket).
  filled = 10
  _, state = _causal_predict_steps(layer, q[:, :filled], k[:, :filled],
                                   v[:, :filled], lengths, prefill, fresh)
  ks, vs, valid, idx = state
  assert int(idx) == filled
  poisoned = (jnp.asarray(ks).at[:, 16:].set(jnp.nan),
              jnp.asarray(vs).at[:, 16:].set(jnp.nan), valid, idx)
  x = (q[:, filled:filled + 1], k[:, filled:filled + 1],
       v[:, filled:filled + 1], lengths)
  out, _ = jax.jit(layer.pure_fn)(x, (), poisoned, jax.random.PRNGKey(0))
  np.testing.assert_allclose(out, expected[:, filled:filled + 1], atol=1e-6,
                             rtol=1e-6)
