"""Causal attention whose decoding step reads only the filled part of its cache.

Trax's `tl.DotProductCausalAttention` in predict mode keeps keys and values
for `max_inference_length` positions and attends over all of them (masking
the unfilled ones) at every step: decoding token t reads the whole cache, so
a 2048-position cache costs as much at t = 1 as at t = 2047. Unbatched
decoding is memory-bound (paper §1), so that read dominates a sparse model.
"""
import gin
import jax
import jax.numpy as jnp
from trax import fastmath
from trax.layers import attention


@gin.configurable(module='terraformer')
class PrefixCausalAttention(attention.DotProductCausalAttention):
  """`tl.DotProductCausalAttention` with a prefix-reading predict mode.

  Same inputs (per-head q, k, v), state (keys, values, index) and outputs as
  Trax's layer in every mode; train and eval are Trax's code. In predict
  mode the step attends over the first `b` cached positions only, `b` the
  smallest bucket (`min_bucket`, 2 * min_bucket, ..., max_inference_length)
  holding every position written so far: a `lax.switch` picks one of a few
  static-shape branches, so decoding token t reads O(t) cache, not
  O(max_inference_length).
  """

  def __init__(self, dropout=0.0, max_inference_length=2048, mode='train',
               min_bucket=64):
    super().__init__(dropout=dropout,
                     max_inference_length=max_inference_length, mode=mode)
    self._buckets = cache_buckets(max_inference_length, min_bucket)

  @property
  def buckets(self):
    return self._buckets

  def forward(self, inputs):
    if self._mode != 'predict' or self._portal_mask is not None:
      return super().forward(inputs)
    q, new_k, new_v = inputs
    ks, vs, idx = self.state
    ks = fastmath.dynamic_update_slice_in_dim(ks, new_k, idx, axis=1)
    vs = fastmath.dynamic_update_slice_in_dim(vs, new_v, idx, axis=1)
    length = q.shape[1]
    self.state = (ks, vs, idx + length)

    def attend(size):
      def branch(q, ks, vs, idx):
        q = q.reshape(q.shape[:1] + (length,) + ks.shape[2:])
        keys, values = ks[:, :size], vs[:, :size]
        # Query i (position idx + i) sees keys at positions <= idx + i.
        mask = (jnp.arange(size)[None, None, :]
                <= (idx + jnp.arange(length))[None, :, None])
        dots = jnp.matmul(q, jnp.swapaxes(keys, -1, -2)) / jnp.sqrt(
            q.shape[-1]).astype(q.dtype)
        dots = jnp.where(mask, dots, jnp.full_like(dots, -1e9))
        weights = jnp.exp(dots - logsumexp_last(dots))
        return _flat(jnp.matmul(weights, values))
      return branch

    # The branches take and give [batch * heads, length * d_head]: 2-D
    # operands need no layout copies in and out of the conditional.
    out = prefix_switch(self._buckets, idx + length, attend, _flat(q), ks, vs,
                        idx)
    return out.reshape(q.shape[:2] + vs.shape[2:])


def _flat(x):
  """[n, length, d] -> [n, length * d] (a free reshape)."""
  return x.reshape((x.shape[0], -1))


def prefix_switch(buckets, count, branch, *operands):
  """`branch(size)(*operands)` for the smallest bucket size >= `count`.

  `count` (traced) is the number of cache positions a step needs; a
  `lax.switch` over the static `buckets` (doubling sizes, `cache_buckets`)
  runs the branch of the right size, so the step reads O(count) cache.
  """
  if len(buckets) == 1:
    return branch(buckets[0])(*operands)
  # Number of buckets too small for `count` positions.
  which = jnp.minimum(jnp.sum(jnp.asarray(buckets) < count), len(buckets) - 1)
  return jax.lax.switch(which, [branch(b) for b in buckets], *operands)


# XLA:CPU splits a reduction of more than this many elements along one axis
# into two operations (a reduce-window of this size, then a reduce).
_XLA_CPU_REDUCE_WINDOW = 32


def split_last(x):
  """(x viewed as [..., n / k, k] with n / k, k <= 32 if n factors so, the
  axes to reduce): one XLA:CPU operation per reduction over them."""
  n, most = x.shape[-1], _XLA_CPU_REDUCE_WINDOW
  if n > most:
    for k in range(most, 0, -1):
      if n % k == 0 and n // k <= most:
        return x.reshape(x.shape[:-1] + (n // k, k)), (-2, -1)
  return x, (-1,)


def logsumexp_last(x):
  """jax.nn.logsumexp(x, axis=-1, keepdims=True), one operation per
  reduction (decoding steps).

  Same formula as jax.nn.logsumexp (what Trax's fastmath.logsumexp is): the
  maximum (exact in any order) made safe for infinities, then log of the
  sum of exp(x - max), plus the maximum. Only the summation order of the
  exponentials differs (float rounding).
  """
  view, axes = split_last(x)
  amax = jnp.max(view, axis=axes, keepdims=True)
  amax = jax.lax.stop_gradient(
      jnp.where(jnp.isfinite(amax), amax, jnp.zeros_like(amax)))
  total = jnp.sum(jnp.exp(view - amax), axis=axes, keepdims=True)
  return (jnp.log(total) + amax).reshape(x.shape[:-1] + (1,))


def softmax_last(x):
  """jax.nn.softmax(x, axis=-1), one operation per reduction (decoding
  steps); as `logsumexp_last`, only the summation order differs."""
  view, axes = split_last(x)
  unnormalized = jnp.exp(view - jax.lax.stop_gradient(
      jnp.max(view, axis=axes, keepdims=True)))
  return (unnormalized / jnp.sum(unnormalized, axis=axes, keepdims=True)
          ).reshape(x.shape)


def cache_buckets(max_len, min_bucket=64):
  """Prefix sizes a PrefixCausalAttention step may read: doubling to max_len."""
  buckets, size = [], max(1, min(min_bucket, max_len))
  while size < max_len:
    buckets.append(size)
    size *= 2
  return tuple(buckets) + (max_len,)


def bucket_for(position_count, max_len, min_bucket=64):
  """Cache positions read by a step after `position_count` positions exist."""
  for size in cache_buckets(max_len, min_bucket):
    if size >= position_count:
      return size
  return max_len
