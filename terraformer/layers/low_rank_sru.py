"""Low-rank simple recurrent unit added to the feed-forward block (§4.3).

SRU (Lei et al. 2017, "Simple Recurrent Units for Highly Parallelizable
Recurrence"), for inputs x_t of width n:

  x̃_t = W x_t
  f_t = σ(W_f x_t + b_f)
  r_t = σ(W_r x_t + b_r)
  c_t = f_t ⊙ c_{t-1} + (1 - f_t) ⊙ x̃_t
  h_t = r_t ⊙ g(c_t) + (1 - r_t) ⊙ x_t

The only sequential part, c_t, is a linear recurrence c_t = a_t c_{t-1} + b_t;
it is computed with a parallel prefix scan (`jax.lax.associative_scan`) over
the length, so training is parallel over positions. In predict mode the layer
keeps c of the last position as its state and continues from it.

The Terraformer projects d_model down to a small width (32), applies the SRU
and projects back: "simply reducing the dimensionality of the SRUs works".
"""
import gin
import jax
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

ACTIVATIONS = {None: lambda c: c, 'tanh': jnp.tanh}


@gin.configurable(module='terraformer')
class SRU(tl.Layer):
  """Simple recurrent unit, [batch, length, n] -> [batch, length, n].

  Weights: W_all = [W | W_f | W_r] of shape [n, 3n] and b = [b_f | b_r] of
  shape [2n]. Args: activation g (None: identity, or 'tanh'); mode.
  """

  def __init__(self, activation=None, mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(name='SRU')
    if activation not in ACTIVATIONS:
      raise ValueError(f'activation must be one of {sorted(ACTIVATIONS, key=str)}'
                       f', got {activation!r}')
    self._activation = activation
    self._mode = mode
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    w, b = self.weights
    n = x.shape[-1]
    x_tilde, f, r = jnp.split(jnp.dot(x, w), 3, axis=-1)
    f = jax.nn.sigmoid(f + b[:n])
    r = jax.nn.sigmoid(r + b[n:])
    a, u = f, (1.0 - f) * x_tilde                # c_t = a_t c_{t-1} + u_t
    # Prefix scan: (a, u) composed left to right gives c_t = A_t c_0 + U_t.
    a_cum, u_cum = jax.lax.associative_scan(_compose, (a, u), axis=1)
    if self._mode == 'predict':
      c = a_cum * self.state[:, None, :] + u_cum
      self.state = c[:, -1]
    else:
      c = u_cum
    return r * ACTIVATIONS[self._activation](c) + (1.0 - r) * x

  def init_weights_and_state(self, input_signature):
    n = input_signature.shape[-1]
    rng_w, rng_b = fastmath.random.split(self.rng)
    self.weights = (self._kernel_initializer((n, 3 * n), rng_w),
                    self._bias_initializer((2 * n,), rng_b))
    if self._mode == 'predict':
      self.state = jnp.zeros((input_signature.shape[0], n),
                             input_signature.dtype)


def _compose(earlier, later):
  """(a1, u1) then (a2, u2): c -> a2 (a1 c + u1) + u2."""
  a1, u1 = earlier
  a2, u2 = later
  return a1 * a2, a2 * u1 + u2


@gin.configurable(module='terraformer')
def LowRankSRU(d_model, d_sru=32, activation=None, mode='train'):
  """x -> Dense_d_model(SRU(Dense_d_sru(x))) (§4.3): a cheap recurrence."""
  return tl.Serial(tl.Dense(d_sru), SRU(activation, mode),
                   tl.Dense(d_model), name=f'LowRankSRU_{d_sru}')
