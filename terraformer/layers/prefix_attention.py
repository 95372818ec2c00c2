"""Causal attention whose decoding step reads only the filled part of its cache.

Trax's `tl.DotProductCausalAttention` in predict mode keeps keys and values
for `max_inference_length` positions and attends over all of them (masking
the unfilled ones) at every step: decoding token t reads the whole cache, so
a 2048-position cache costs as much at t = 1 as at t = 2047. Unbatched
decoding is memory-bound (paper §1), so that read dominates a sparse model.
"""
import gin
import jax.numpy as jnp
from trax import fastmath
from trax.layers import attention

from terraformer.layers.ops import cache_buckets
from terraformer.layers.ops import logsumexp_last
from terraformer.layers.ops import prefix_switch


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
    self.state = (ks, vs, idx + q.shape[1])
    return self._attend_cache(q, ks, vs, idx)

  def _attend_cache(self, q, ks, vs, idx):
    """Attention of q (positions idx, idx + 1, ...) over the updated cache
    (`terraformer.kernels.layers` replaces it with a kernel reading the
    cache in place)."""
    length = q.shape[1]

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


