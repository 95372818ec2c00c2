"""Sparse QKV attention: multiplicative layer + convolution (§3.2, Fig. 4b)."""
import gin
import jax
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention


@gin.configurable(module='terraformer')
class ModuleConv(tl.Layer):
  """2-D convolution over (length, modules) of a [..., L, S*M] tensor (§3.2).

  The input is seen as an image of height L (length) and width S (modules)
  with M channels. Each of `n_outputs` outputs has M filters of size F x F;
  they are computed as one convolution with n_outputs * M filters (the same
  parameters as separate ones: F*F*M*M + M each). Causal convolutions see the
  current and F-1 previous positions; in predict mode they keep those F-1
  previous inputs as state. Non-causal ones are centred along length.
  """

  def __init__(self, n_modules, d_module, kernel_size=3, n_outputs=1,
               causal=True, mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(n_out=n_outputs,
                     name=f'ModuleConv_{kernel_size}x{kernel_size}')
    if mode == 'predict' and not causal:
      raise ValueError('A non-causal convolution cannot decode step by step.')
    self._n_modules = n_modules
    self._d_module = d_module
    self._kernel_size = kernel_size
    self._n_outputs = n_outputs
    self._causal = causal
    self._mode = mode
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    kernel, bias = self.weights
    f = self._kernel_size
    image = x.reshape(x.shape[:-1] + (self._n_modules, self._d_module))
    if self._mode == 'predict':
      if f > 1:
        image = jnp.concatenate([self.state, image], axis=1)
        self.state = image[:, -(f - 1):]
      length_pad = (0, 0)
    elif self._causal:
      length_pad = (f - 1, 0)
    else:
      length_pad = ((f - 1) // 2, f // 2)
    y = jax.lax.conv_general_dilated(
        image, kernel, window_strides=(1, 1),
        padding=(length_pad, ((f - 1) // 2, f // 2)),
        dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + bias
    outputs = jnp.split(y, self._n_outputs, axis=-1)
    outputs = [o.reshape(x.shape) for o in outputs]
    return outputs[0] if self._n_outputs == 1 else tuple(outputs)

  def init_weights_and_state(self, input_signature):
    f, m = self._kernel_size, self._d_module
    rng_kernel, rng_bias = fastmath.random.split(self.rng)
    kernel = self._kernel_initializer((f, f, m, self._n_outputs * m),
                                      rng_kernel)
    bias = self._bias_initializer((self._n_outputs * m,), rng_bias)
    self.weights = (kernel, bias)
    if self._mode == 'predict' and f > 1:
      batch = input_signature.shape[0]
      self.state = jnp.zeros((batch, f - 1, self._n_modules, m),
                             dtype=input_signature.dtype)


def SparseQKV(d_model, n_modules, kernel_size=3, n_outputs=3, causal=True,
              mode='train'):
  """x -> conv_q(mult(x)), conv_k(mult(x)), ...: one shared multiplicative layer.

  S = `n_modules` modules of size M = d_model / S; each output is laid out as
  S heads of size M, ready for attention without reshaping (§3.2).
  """
  if d_model % n_modules:
    raise ValueError(f'd_model={d_model} is not a multiple of the number of '
                     f'modules S={n_modules}.')
  d_module = d_model // n_modules
  return tl.Serial(
      MultiplicativeDense(n_modules, d_module),
      ModuleConv(n_modules, d_module, kernel_size, n_outputs, causal, mode),
  )


@gin.configurable(module='terraformer')
def SparseQKVCausalAttention(d_model, n_modules=16, kernel_size=3,
                             dropout=0.0, max_len=2048, mode='train'):
  """Causal self-attention with sparse Q, K, V and no output layer (Fig. 4b).

  x -> y, both [batch, length, d_model]; S = `n_modules` heads of size
  d_model / S. Predict mode caches keys and values for `max_len` positions
  and reads only the filled part of that cache (PrefixCausalAttention).
  """
  return tl.Serial(
      SparseQKV(d_model, n_modules, kernel_size, 3, causal=True, mode=mode),
      tl.Parallel(tl.SplitIntoHeads(n_modules), tl.SplitIntoHeads(n_modules),
                  tl.SplitIntoHeads(n_modules)),
      PrefixCausalAttention(dropout=dropout, max_inference_length=max_len,
                            mode=mode),
      tl.MergeHeads(n_modules),
  )


@gin.configurable(module='terraformer')
def SparseQKVAttention(d_model, n_modules=16, kernel_size=3, dropout=0.0,
                       mode='train'):
  """Bidirectional (encoder) sparse QKV attention: (x, mask) -> (y, mask)."""
  return tl.Serial(
      SparseQKV(d_model, n_modules, kernel_size, 3, causal=False, mode=mode),
      tl.PureAttention(n_heads=n_modules, dropout=dropout, mode=mode),
  )
