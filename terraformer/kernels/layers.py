"""Predict-mode layers that run the decode kernels, and weight storage.

Each class below is the decoding copy of a layer kind (a subclass: its
weights, names and every other behaviour stay the same; only the
predict-mode forward changes), made so by `installer.install`:

  SparseFF (predict)   -> KernelSparseFF              tf_sparse_ff
  MultiplicativeDense  -> KernelMultiplicativeDense   tf_skinny_matmul
                          (sparse QKV's and the sparse loss's, §3.2-3.3)
  tl.Dense             -> KernelDense                 tf_skinny_matmul
                          (both: tf_q8_matmul with 'q8' storage)
  ModuleConv (predict) -> KernelModuleConv            tf_q8_matmul ('q8')
                          (sparse QKV's convolutions, as a product)
  SparseQKV (predict)  -> KernelSparseQKV             tf_sparse_qkv ('q8')
                          (the two above in one call per step)
  SparseQKV + causal attention (predict)              tf_sparse_qkv_attention
                       -> KernelSparseQKVAttention    ('q8'; a decoder's
                          sparse QKV attention in one call per step)
  PrefixCausalAttention (predict)                     tf_cache_attention
                       -> KernelPrefixCausalAttention
  CausalDotProductAttention (predict)                 tf_cache_attention
                       -> KernelCausalDotProductAttention

(`block_layers` holds those that run a residual branch or a whole decoder
block in one call.) The attention layers' decoding step (one query per row)
reads its key/value cache in place with the kernel, only the filled
positions, instead of slicing a cache bucket for XLA's dots (a copy of the
bucket per step).
`store_weights(model, weights, storage)` converts those layers' large
matrices (W1ᵀ and W2 of SparseFF, E of MultiplicativeDense, W of Dense) to
bfloat16, or to int8 with one float32 scale per row (appended after the
layer's own weights: scaled rows of W1ᵀ/W2 are units, rows of E and W are
input features, whose scales fold into the input). Controllers (but
SparseFF's C2 in 'q8'), biases, embeddings and attention caches stay
float32, and so do ModuleConv's kernels except in 'q8'. `map_leaf_layers` is the walk
over a model's layers and weights that both this and the benchmark's random
weights (`terraformer.benchmarks.weight_factory`) use.

'q8' storage is int8 weights AND int8 activations for the dense products
(E and W): `pack_q8` stores W [K, N] output-major for the Q8 GEMV kernel
(`tf_q8_matmul`: groups of 16 outputs x 4 inputs, one float32 scale per
output, appended like int8's), and each call quantizes its input rows to
int8 per block of 32 (`quantize_activations`), the products being integer
dot products; ModuleConv's kernels [F, F', M, M] are packed as [F F' M, M]
(those of the same size side by side) and a step's convolutions are that
product over their patches. SparseFF,
whose step reads single rows, stores W1ᵀ and W2 as 'int8' and packs its
controller's C2 (the product (x C1) C2).

Each layer calls its kernel when `use_ffi` and the library is loaded
(`terraformer.kernels.available()`) and the step has at most MAX_FFI_ROWS
rows (tokens x modules); otherwise it runs the XLA code of its parent class
on dequantized weights ('q8': `q8_product`, the same quantized product) (first
calls over a whole prompt, missing library).
Training never sees these classes: only predict-mode models are installed.
"""
import jax
import jax.numpy as jnp
import numpy as np
from trax import layers as tl
from trax.layers import combinators as trax_combinators
from trax.layers import core as trax_core

from terraformer import kernels
from terraformer.kernels import compositions
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.multiplicative_dense import MultiplicativeDense
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.sparse_ff import SparseFF
from terraformer.layers.sparse_qkv_attention import ModuleConv

STORAGES = ('float32', 'bfloat16', 'int8', 'q8')
# The Q8 GEMV's layout (terraformer/kernels/q8_gemv.cc, "The Q8 GEMV"):
# outputs per group, inputs per activation scale (K is padded to a multiple
# of it), and the smallest block maximum that is not quantized to 0.
Q8_ROWS = 16
Q8_BLOCK = 32
Q8_TINY = 1e-30
# Most rows (tokens x modules) a kernel call takes; more go through XLA.
MAX_FFI_ROWS = 64


def quantize_rows(w):
  """(int8 q, float32 scales) with w[i] ~= q[i] * scales[i] (symmetric)."""
  w = jnp.asarray(w, jnp.float32)
  scale = jnp.abs(w).max(axis=tuple(range(1, w.ndim)))
  scale = jnp.where(scale > 0, scale / 127.0, 1.0).astype(jnp.float32)
  q = jnp.clip(jnp.rint(w / scale.reshape((-1,) + (1,) * (w.ndim - 1))),
               -127, 127).astype(jnp.int8)
  return q, scale


def _round_up(n, multiple):
  return -(-n // multiple) * multiple


def q8_packed_shape(k, n):
  """Shape of `pack_q8`'s int8 array for W [k, n]: [groups of 16 outputs,
  K padded to a multiple of Q8_BLOCK / 4, 16, 4]."""
  return (_round_up(n, Q8_ROWS) // Q8_ROWS, _round_up(k, Q8_BLOCK) // 4,
          Q8_ROWS, 4)


def pack_q8(w):
  """(packed int8, float32 scales [N]) of W [K, N] for the Q8 GEMV.

  One symmetric scale per output n (W[:, n] ~= q[:, n] * scale[n]), and
  packed[g, p, j, i] = q[4p + i, 16g + j], zeros past K and N: 64 bytes
  hold 4 consecutive inputs of 16 outputs, what one vpdpbusd multiplies;
  a block's 512 bytes are an AMX B tile (q8_gemv.cc, "The Q8 GEMV";
  q8_amx.cc).
  """
  k, n = w.shape
  q, scale = quantize_rows(jnp.asarray(w, jnp.float32).T)  # Rows: outputs.
  q = jnp.pad(q, ((0, _round_up(n, Q8_ROWS) - n),
                  (0, _round_up(k, Q8_BLOCK) - k)))
  packed = q.reshape(-1, Q8_ROWS, q.shape[1] // 4, 4).transpose(0, 2, 1, 3)
  return packed, scale


def is_q8(w):
  """True for a matrix stored by `pack_q8` (4-D; other storages are 2-D)."""
  return len(w.shape) == 4


def quantize_activations(x):
  """x [..., K] as the Q8 kernel multiplies it: per block of Q8_BLOCK
  inputs, d = max|x| / 127 and x ~= d * rint(x / d) (Q8_0), returned
  dequantized and padded with zeros to a multiple of Q8_BLOCK."""
  k = x.shape[-1]
  x = jnp.pad(jnp.asarray(x, jnp.float32),
              [(0, 0)] * (x.ndim - 1) + [(0, _round_up(k, Q8_BLOCK) - k)])
  blocks = x.reshape(x.shape[:-1] + (-1, Q8_BLOCK))
  amax = jnp.abs(blocks).max(axis=-1, keepdims=True)
  live = amax >= Q8_TINY
  d = jnp.where(live, amax / 127.0, 0.0)
  inv = jnp.where(live, 1.0 / jnp.where(live, d, 1.0), 0.0)
  q = jnp.clip(jnp.rint(blocks * inv), -127, 127)
  return (q * d).reshape(x.shape)


def q8_product(x, packed, scale):
  """x [..., K] -> [..., N]: XLA's version of `kernels.q8_matmul` (no g,
  no bias), the fallback of the 'q8' storage: the same quantized operands,
  float sums."""
  xq = quantize_activations(x)
  xq = xq.reshape(xq.shape[:-1] + (-1, 4))
  y = jnp.einsum('...pi,gpji->...gj', xq, packed.astype(jnp.float32))
  y = y.reshape(y.shape[:-2] + (-1,))[..., :scale.shape[0]]
  return y * scale


def _store(w, storage):
  """(stored matrix, [scales]) of a float32 matrix."""
  if storage == 'float32':
    return w, ()
  if storage == 'bfloat16':
    return jnp.asarray(w, jnp.bfloat16), ()
  if storage == 'q8':
    packed, s = pack_q8(w)
    return packed, (s,)
  q, s = quantize_rows(w)
  return q, (s,)


def _load(w, scale):
  """The float32 matrix a stored one stands for (XLA fallback)."""
  w = w.astype(jnp.float32)
  if scale is None:
    return w
  return w * scale.reshape((-1,) + (1,) * (w.ndim - 1))


class KernelMixin:
  """Holds the per-layer switch; set by `install`."""
  _tf_use_ffi = False

  def _ffi(self, rows):
    return self._tf_use_ffi and rows <= MAX_FFI_ROWS and kernels.available()


class KernelSparseFF(KernelMixin, SparseFF):
  """SparseFF whose predict-mode step is one `tf_sparse_ff` call.

  Weights (C1, C2, c, W1ᵀ, W2, b2[, s1, s2][, C2's scales]): int8 storage
  appends the row scales of W1ᵀ and W2; 'q8' stores W1ᵀ and W2 as 'int8'
  and packs the controller's C2 [r, F] for the Q8 GEMV (`pack_q8`, its F
  output scales last): at d_ff 73728 and r 64 C2 is 18.9 MB in float32,
  about as many bytes as the rows of W1ᵀ and W2 that a step reads.
  """

  def _split(self, w=None):
    c1, c2, c, w1t, w2, b2, *rest = self.weights if w is None else w
    c2_scale = rest.pop() if is_q8(c2) else None
    s1, s2 = rest if rest else (None, None)
    return (c1, c2, c, w1t, w2, b2), (s1, s2), c2_scale

  def step_arguments(self, x, weights):
    """`kernels.sparse_ff`'s keyword arguments after x for the block of
    tokens x with `weights`; None where the kernel does not run (`_ffi`)."""
    if not self._ffi(int(np.prod(x.shape[:-1]))):
      return None
    (c1, c2, c, w1t, w2, b2), (s1, s2), c2_scale = self._split(weights)
    return dict(c1=c1, c2=c2, c=c, w1t=w1t, w2=w2, b2=b2,
                block=self._n_block, s1=s1, s2=s2, c2_scale=c2_scale)

  def fused_step(self, x, weights, norm=None):
    """The block of tokens x with `weights` as one `tf_sparse_ff` call,
    first `tl.LayerNorm`-ing x when `norm` = (scale, bias, epsilon); None
    where the kernel does not run (`_ffi`)."""
    arguments = self.step_arguments(x, weights)
    if arguments is None:
      return None
    return kernels.sparse_ff(x, **arguments, norm=norm).astype(x.dtype)

  def controller_logits(self, x):
    c1, c2, bias = self.weights[:3]
    if not is_q8(c2):
      return super().controller_logits(x)
    logits = q8_product(jnp.dot(x, c1), c2, self.weights[-1]) + bias
    return logits.reshape(x.shape[:-1] + (self.n_blocks, self._n_block))

  def _forward_selected_rows(self, x):
    y = self.fused_step(x, self.weights)
    if y is not None:
      return y
    (c1, c2, c, w1t, w2, b2), (s1, s2), c2_scale = self._split()
    saved = self.weights
    self.weights = (c1, c2, c, _load(w1t, s1), _load(w2, s2), b2) + (
        () if c2_scale is None else (c2_scale,))
    try:
      return super()._forward_selected_rows(x)
    finally:
      self.weights = saved

  def store(self, weights, storage, store_matrix=_store):
    # The step reads single rows of W1ᵀ and W2 (float dot products and
    # axpys), not the dense products that 'q8' packs; the controller's
    # (x C1) C2 is one.
    c1, c2, c, w1t, w2, b2 = weights
    c2_scale = ()
    if storage == 'q8':
      c2, c2_scale = store_matrix(c2, 'q8')
      storage = 'int8'
    w1t, s1 = store_matrix(w1t, storage)
    w2, s2 = store_matrix(w2, storage)
    return (c1, c2, c, w1t, w2, b2) + s1 + s2 + c2_scale


class KernelMultiplicativeDense(KernelMixin, MultiplicativeDense):
  """MultiplicativeDense as one `tf_skinny_matmul` call per step
  (`tf_q8_matmul` with 'q8' storage).

  Weights (D, E[, b][, scales of E's rows, or of its columns with 'q8']
  [, scales of D's rows]): 'q8' also stores D [S, d] in int8, one scale per
  row (the kernel quantizes the rows x D[s] anyway): at 17B D is 2.4 MB in
  float32, about twice the packed E's bytes.
  """

  def _split(self, w=None):
    w = self.weights if w is None else w
    n = 3 if self._use_bias else 2
    d, e = w[0], w[1]
    bias = w[2] if self._use_bias else None
    scale = w[n] if len(w) > n else None
    d_scale = w[n + 1] if len(w) > n + 1 else None
    return d, e, bias, scale, d_scale

  def forward(self, x):
    d, e, bias, scale, d_scale = self._split()
    rows = int(np.prod(x.shape[:-1])) * self._n_modules
    if is_q8(e):
      if self._ffi(rows):
        return kernels.q8_matmul(x, e, scale, d, bias, d_scale).astype(x.dtype)
      d = _load(d, d_scale)
      y = q8_product(x[..., None, :] * d, e, scale)  # [..., S, M]
      y = y.reshape(x.shape[:-1] + (self._n_modules * self._d_module,))
      return (y if bias is None else y + bias).astype(x.dtype)
    if self._ffi(rows):
      return kernels.skinny_matmul(x, e, d, scale, bias).astype(x.dtype)
    saved = self.weights
    self.weights = (d, _load(e, scale)) + ((bias,) if self._use_bias else ())
    try:
      return super().forward(x)
    finally:
      self.weights = saved

  def store(self, weights, storage, store_matrix=_store):
    e, s = store_matrix(weights[1], storage)
    d, d_scale = weights[0], ()
    if storage == 'q8':
      d, d_scale = store_matrix(d, 'int8')
    return (d, e) + tuple(weights[2:]) + s + d_scale


class KernelDense(KernelMixin, trax_core.Dense):
  """tl.Dense as one `tf_skinny_matmul` call per step (`tf_q8_matmul`
  with 'q8' storage).

  Weights (W[, b][, scales of W's rows, or of its columns with 'q8']); W
  alone when it has no bias and is stored as a float.
  """

  def _split(self):
    return self._split_weights(self.weights)

  def _split_weights(self, w):
    """(W, bias or None, W's scales or None) of the weights w."""
    if not isinstance(w, (tuple, list)):
      return w, None, None
    n = 2 if self._use_bias else 1
    return w[0], (w[1] if self._use_bias else None), (
        w[n] if len(w) > n else None)

  def forward(self, x):
    w, bias, scale = self._split()
    ffi = self._ffi(int(np.prod(x.shape[:-1])))
    if is_q8(w):
      if ffi:
        return kernels.q8_matmul(x, w, scale, None, bias).astype(x.dtype)
      y = q8_product(x, w, scale)
      return (y if bias is None else y + bias).astype(x.dtype)
    if ffi:
      return kernels.skinny_matmul(x, w, None, scale, bias).astype(x.dtype)
    y = jnp.dot(x, _load(w, scale))
    return y if bias is None else y + bias

  def store(self, weights, storage, store_matrix=_store):
    if not isinstance(weights, (tuple, list)):
      weights = (weights,)
    w, s = store_matrix(weights[0], storage)
    return (w,) + tuple(weights[1:]) + s


def conv_patches(image, length_kernel, module_kernel, length_pad):
  """`ModuleConv`'s convolution as one product: image [B, L, S, M] ->
  patches [B, L', S, F * F' * M], the inputs that each output position sees,
  ordered as its kernel [F, F', M, M] (HWIO) flattened to [F * F' * M, M];
  zero padding along modules keeps S, `length_pad` (before, after) pads the
  length (predict mode: (0, 0) over the kept F - 1 inputs and the new ones).
  """
  modules = image.shape[2]
  padded = jnp.pad(image, ((0, 0), tuple(length_pad),
                           ((module_kernel - 1) // 2, module_kernel // 2),
                           (0, 0)))
  length = padded.shape[1] - length_kernel + 1
  patches = jnp.stack([padded[:, dl:dl + length, dm:dm + modules]
                       for dl in range(length_kernel)
                       for dm in range(module_kernel)], axis=-2)
  return patches.reshape(patches.shape[:3] + (-1,))


def _flat_kernel(w):
  """A conv kernel [F, F', M, M] (or its shape) as a matrix [F * F' * M, M]."""
  shape = (int(np.prod(w.shape[:-1])), w.shape[-1])
  if isinstance(w, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(shape, w.dtype)
  return jnp.reshape(w, shape)


def _side_by_side(arrays, axis):
  """Arrays (or `jax.ShapeDtypeStruct`s) concatenated along `axis`."""
  if isinstance(arrays[0], jax.ShapeDtypeStruct):
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    return jax.ShapeDtypeStruct(tuple(shape), arrays[0].dtype)
  return jnp.concatenate(arrays, axis=axis)


class KernelModuleConv(KernelMixin, ModuleConv):
  """ModuleConv (sparse QKV's convolutions, §3.2) whose predict-mode step,
  with 'q8' storage, runs its convolutions as `tf_q8_matmul` calls over
  their patches (`conv_patches`): integer dot products instead of XLA's
  float32 convolution. Other storages keep the float32 kernels and XLA's
  convolution.

  Outputs with the same module kernel size see the same patches (sparse
  QKV's Q and K): when M is a multiple of 16 (whole groups of `pack_q8`),
  'q8' stores their kernels side by side, [F * F' * M, n M], and one call
  computes them all, the patches quantized once (`_kernel_groups`).
  Weights with 'q8': (kernel, bias) per group of outputs, each kernel
  `pack_q8` of the flat kernels [F * F' * M, M] side by side and its bias
  the outputs' biases, then each group's scales.
  """

  def _kernel_groups(self):
    """[[outputs computed by one product]], in the order of the weights."""
    sizes = self._module_kernel_sizes
    if self._d_module % Q8_ROWS:
      return [[i] for i in range(len(sizes))]
    return [[i for i, fm in enumerate(sizes) if fm == size]
            for size in dict.fromkeys(sizes)]

  def _convolve_all(self, image, length_pad):
    if self.weights[0].dtype != jnp.int8:  # A float kernel is 4-D too.
      return super()._convolve_all(image, length_pad)
    groups = self._kernel_groups()
    m = self._d_module
    outputs = [None] * len(self._module_kernel_sizes)
    for j, same in enumerate(groups):
      kernel, bias = self.weights[2 * j:2 * j + 2]
      scale = self.weights[2 * len(groups) + j]
      patches = conv_patches(image, self._kernel_size,
                             self._module_kernel_sizes[same[0]], length_pad)
      if self._ffi(int(np.prod(patches.shape[:-1]))):
        y = kernels.q8_matmul(patches, kernel, scale, None, bias)
        for n, i in enumerate(same):
          outputs[i] = y[..., n * m:(n + 1) * m]
        continue
      # XLA: one product per output, as XLA sums an output's products in
      # an order that depends on the product's width.
      packed_rows = kernel.shape[0] // len(same)  # An output's in `kernel`.
      for n, i in enumerate(same):
        part = slice(n * m, (n + 1) * m)
        outputs[i] = q8_product(
            patches, kernel[n * packed_rows:(n + 1) * packed_rows],
            scale[part]) + bias[part]
    return outputs

  def store(self, weights, storage, store_matrix=_store):
    if storage != 'q8':
      return weights
    stored, scales = [], []
    for same in self._kernel_groups():
      flat = [_flat_kernel(weights[2 * i]) for i in same]
      kernel, s = store_matrix(_side_by_side(flat, 1), storage)
      stored += [kernel, _side_by_side([weights[2 * i + 1] for i in same], 0)]
      scales += list(s)
    return tuple(stored) + tuple(scales)


class KernelSparseQKV(KernelMixin, trax_combinators.Serial):
  """Sparse QKV (`SparseQKV`: MultiplicativeDense, then the predict-mode
  ModuleConv) whose decoding step, with 'q8' storage, is one
  `tf_sparse_qkv` call: the three `tf_q8_matmul` calls of its sublayers
  (the multiplicative layer, the Q and K convolutions side by side, the V
  convolution) on the same operands, so the same bits, with the
  convolutions' patches built in C++ instead of as XLA tensors. Weights and
  state are the Serial's. A prompt (more than one position), other
  storages, and module kernels other than sparse QKV's (F', F', F'_v with
  F'_v != F' and M a multiple of 16: `KernelModuleConv`'s two products)
  run the sublayers, each with its own kernel.
  """

  def _fusable(self, x, weights=None, n_outputs=3):
    """Whether the step of x runs as one product chain in C++: with
    `n_outputs` 3, sparse QKV's (Q/K and V kernels of different widths);
    with 1, the queries alone (a cross-attention's, `query_operands`)."""
    mult, conv = self.sublayers
    sizes = conv._module_kernel_sizes  # pylint: disable=protected-access
    w_mult, w_conv = self.weights if weights is None else weights
    widths_fit = (len(sizes) == 3 and sizes[0] == sizes[1] != sizes[2]
                  if n_outputs == 3 else len(sizes) == 1)
    return (self._tf_use_ffi and kernels.available()
            and x.ndim == 3 and x.shape[1] == 1
            and x.shape[0] * mult._n_modules <= MAX_FFI_ROWS  # pylint: disable=protected-access
            and widths_fit
            and conv._kernel_size > 1  # pylint: disable=protected-access
            and conv._d_module % Q8_ROWS == 0  # pylint: disable=protected-access
            and mult._use_bias and is_q8(w_mult[1])  # pylint: disable=protected-access
            and w_mult[0].dtype == jnp.int8 and w_conv[0].dtype == jnp.int8)

  def operands(self, weights, state):
    """`kernels.sparse_qkv`'s keyword arguments after x (the operands
    `operands.SPARSE_QKV` names, and the module kernel widths qk_width and
    v_width), from the Serial's weights and state."""
    mult, conv = self.sublayers
    d, e, bias, e_scale, d_scale = mult._split(weights[0])  # pylint: disable=protected-access
    k_qk, b_qk, k_v, b_v, s_qk, s_v = weights[1]
    sizes = conv._module_kernel_sizes  # pylint: disable=protected-access
    return dict(d=d, d_scale=d_scale, e=e, e_scale=e_scale, e_bias=bias,
                kept=state[1], qk=k_qk, qk_scale=s_qk, qk_bias=b_qk, v=k_v,
                v_scale=s_v, v_bias=b_v, qk_width=sizes[0],
                v_width=sizes[2])

  def query_operands(self, weights, state):
    """The queries-only step's operands (one output: `kernels.scaling_block`'s
    cross-attention keys d .. q_bias and q_width), from the Serial's
    weights and state."""
    mult, conv = self.sublayers
    d, e, bias, e_scale, d_scale = mult._split(weights[0])  # pylint: disable=protected-access
    k_q, b_q, s_q = weights[1]
    return dict(d=d, d_scale=d_scale, e=e, e_scale=e_scale, e_bias=bias,
                kept=state[1], q=k_q, q_scale=s_q, q_bias=b_q,
                q_width=conv._module_kernel_sizes[0])  # pylint: disable=protected-access

  def forward(self, xs):
    x = xs[0] if isinstance(xs, (tuple, list)) else xs
    if not (self._fusable(x) and kernels.has_kernel('tf_sparse_qkv')):
      return super().forward(xs)
    qkv, kept = kernels.sparse_qkv(x, **self.operands(self.weights,
                                                      self.state))
    self.state = (self.state[0], kept.astype(self.state[1].dtype))
    return tuple(y.astype(x.dtype) for y in qkv)


class KernelSparseQKVAttention(KernelMixin, trax_combinators.Serial):
  """A decoder's sparse QKV attention (SparseQKV, heads split, causal
  attention over a key/value cache, heads merged) whose decoding step, with
  'q8' storage, is one `tf_sparse_qkv_attention` call: `tf_sparse_qkv`'s
  products, the new keys and values written into the caches in place and
  `tf_cache_attention`'s attention over their filled part (the same
  operations, so the same bits as those two calls). The position index and
  the valid-key mask stay XLA's. A prompt, and whatever `KernelSparseQKV`
  or the attention kernel would not run, run the sublayers.
  """

  def step_arguments(self, x, weights, state):
    """`kernels.sparse_qkv_attention`'s keyword arguments after x (and
    its norm) for the step of x [B, 1, d] with `weights` and `state`, and
    the function of its (keys', values', kept') that gives the new state;
    None where the call cannot run. (The other inputs, the Terraformer's
    lengths, are not read by a step.)"""
    i, qkv, wrapped, i_att = compositions.sparse_qkv_causal_attention(self)
    attention = self.sublayers[i_att]
    unwrap = (lambda t: t[0]) if wrapped else (lambda t: t)
    w_qkv, s_qkv = unwrap(weights[i]), unwrap(state[i])
    s_att = state[i_att]
    if not (self._tf_use_ffi
            and kernels.has_kernel('tf_sparse_qkv_attention')
            and isinstance(qkv, KernelSparseQKV)
            and qkv._fusable(x, w_qkv)  # pylint: disable=protected-access
            and isinstance(attention, _KernelCacheAttention)
            and attention.reads_cache_in_place()
            and s_att[0].dtype == jnp.float32):
      return None
    masked = isinstance(attention, CausalDotProductAttention)
    ks, vs, *valid, idx = s_att
    arguments = dict(qkv.operands(w_qkv, s_qkv), keys=ks, values=vs, idx=idx,
                     valid=valid[0] if masked else None)

    def new_state(ks, vs, kept):
      s = list(state)
      s_new = (s_qkv[0], kept.astype(s_qkv[1].dtype))
      s[i] = (s_new,) if wrapped else s_new
      s[i_att] = (ks, vs, *valid, idx + 1)
      return tuple(s)

    return arguments, new_state

  def fused_step(self, x, weights, state, norm=None):
    """(y, new state) of the step of x [B, 1, d] as one
    `tf_sparse_qkv_attention` call, first `tl.LayerNorm`-ing x when `norm`
    = (scale, bias, epsilon); None where it cannot run."""
    step = self.step_arguments(x, weights, state)
    if step is None:
      return None
    arguments, new_state = step
    y, ks, vs, kept = kernels.sparse_qkv_attention(x, **arguments, norm=norm)
    return y.astype(x.dtype), new_state(ks, vs, kept)

  def forward(self, xs):
    x = xs[0] if isinstance(xs, (tuple, list)) else xs
    step = self.fused_step(x, self.weights, self.state)
    if step is None:
      return super().forward(xs)
    y, self.state = step
    return y


class _KernelCacheAttention(KernelMixin):
  """A decoding step's attention over the cache as one `tf_cache_attention`
  call: the cache is read in place, positions <= the query's only (the
  bucketed XLA path slices the smallest bucket holding them, a copy). The
  cache update stays the parent's in-place dynamic-update-slice."""

  def reads_cache_in_place(self):
    """True when a decoding step (one query per row, float32 cache) calls
    the kernel: it reads the filled positions only, not their bucket
    (`terraformer.benchmarks.bytes_read`)."""
    return (self._tf_use_ffi and kernels.available()
            and kernels.has_kernel('tf_cache_attention'))

  def _cache_ffi(self, q, ks):
    # One query per row (decoding); a prompt's first call keeps XLA's dots.
    return (q.shape[1] == 1 and ks.dtype == jnp.float32
            and self.reads_cache_in_place())

  def store(self, weights, storage, store_matrix=_store):  # pylint: disable=unused-argument
    return weights


class KernelPrefixCausalAttention(_KernelCacheAttention, PrefixCausalAttention):
  """PrefixCausalAttention (Trax's `DotProductCausalAttention` in predict
  mode) whose step attends with `tf_cache_attention`."""

  def _attend_cache(self, q, ks, vs, idx):
    if not self._cache_ffi(q, ks):
      return super()._attend_cache(q, ks, vs, idx)
    return kernels.cache_attention(q, ks, vs, idx).astype(q.dtype)


class KernelCausalDotProductAttention(_KernelCacheAttention,
                                      CausalDotProductAttention):
  """CausalDotProductAttention (Trax's `DotProductCausalAttention` math,
  with the cache's valid-key mask) whose step attends with
  `tf_cache_attention`."""

  def _attend_cache(self, q, ks, vs, valid, idx, pos):
    if not self._cache_ffi(q, ks):
      return super()._attend_cache(q, ks, vs, valid, idx, pos)
    return kernels.cache_attention(q, ks, vs, idx, valid).astype(q.dtype)


def map_leaf_layers(model, weights, fn):
  """`weights` with `fn(layer, w, run_once)` applied at each leaf layer.

  Walks the layer tree and the weights tree together: a layer whose weights
  split over its sublayers is descended into; at any other layer `w` (its
  weights) becomes `fn(layer, w, run_once)`, where `run_once` says that the
  layer is under a tl.Cache (run on the first call only: the encoder, the
  encoder-decoder keys and values). Shared weights (GET_WEIGHTS_FROM_CACHE)
  are kept. The one walker of the stored and the random decode weights.
  """
  def walk(layer, w, cached):
    if isinstance(w, dict) and w == tl.GET_WEIGHTS_FROM_CACHE:
      return w
    cached = cached or isinstance(layer, trax_combinators.Cache)
    subs = layer.sublayers
    if subs and isinstance(w, (tuple, list)) and len(w) == len(subs):
      return type(w)(walk(s, sw, cached) for s, sw in zip(subs, w))
    return fn(layer, w, cached)

  return walk(model, weights, False)


def store_weights(model, weights, storage, store_matrix=_store):
  """`weights` with the kernel layers' matrices in `storage` (installed
  model). Layers under tl.Cache (run on the first call only: the encoder)
  keep float32.

  `store_matrix(w, storage) -> (stored matrix, (scales,) or ())` stores one
  matrix: by default it converts the float32 array `w`;
  `weight_factory.random_stored_weights` passes one that creates a random
  stored matrix of `w`'s shape directly (no float32 copy).
  """
  if storage not in STORAGES:
    raise ValueError(f'weight storage must be one of {STORAGES}, got '
                     f'{storage!r}')
  if storage == 'float32':
    return weights

  def store(layer, w, run_once):
    if isinstance(layer, KernelMixin) and not run_once and not (
        layer.sublayers):
      return layer.store(w, storage, store_matrix)
    return w

  return map_leaf_layers(model, weights, store)
