"""Sparse QKV attention: multiplicative layer + convolution (§3.2, Fig. 4b)."""
import gin
import jax
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

from terraformer.layers import composites
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention


LENGTH_PADDINGS = ('causal', 'centred')


@gin.configurable(module='terraformer')
class ModuleConv(tl.Layer):
  """2-D convolutions over (length, modules) of a [..., L, S*M] tensor (§3.2).

  The input is seen as an image of height L (length) and width S (modules)
  with M channels. Output i is a convolution with M filters of size
  `kernel_size` (length) x `module_kernel_sizes[i]` (modules), zero-padded
  along modules to keep S modules; each output has its own kernel
  [F, F_i, M, M] and bias [M], in this order: weights (K_1, b_1, K_2, b_2,
  ...). This is Trax 1.4.1's `LocallyConvDense(S, M, mode, kernel_size=F_i,
  length_kernel_size=F)` (its `tl.Conv` weights, in Trax's order), one per
  output; they share one input and, in predict mode, one state.

  `length_padding='causal'` (default, Trax's `_RememberPad`): each position
  sees itself and the F-1 previous positions; in predict mode the layer keeps
  those F-1 previous inputs as state. 'centred' (non-causal encoders only)
  sees (F-1)//2 positions before and F//2 after.
  """

  def __init__(self, n_modules, d_module, kernel_size=3,
               module_kernel_sizes=(3,), length_padding='causal',
               mode='train',
               kernel_initializer=init.GlorotNormalInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    n_outputs = len(module_kernel_sizes)
    super().__init__(n_out=n_outputs, name=f'ModuleConv_{kernel_size}x'
                     + 'x'.join(str(k) for k in module_kernel_sizes))
    if length_padding not in LENGTH_PADDINGS:
      raise ValueError(f'length_padding must be one of {LENGTH_PADDINGS}, '
                       f'got {length_padding!r}.')
    if mode == 'predict' and length_padding != 'causal':
      raise ValueError('A non-causal convolution cannot decode step by step.')
    self._n_modules = n_modules
    self._d_module = d_module
    self._kernel_size = kernel_size
    self._module_kernel_sizes = tuple(module_kernel_sizes)
    self._length_padding = length_padding
    self._mode = mode
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    f = self._kernel_size
    image = x.reshape(x.shape[:-1] + (self._n_modules, self._d_module))
    if self._mode == 'predict':
      if f > 1:
        image = jnp.concatenate([self.state, image], axis=1)
        self.state = image[:, -(f - 1):]
      length_pad = (0, 0)
    elif self._length_padding == 'causal':
      length_pad = (f - 1, 0)
    else:
      length_pad = ((f - 1) // 2, f // 2)
    outputs = [y.reshape(x.shape)
               for y in self._convolve_all(image, length_pad)]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)

  def _convolve_all(self, image, length_pad):
    """[output i for each kernel]: image [B, L, S, M] -> [B, L', S, M]."""
    return [self._convolve(image, i, length_pad)
            for i in range(len(self._module_kernel_sizes))]

  def _convolve(self, image, i, length_pad):
    """Output i: image [B, L, S, M] -> [B, L', S, M]."""
    fm = self._module_kernel_sizes[i]
    kernel, bias = self.weights[2 * i:2 * i + 2]
    return jax.lax.conv_general_dilated(
        image, kernel, window_strides=(1, 1),
        padding=(length_pad, ((fm - 1) // 2, fm // 2)),
        dimension_numbers=('NHWC', 'HWIO', 'NHWC')) + bias

  def init_weights_and_state(self, input_signature):
    f, m = self._kernel_size, self._d_module
    rngs = fastmath.random.split(self.rng, 2 * len(self._module_kernel_sizes))
    weights = []
    for i, fm in enumerate(self._module_kernel_sizes):
      weights += [self._kernel_initializer((f, fm, m, m), rngs[2 * i]),
                  self._bias_initializer((m,), rngs[2 * i + 1])]
    self.weights = tuple(weights)
    if self._mode == 'predict' and f > 1:
      batch = input_signature.shape[0]
      self.state = jnp.zeros((batch, f - 1, self._n_modules, m),
                             dtype=input_signature.dtype)


def SparseQKV(d_model, n_modules, kernel_size=3, n_outputs=3, causal=True,
              mode='train', module_kernel_size=None, value_module_kernel_size=1,
              length_padding=None):
  """x -> conv_q(mult(x)), conv_k(mult(x)), conv_v(mult(x)) (§3.2, Fig. 4b).

  One multiplicative layer (with a bias, as Trax's `FactoredDense`) shared by
  all outputs; S = `n_modules` modules of size M = d_model / S; each output
  is laid out as S heads of size M, ready for attention without reshaping.
  Q and K convolutions are F x F' (length x modules), F = `kernel_size`,
  F' = `module_kernel_size` (None: F, the paper's F x F; Trax fixes F' = 3,
  the same for the paper's F = 3); the V convolution is F x
  `value_module_kernel_size` (Trax's `MultiplicativeConvCausalAttention`: 1).
  `n_outputs=1` gives the query path only (Trax's sparse `AttentionQKV`
  queries). `length_padding` defaults to 'causal' if `causal` else
  'centred'.
  """
  if d_model % n_modules:
    raise ValueError(f'd_model={d_model} is not a multiple of the number of '
                     f'modules S={n_modules}.')
  if n_outputs not in (1, 3):
    raise ValueError(f'n_outputs must be 1 (Q) or 3 (Q, K, V), got '
                     f'{n_outputs}.')
  d_module = d_model // n_modules
  qk = kernel_size if module_kernel_size is None else module_kernel_size
  module_kernel_sizes = (qk,) if n_outputs == 1 else (
      qk, qk, value_module_kernel_size)
  if length_padding is None:
    length_padding = 'causal' if causal else 'centred'
  return composites.mark(tl.Serial(
      MultiplicativeDense(n_modules, d_module, use_bias=True),
      ModuleConv(n_modules, d_module, kernel_size, module_kernel_sizes,
                 length_padding, mode),
  ), composites.SPARSE_QKV)


@gin.configurable(module='terraformer')
def SparseQKVCausalAttention(d_model, n_modules=16, kernel_size=3,
                             dropout=0.0, max_len=2048, mode='train'):
  """Causal self-attention with sparse Q, K, V and no output layer (Fig. 4b).

  x -> y, both [batch, length, d_model]; S = `n_modules` heads of size
  d_model / S. Predict mode caches keys and values for `max_len` positions
  and reads only the filled part of that cache (PrefixCausalAttention).
  Equal to Trax 1.4.1's `MultiplicativeConvCausalAttention(d_model,
  n_heads=S, sparsity=S, length_kernel_size=F)` (default options) for F = 3,
  weight for weight in the same order.
  """
  return composites.mark(tl.Serial(
      SparseQKV(d_model, n_modules, kernel_size, 3, causal=True, mode=mode),
      tl.Parallel(tl.SplitIntoHeads(n_modules), tl.SplitIntoHeads(n_modules),
                  tl.SplitIntoHeads(n_modules)),
      PrefixCausalAttention(dropout=dropout, max_inference_length=max_len,
                            mode=mode),
      tl.MergeHeads(n_modules),
  ), composites.SPARSE_QKV_CAUSAL_ATTENTION)


@gin.configurable(module='terraformer')
def SparseQKVAttention(d_model, n_modules=16, kernel_size=3, dropout=0.0,
                       mode='train', length_padding='causal'):
  """Bidirectional (encoder) sparse QKV attention: (x, mask) -> (y, mask).

  The Q/K/V convolutions are causal along length by default, as in Trax
  (`MultiplicativeConvCausalAttention` used in `ConfigurableTransformer`'s
  encoder); `length_padding='centred'` centres them instead.
  """
  return tl.Serial(
      SparseQKV(d_model, n_modules, kernel_size, 3, mode=mode,
                length_padding=length_padding),
      tl.PureAttention(n_heads=n_modules, dropout=dropout, mode=mode),
  )
