"""Attention cores: LSH (Reformer, §4), causal full attention, prefill.

The dispatcher over all attention types is `terraformer.layers.attention`.
LSH attention: queries and keys share one vector, qk = (q + k) / 2, hashed
into buckets; each position attends within its chunk of the bucket-sorted
sequence and the chunk before it, and the one after it in a bidirectional
encoder. `CausalDotProductAttention` is the full causal core whose decoding
step reads only the filled prefix of its cache.

`LSHCore` is Trax's `PureLSHSelfAttention` with one addition for reversible
layers: its buckets are a discrete decision, stored in its state by the
forward pass, and `replay_state` makes a re-run reuse them (§4.2,
`terraformer.layers.reversible`).

Evaluation and decoding hash with a fixed key (`lsh_eval_seed`, folded with
the layer's index in the model) instead of the layer's per-call rng, so the
same weights and data give the same outputs on every call; training draws
fresh hashing rotations every step, as Trax does.

Decoder (causal) attention reads (x, lengths): `lengths` [batch] is the number
of real encoder positions before the first decoder position (the Terraformer
concatenates the encoder output with its padding removed). Train and eval
ignore it. In predict mode the first call primes the caches with the encoder
positions, the first decoder position and the junk after it
([e_1..e_n, d_0, junk...]); the cache masks each example's junk positions
for all later steps, and `PerExamplePrefill` takes the state of stateful
sequence layers (sparse QKV convolution, SRU) at each example's own last real
position, so decoding matches evaluation for any padding.

LSH decoding differs from Trax's `PureLSHSelfAttention` in predict mode in two
deliberate ways (`DecoderLSHCore`), both about hashing each decoded token as
the cached ones:
  - one bucket count for the whole decoding: with `n_buckets=None` Trax
    derives the count from the length of the call, so the prefill is hashed
    into 2 * length / chunk_len buckets but every decoded token into 2 (a
    call of length 1), and a token's bucket is compared with cached buckets
    of another hash function. `SelfAttention` fixes the count in predict
    mode (`decode_bucket_count`).
  - each example's junk positions of the prefill (after its first decoder
    position) are never attended: Trax would attend to them when they rank
    among the keys a step reads.
"""
import functools
import math

import jax
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers.research import efficient_attention

from terraformer.layers.ops import REPLAY as _REPLAY
from terraformer.layers.ops import cache_buckets
from terraformer.layers.ops import prefix_switch
from terraformer.layers.ops import softmax_last

# A cached position's bucket in every hashing round after the prefill marks it
# as junk (`DecoderLSHCore`); real buckets are >= 0.
JUNK_BUCKET = -1


def decode_bucket_count(length, chunk_len):
  """The bucket count Trax's LSH gives a sequence of `length` when
  `n_buckets` is None (`PureLSHSelfAttention.hash_vectors`): 2 buckets per
  chunk, as two factors (rotations) when over 128.

  Used as the fixed count of a decoder's LSH in predict mode, with `length`
  its cache length (the training length when they are equal).
  """
  n = 2 * max(1, length // chunk_len)
  if n <= 128:
    return n
  first = 2 ** math.ceil(math.log2(math.sqrt(n)))
  return [first, 2 * (n // (2 * first))]


class LSHCore(efficient_attention.PureLSHSelfAttention):
  """LSH attention on (qk, v[, mask]) split into heads; replays its buckets.

  Inputs qk, v: [batch * n_heads, length, d_head]; mask (bidirectional only):
  [batch, length], True on real tokens. Output like v. `eval_seed`: the
  hashing key in eval and predict modes (None: Trax's per-head keys in the
  state, which advance on every call, so evaluation is random).
  """

  def __init__(self, *args, eval_seed=0, mode='train', **kwargs):
    super().__init__(*args, mode=mode, **kwargs)
    self._fixed_hashing = mode != 'train' and eval_seed is not None
    self._eval_seed = eval_seed

  def _hashing_state(self, state):
    """`state` with its per-head hashing keys (which Trax's layer advances
    on every call) reset to keys drawn from `eval_seed`."""
    if not self._fixed_hashing:
      return state
    if self._incremental:
      mem_end, mem, inner = state
      return mem_end, mem, self._hashing_state_unbatched(inner)
    return self._hashing_state_unbatched(state)

  def _hashing_state_unbatched(self, state):
    *rest, keys = state                          # (buckets, [index,] keys)
    fixed = jax.random.split(jax.random.PRNGKey(self._eval_seed),
                             keys.shape[0])
    return (*rest, fixed.reshape(keys.shape).astype(keys.dtype))

  def forward(self, inputs):
    if isinstance(self.state, dict) and _REPLAY in self.state:
      stored = self.state[_REPLAY]
      output, _, _ = self.forward_and_or_backward(
          inputs, stored, self.rng, compute_output=True, update_state=False)
      self.state = stored
      return output
    output, new_state, _ = self.forward_and_or_backward(
        inputs, self._hashing_state(self.state), self.rng,
        compute_output=True, update_state=True)
    self.state = new_state
    return output

  def replay_state(self, state, new_state):
    """State under which `forward` reuses the buckets in `new_state`."""
    del state
    return {_REPLAY: new_state}

  def _incremental_forward_unbatched(self, qk, v, mask=None, *, q_start,
                                     q_len, state, rng, update_state):
    """Predict mode, one row: Trax's prefill (q_len > 1); a decoding step
    that reads no junk position (`JUNK_BUCKET`), otherwise Trax's step."""
    if q_len > 1:
      return super()._incremental_forward_unbatched(
          qk, v, mask, q_start=q_start, q_len=q_len, state=state, rng=rng,
          update_state=update_state)
    buckets, buckets_idx, hash_rng = state
    rounds = self._n_hashes
    table = jnp.reshape(buckets, (rounds, -1))   # [rounds, memory]
    size = table.shape[1]

    def roll(table):                             # The cache dropped positions.
      table = jnp.concatenate(
          [table, jnp.zeros((rounds, self._predict_drop_len), table.dtype)],
          axis=1)
      return fastmath.dynamic_slice_in_dim(table, buckets_idx - q_start, size,
                                           axis=1)
    table = jax.lax.cond(buckets_idx > q_start, roll, lambda t: t, table)
    query = fastmath.dynamic_slice_in_dim(qk, q_start, 1, axis=0)
    query = jnp.concatenate([query, query], 0)   # Trax hashes and attends 2 rows.
    query_buckets = jnp.reshape(self.hash_vectors(query, hash_rng),
                                (rounds, 2))[:, :1]
    table = fastmath.dynamic_update_slice_in_dim(table, query_buckets, q_start,
                                                 axis=1)
    length = qk.shape[0]
    position = jnp.arange(length, dtype=jnp.int32)
    real = jnp.all(table != JUNK_BUCKET, axis=0)
    same_bucket = jnp.any(table == query_buckets, axis=0)
    # Keys read (as Trax): past positions in the query's bucket, most recent
    # first, then the other past positions; junk positions last, and masked.
    priority = jnp.where(position > q_start + 1, -(length + position),
                         position) + length * same_bucket.astype(jnp.int32)
    priority = jnp.where(real, priority, -3 * length)
    _, order = fastmath.sort_key_val(priority, position)
    keys = order[-rounds * self._chunk_len * (1 + self._n_chunks_before):]
    # attend() adds 1 to key infos and masks those < 0.
    key_info = jnp.where(real[keys], keys, -2).astype(jnp.int32)
    attend_rng, _ = fastmath.random.split(rng)
    out, _ = efficient_attention.attend(
        query, efficient_attention.length_normalized(qk[keys]), v[keys],
        mask_fn=functools.partial(efficient_attention.mask_self_attention,
                                  causal=True, masked=True, exclude_self=True),
        q_info=q_start + jnp.arange(1, dtype=jnp.int32), kv_info=key_info,
        dropout=self._attention_dropout, rng=attend_rng)
    new_state = (jnp.reshape(table, (-1,)),
                 jnp.array(q_start + 1, buckets_idx.dtype), hash_rng)
    return out[:1], new_state


class DecoderLSHCore(tl.Layer):
  """(qk, v, lengths) -> LSHCore(qk, v): causal LSH with decoding prefill.

  `lengths` [batch] as in the module docstring. Train and eval ignore it. In
  predict mode the first call (the prefill) marks each example's positions
  after lengths[b] as junk in the core's cached buckets, so no later step
  attends to them.
  """

  def __init__(self, core, n_heads, mode='train'):
    super().__init__(n_in=3, n_out=1, name='DecoderLSHCore')
    self._sublayers = (core,)
    self._n_heads = n_heads
    self._mode = mode

  def forward(self, inputs):
    qk, v, lengths = inputs
    core = self.sublayers[0]
    out, state = core.pure_fn((qk, v), self.weights[0], self.state[0],
                              self.rng)
    if self._mode == 'predict' and qk.shape[1] > 1:
      mem_end, mem, (buckets, buckets_idx, hash_rng) = state
      rows, size = buckets.shape[0], mem[0].shape[1]
      position = jnp.arange(size)
      last_real = jnp.repeat(lengths, self._n_heads)[:, None]
      junk = (position[None, :] > last_real) & (position[None, :] < qk.shape[1])
      table = jnp.reshape(buckets, (rows, -1, size))
      table = jnp.where(junk[:, None, :], JUNK_BUCKET, table)
      state = (mem_end, mem,
               (jnp.reshape(table, buckets.shape), buckets_idx, hash_rng))
    self.state = (state,)
    return out

  def init_weights_and_state(self, input_signature):
    weights, state = self.sublayers[0].init(tuple(input_signature[:2]),
                                            rng=self.rng)
    self.weights, self.state = (weights,), (state,)


class CausalDotProductAttention(tl.Layer):
  """Causal softmax attention (q, k, v, lengths) -> y, per head.

  q, k, v: [batch * n_heads, length, d_head]; lengths: [batch] (see the
  module docstring). Train and eval: Trax's `DotProductCausalAttention`
  (scaled dot products, causal mask, attention dropout in train). Predict:
  keys and values cached for `max_len` positions; the first call marks each
  example's positions after lengths[b] (its junk) as invalid keys forever.
  A predict step attends over the first `b` cache positions only, `b` the
  smallest bucket (`min_bucket`, 2 * min_bucket, ..., max_len) holding every
  position written so far (`prefix_attention.prefix_switch`): decoding reads
  O(filled) cache, not O(max_len); the positions left out are unwritten
  (masked) ones, so the outputs are those of attending over the whole cache.
  """

  def __init__(self, n_heads, dropout=0.0, max_len=2048, mode='train',
               min_bucket=64):
    super().__init__(n_in=4, n_out=1, name='CausalDotProductAttention')
    self._n_heads = n_heads
    self._dropout = dropout
    self._max_len = max_len
    self._mode = mode
    self._buckets = cache_buckets(max_len, min_bucket)

  @property
  def buckets(self):
    return self._buckets

  def forward(self, inputs):
    q, k, v, lengths = inputs
    length = q.shape[1]
    if self._mode != 'predict':
      keys_valid = jnp.ones((1, k.shape[1]), jnp.bool_)
      return self._attend(q, k, v, keys_valid, jnp.arange(length))
    ks, vs, valid, idx = self.state
    ks = fastmath.dynamic_update_slice_in_dim(ks, k, idx, axis=1)
    vs = fastmath.dynamic_update_slice_in_dim(vs, v, idx, axis=1)
    pos = idx + jnp.arange(length)
    if length > 1:
      # First call (idx == 0): a position is real iff it is <= lengths[b]
      # (n encoder positions, then the first decoder position).
      last_real = jnp.repeat(lengths, self._n_heads)[:, None]
      written = (pos[None, :] <= last_real) | (idx > 0)
      valid = fastmath.dynamic_update_slice_in_dim(valid, written, idx,
                                                   axis=1)
    # else: one position, always real (idx > 0, or position 0 <= lengths[b]),
    # written at idx, never written before (positions only grow): it is
    # still True from the initial state, so the update is skipped (one XLA
    # operation less per decoding step).
    self.state = (ks, vs, valid, idx + length)
    return self._attend_cache(q, ks, vs, valid, idx, pos)

  def _attend_cache(self, q, ks, vs, valid, idx, pos):
    """Attention of q (positions `pos` = idx, idx + 1, ...) over the updated
    cache (`terraformer.kernels.layers` replaces it with a kernel reading
    the cache in place)."""
    length = q.shape[1]

    def attend(size):
      def branch(q, ks, vs, valid, pos):
        q = q.reshape(q.shape[:1] + (length,) + ks.shape[2:])
        out = self._attend(q, ks[:, :size], vs[:, :size], valid[:, :size],
                           pos, softmax=softmax_last)
        return out.reshape((out.shape[0], -1))
      return branch
    # 2-D operands and result ([batch * heads, length * d_head]) need no
    # layout copies in and out of the conditional.
    out = prefix_switch(self._buckets, idx + length, attend,
                        q.reshape((q.shape[0], -1)), ks, vs, valid, pos)
    return out.reshape(q.shape[:2] + vs.shape[2:])

  def _attend(self, q, ks, vs, keys_valid, query_pos, softmax=None):
    mask = ((jnp.arange(ks.shape[1])[None, None, :] <= query_pos[None, :, None])
            & keys_valid[:, None, :])
    dots = jnp.matmul(q, jnp.swapaxes(ks, -1, -2)) / jnp.sqrt(
        q.shape[-1]).astype(q.dtype)
    dots = jnp.where(mask, dots, jnp.full_like(dots, -1e9))
    weights = (softmax or jax.nn.softmax)(dots)
    if self._mode == 'train' and self._dropout > 0.0:
      keep = fastmath.random.bernoulli(self.rng, 1.0 - self._dropout,
                                       weights.shape)
      weights = jnp.where(keep, weights / (1.0 - self._dropout), 0.0)
    return jnp.matmul(weights, vs)

  def init_weights_and_state(self, input_signature):
    if self._mode != 'predict':
      return
    q = input_signature[0]
    shape = (q.shape[0], self._max_len, q.shape[2])
    self.state = (jnp.zeros(shape, q.dtype), jnp.zeros(shape, q.dtype),
                  jnp.ones(shape[:2], jnp.bool_), jnp.zeros((), jnp.int32))


class PerExamplePrefill(tl.Layer):
  """(inputs..., lengths) -> layer(inputs...): per-example decoding prefill.

  Wraps a stateful sequence layer (a causal convolution, an SRU) of a
  Terraformer decoder. In train and eval it is the layer. In predict mode
  the first call (the prefill, length > 1) computes the outputs of all
  positions at once and then the state the layer would have after each
  example's position lengths[b]: a scan over positions that keeps an
  example's state once it is past its last real position.
  """

  def __init__(self, layer, mode='train'):
    super().__init__(n_in=layer.n_in + 1, n_out=layer.n_out,
                     name=f'PerExamplePrefill_{layer.name}')
    self._sublayers = (layer,)
    self._mode = mode

  def forward(self, inputs):
    *xs, lengths = inputs
    layer = self.sublayers[0]
    xs = tuple(xs)
    args = xs if len(xs) > 1 else xs[0]
    weights, state = self.weights[0], self.state[0]
    out, new_state = layer.pure_fn(args, weights, state, self.rng)
    length = xs[0].shape[1]
    if self._mode == 'predict' and length > 1:
      new_state = self._state_at(layer, xs, lengths, weights, state)
    self.state = (new_state,)
    return out

  def _state_at(self, layer, xs, lengths, weights, state):
    batch = xs[0].shape[0]

    def step(carry, t):
      x_t = tuple(fastmath.dynamic_slice_in_dim(x, t, 1, axis=1) for x in xs)
      _, stepped = layer.pure_fn(x_t if len(x_t) > 1 else x_t[0], weights,
                                 carry, self.rng)
      keep = t <= lengths

      def pick(new, old):
        if getattr(new, 'ndim', 0) and new.shape[0] == batch:
          return jnp.where(keep.reshape((batch,) + (1,) * (new.ndim - 1)),
                           new, old)
        return new
      return jax.tree_util.tree_map(pick, stepped, carry), None

    final, _ = jax.lax.scan(step, state, jnp.arange(xs[0].shape[1]))
    return final

  def init_weights_and_state(self, input_signature):
    weights, state = self.sublayers[0].init(
        tuple(input_signature[:-1]) if self.n_in > 2 else input_signature[0],
        rng=self.rng)
    self.weights, self.state = (weights,), (state,)


