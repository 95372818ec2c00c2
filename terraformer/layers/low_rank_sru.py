"""Low-rank simple recurrent unit added to the feed-forward block (§4.3).

SRU (Lei et al., "Simple Recurrent Units for Highly Parallelizable
Recurrence", 2018), for inputs x_t of width n, as Trax 1.4.1's
`trax.layers.rnn.SRU` computes it:

  [r̃_t | f̃_t | x̃_t] = x_t W + b          (W [n, 3n], b [3n]: one Dense)
  r_t = σ(r̃_t),  f_t = σ(f̃_t)
  c_t = f_t ⊙ c_{t-1} + (1 - f_t) ⊙ x̃_t
  h_t = r_t ⊙ g(c_t) + (1 - r_t) ⊙ x_t · α,   α = √3 (`highway_scale`)

α = √3 is the SRU paper's scaling correction of the highway term (and
Trax's); `highway_scale=1.0` gives the uncorrected SRU.

The only sequential part, c_t, is a linear recurrence c_t = a_t c_{t-1} + u_t;
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

  Weights (W [n, 3n], b [3n]), outputs split in the order r, f, x̃: Trax's
  `tl.SRU(n)` Dense(3n) kernel and bias, mapping one to one. Args:
  activation g (None: identity, as Trax's default, or 'tanh');
  highway_scale α; mode.
  """

  def __init__(self, activation=None, mode='train', highway_scale=3 ** 0.5,
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(name='SRU')
    if activation not in ACTIVATIONS:
      raise ValueError(f'activation must be one of {sorted(ACTIVATIONS, key=str)}'
                       f', got {activation!r}')
    self._activation = activation
    self._mode = mode
    self._highway_scale = highway_scale
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    w, b = self.weights
    r, f, x_tilde = jnp.split(jnp.dot(x, w) + b, 3, axis=-1)
    r = jax.nn.sigmoid(r)
    f = jax.nn.sigmoid(f)
    a, u = f, (1.0 - f) * x_tilde                # c_t = a_t c_{t-1} + u_t
    # Prefix scan: (a, u) composed left to right gives c_t = A_t c_0 + U_t.
    a_cum, u_cum = jax.lax.associative_scan(_compose, (a, u), axis=1)
    if self._mode == 'predict':
      c = a_cum * self.state[:, None, :] + u_cum
      self.state = c[:, -1]
    else:
      c = u_cum
    return (r * ACTIVATIONS[self._activation](c)
            + (1.0 - r) * x * self._highway_scale)

  def init_weights_and_state(self, input_signature):
    n = input_signature.shape[-1]
    rng_w, rng_b = fastmath.random.split(self.rng)
    self.weights = (self._kernel_initializer((n, 3 * n), rng_w),
                    self._bias_initializer((3 * n,), rng_b))
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
  """x -> Dense_d_model(SRU(Dense_d_sru(x))) (§4.3): a cheap recurrence.

  Trax's `FeedForwardWithOptions` with `ff_use_sru=(1, d_sru)`:
  Dense(d_sru), SRU(d_sru), Dense(d_model) (after its LayerNorm).
  """
  return tl.Serial(tl.Dense(d_sru), SRU(activation, mode),
                   tl.Dense(d_model), name=f'LowRankSRU_{d_sru}')
