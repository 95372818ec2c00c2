"""The multiplicative dense layer of Sparse QKV (paper §3.2, appendix 6.1)."""
import gin
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init


@gin.configurable(module='terraformer')
class MultiplicativeDense(tl.Layer):
  """Maps x in R^d to y in R^{S x M}: y[s, m] = sum_i x[i] D[s, i] E[i, m].

  Paper §3.2: it has d*S + d*M weights (plus S*M if `use_bias`) instead of
  d*S*M, yet can represent any permutation of its input (Theorem 1). The
  output is flattened to `S * M` features, module s at [s*M, (s+1)*M).

  Equal to Trax 1.4.1's `trax.layers.research.sparsity.FactoredDense(S, d,
  S*M, use_bias)`, weight for weight and in the same order: D [S, d] is its
  gating vectors, E [d, M] its projection matrix, b [S*M] its bias, with its
  initializers (normal(0.5), Glorot uniform, normal(1e-6)).
  """

  def __init__(self, n_modules, d_module, use_bias=False,
               d_initializer=init.RandomNormalInitializer(0.5),
               e_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(name=f'MultiplicativeDense_{n_modules}x{d_module}')
    self._n_modules = n_modules
    self._d_module = d_module
    self._use_bias = use_bias
    self._d_initializer = d_initializer
    self._e_initializer = e_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    d, e = self.weights[:2]
    # Scale x per module first, then one (S x d) @ (d x M) product per
    # position: never materialize a d x S x M tensor.
    scaled = x[..., None, :] * d                      # [..., S, d]
    y = jnp.einsum('...si,im->...sm', scaled, e)      # [..., S, M]
    y = y.reshape(x.shape[:-1] + (self._n_modules * self._d_module,))
    if self._use_bias:
      y = y + self.weights[2]
    return y

  def init_weights_and_state(self, input_signature):
    d_in = input_signature.shape[-1]
    rng_d, rng_e, rng_b = fastmath.random.split(self.rng, 3)
    d = self._d_initializer((self._n_modules, d_in), rng_d)
    e = self._e_initializer((d_in, self._d_module), rng_e)
    if self._use_bias:
      b = self._bias_initializer((self._n_modules * self._d_module,), rng_b)
      self.weights = (d, e, b)
    else:
      self.weights = (d, e)
