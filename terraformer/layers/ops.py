"""Shared math of the layers: reductions, cache buckets, the replay state key.

- `split_last`, `logsumexp_last`, `softmax_last`: reductions over the last
  axis as one XLA:CPU operation each (decoding steps are made of many small
  ones): used by PrefixCausalAttention, CausalDotProductAttention, SparseFF.
- `cache_buckets`, `bucket_for`, `prefix_switch`: a decoding step reads only
  the filled prefix of its cache, in doubling bucket sizes.
- `REPLAY`: the state key under which a layer stores the discrete decisions
  of its forward pass (SparseFF's chosen units, LSH buckets) for a reversible
  re-run to reuse (`terraformer.layers.reversible`, §4.2).
"""
import jax
import jax.numpy as jnp

REPLAY = 'replay'  # State key of decisions to reuse (layers/reversible.py).


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
