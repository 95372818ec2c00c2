"""Encoder-decoder attention whose decoding step splits the encoder's keys and
values into heads once per input, not at every step.

Trax's `tl.PureAttention` (q, k, v, mask) -> (y, mask) splits k and v into
heads on every call. In predict mode k and v are the encoder's, computed once
and kept by `tl.Cache`, so every decoding step transposes all of them again
(and k once more for the dot): an 800M model with a 1024-token input spent
most of a step in those copies (24 blocks x 2 x 4 MB read and written per
token).
"""
import gin
import jax.numpy as jnp
from trax import layers as tl

from terraformer.layers.ops import logsumexp_last


@gin.configurable(module='terraformer')
def cross_attention_split_once(enabled=True):
  """Whether encoder-decoder attention is a `CrossAttention` (decoding keeps
  the encoder's keys and values split into heads); False gives Trax's
  `tl.PureAttention`, which splits them again at every decoding step (the
  same outputs: for timing the difference)."""
  return enabled


def EncoderDecoderAttention(n_heads, dropout, mode):
  """(q, k, v, mask) -> (y, mask): a `CrossAttention`, or Trax's
  `tl.PureAttention` where `cross_attention_split_once.enabled` is False."""
  layer = CrossAttention if cross_attention_split_once() else tl.PureAttention
  return layer(n_heads=n_heads, dropout=dropout, mode=mode)


class CrossAttention(tl.PureAttention):
  """`tl.PureAttention` whose predict mode keeps k and v split into heads.

  Same weights (none), inputs and outputs as Trax's layer; train and eval
  are Trax's code. In predict mode the first call (where `tl.Cache` computed
  k and v from the encoder) stores keys as [batch, heads, d_head, length]
  and values as [batch, heads, length, d_head] in the state; every call
  attends with those (`tl.Cache` hands the same k and v to later calls).
  The math is Trax's `_per_head_attention`: dots scaled by 1/sqrt(d_head),
  -1e9 where the mask is 0, exp(dots - logsumexp(dots)) times the values.
  """

  def forward(self, inputs):
    if self._mode != 'predict':
      return super().forward(inputs)
    q, k, v, mask = inputs
    if not self.state:  # The first call: k and v are new.
      self.state = (_heads(k, self._n_heads).swapaxes(-1, -2),
                    _heads(v, self._n_heads))
    keys_t, values = self.state
    queries = _heads(q, self._n_heads)
    d_head = queries.shape[-1]
    dots = jnp.matmul(queries, keys_t) / jnp.sqrt(d_head).astype(q.dtype)
    if mask is not None:
      dots = jnp.where(mask, dots, jnp.full_like(dots, -1e9))
    weights = jnp.exp(dots - logsumexp_last(dots))
    out = jnp.matmul(weights, values).astype(jnp.float32)
    batch, heads, length, _ = out.shape
    return (out.swapaxes(1, 2).reshape(batch, length, heads * d_head), mask)


def _heads(x, n_heads):
  """[batch, length, d] -> [batch, n_heads, length, d / n_heads]."""
  batch, length, d = x.shape
  return x.reshape(batch, length, n_heads, d // n_heads).swapaxes(1, 2)
