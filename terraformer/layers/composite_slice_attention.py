"""Composite slice attention (CSA) of the Composite Slice Transformer.

Lee et al., "Composite Slice Transformer" (ICLR 2023) §4.1-4.2, App. A.3,
A.9. The sequence X [B, N, D] is cut into N/L slices of L tokens (a reshape)
and two attentions run one after the other (the "composition"):

  local   full-resolution multi-head attention inside each slice, keys and
          values extended by e = (α-1)L/2 tokens of the neighbouring slices on
          each side (eq. 11; left side only when causal, eq. 12):
            Y_l = softmax(((S+P_l)W_q)((S_ext+P_l,ext)W_k)ᵀ/√d_h) S_ext W_v;
  global  the slice embeddings S̄_s = Σ_l m_sl Y_l,sl / Σ_l m_sl (masked mean of
          the LOCAL OUTPUT over each slice) attend to each other (eq. 9, 15):
            Ȳ_g = softmax(((S̄+P_g)W_q)((S̄+P_g)W_k)ᵀ/√d_h) S̄ W_v;
  output  Y_i = Y_l,i + Ȳ_g,slice(i), the global output broadcast over its
          slice (eq. 10).

MS-VIPE (§4.2, eq. 14-15): two learned tables, P_l [αL, D] (L + e rows when
causal) and P_g [max_len / L, D], added to the queries' and keys' inputs
inside the layer, never to the values. Queries use the central L rows of P_l
(an inference: the paper extends P_l "similarly to K_ext"). The paper shares
one pair of tables across all layers (A.3); here each layer owns its tables.

Weights: one set of W_q, W_k, W_v, W_o (dense, with biases), shared by the
local and the global attention (A.3, "share the weights between local and
global attentions"). Where W_o sits is not specified; here each branch is a
complete attention (W_o included), so S̄ lives in the same space as X, and
with one slice, α = 1 and the global branch off the layer is exactly
`tl.Attention` (plus P_l on queries and keys).

Causal (§4.1, eq. 12, A.9): an L×L causal mask inside the slice with the
left extension visible; globally slice t reads the slices u < t only (the
diagonal is masked too) with the previous slice's query Q_g,t-1; slice 0 gets
no global term. Zero-filled extension keys (before the first or after the
last slice) and padding are masked (the paper does not say; masking keeps
the layer independent of the padding). N need not be a multiple of L: the
last slice is padded with masked positions.

Predict mode (causal only) decodes token by token, each example at its own
position (so a per-example prefill works): a ring buffer of the last
e + L keys and values (without P_l: its key term is added per window
position), the running sum of the current slice's local outputs, the global
keys/values of the finished slices and the global output of the current
slice, computed once when the previous slice ends.
"""
import gin
import jax
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

from terraformer.errors import TerraformerError


def check_dense_qkv(attention_sparsity):
  """CST projects Q/K/V itself (dense, shared by its two attentions)."""
  if attention_sparsity:
    raise TerraformerError(
        "attention_type='cst' has its own dense Q/K/V (shared by the local "
        "and global attentions, CST App. A.3); set attention_sparsity=0")


def _softmax_masked(dots, valid):
  dots = jnp.where(valid, dots, jnp.full_like(dots, -1e9))
  return jax.nn.softmax(dots, axis=-1)


@gin.configurable(module='terraformer')
class CompositeSliceAttention(tl.Layer):
  """Bidirectional `(x, mask) -> y`, causal `x -> y`; x, y [B, N, d_model].

  Args:
    d_model: width D.
    n_heads: heads (D / n_heads each), in the local and global attentions.
    slice_len: L.
    extension: α ∈ {1, 2, 3} (eq. 11); e = (α-1)L/2 must be an integer.
    causal: decoder (eq. 12 and the shifted global query) or encoder.
    use_global: False drops the global branch (local attention only).
    max_len: longest N; P_g has ceil(max_len / L) rows.
    dropout: rate on the attention weights in train mode.
    mode: 'train', 'eval' or 'predict' (causal only).
  """

  def __init__(self, d_model, n_heads=8, slice_len=32, extension=1,
               causal=False, use_global=True, max_len=2048, dropout=0.0,
               mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6),
               position_initializer=init.RandomNormalInitializer(0.02)):
    super().__init__(n_in=1 if causal else 2, n_out=1,
                     name=f'CompositeSliceAttention_L{slice_len}_a{extension}')
    if d_model % n_heads:
      raise TerraformerError(f'd_model={d_model} is not a multiple of '
                             f'n_heads={n_heads}')
    if slice_len < 1:
      raise TerraformerError(f'slice_len must be positive, got {slice_len}')
    if extension not in (1, 2, 3) or ((extension - 1) * slice_len) % 2:
      raise TerraformerError(
          f'CST slice extension α must be 1, 2 or 3 with (α-1)·L even '
          f'(eq. 11), got α={extension}, L={slice_len}')
    if mode == 'predict' and not causal:
      raise TerraformerError('bidirectional composite slice attention has no '
                             'predict mode (decode with causal=True)')
    self._d_model = d_model
    self._n_heads = n_heads
    self._slice_len = slice_len
    self._extension = extension
    self._causal = causal
    self._use_global = use_global
    self._max_len = max_len
    self._dropout = dropout
    self._mode = mode
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._position_initializer = position_initializer
    self._left = (extension - 1) * slice_len // 2
    self._right = 0 if causal else self._left
    self._window = self._left + slice_len + self._right
    self._max_slices = -(-max_len // slice_len)

  # Sizes.
  @property
  def window(self):
    """Keys per query: αL (bidirectional) or (α+1)L/2 (causal)."""
    return self._window

  def _heads(self, x):
    return x.reshape(x.shape[:-1] + (self._n_heads, -1))

  def _merge(self, x):
    return x.reshape(x.shape[:-2] + (-1,))

  def _dropout_weights(self, weights, rng):
    if self._mode != 'train' or not self._dropout:
      return weights
    keep = jax.random.bernoulli(rng, 1.0 - self._dropout, weights.shape)
    return jnp.where(keep, weights / (1.0 - self._dropout),
                     jnp.zeros_like(weights))

  def forward(self, inputs):
    if self._mode == 'predict':
      return self._predict(inputs)
    if self._causal:
      x, mask = inputs, None
    else:
      x, mask = inputs
    return self._forward_all(x, mask)

  def _forward_all(self, x, mask):
    wq, bq, wk, bk, wv, bv, wo, bo, p_local, p_global = (
        jnp.asarray(w) for w in self.weights)
    batch, n, d = x.shape
    big_l, left = self._slice_len, self._left
    n_slices = -(-n // big_l)
    if n_slices > self._max_slices:
      raise TerraformerError(
          f'composite slice attention: {n} positions need {n_slices} slices '
          f'of {big_l}, more than max_len={self._max_len} allows')
    padded = n_slices * big_l
    if mask is None:
      mask = jnp.ones((batch, n), dtype=bool)
    mask = mask.astype(bool)
    if padded != n:
      x = jnp.pad(x, ((0, 0), (0, padded - n), (0, 0)))
      mask = jnp.pad(mask, ((0, 0), (0, padded - n)))
    rng_local, rng_global = fastmath.random.split(self.rng)
    scale = 1.0 / jnp.sqrt(d // self._n_heads).astype(x.dtype)

    # Local attention (eq. 11, 12, 14).
    slices = x.reshape(batch, n_slices, big_l, d)
    q = (slices + p_local[left:left + big_l]) @ wq + bq     # [B, s, L, D]
    keys, values = x @ wk + bk, x @ wv + bv
    ext = ((0, 0), (left, self._right), (0, 0))
    keys, values = jnp.pad(keys, ext), jnp.pad(values, ext)
    key_mask = jnp.pad(mask, ((0, 0), (left, self._right)))
    # Window j of slice s: padded index s*L + j, position s*L - e + j.
    index = (jnp.arange(n_slices)[:, None] * big_l
             + jnp.arange(self._window)[None, :])            # [s, W]
    keys = keys[:, index] + p_local @ wk                    # [B, s, W, D]
    values, key_mask = values[:, index], key_mask[:, index]
    dots = jnp.einsum('bsqhd,bskhd->bshqk', self._heads(q),
                      self._heads(keys)) * scale
    valid = key_mask[:, :, None, None, :]                   # [B, s, 1, 1, W]
    if self._causal:                 # key j - e <= query i within the slice
      valid = valid & (jnp.arange(self._window)[None, :] - left
                       <= jnp.arange(big_l)[:, None])
    weights = self._dropout_weights(_softmax_masked(dots, valid), rng_local)
    local = jnp.einsum('bshqk,bskhd->bsqhd', weights, self._heads(values))
    local = self._merge(local) @ wo + bo                    # [B, s, L, D]
    y = local
    if self._use_global:
      y = y + self._global(local, mask.reshape(batch, n_slices, big_l),
                           rng_global, scale)[:, :, None, :]
    return y.reshape(batch, padded, d)[:, :n]

  def _global(self, local, slice_mask, rng, scale):
    """Ȳ_g [B, s, D] from the local outputs [B, s, L, D] (eq. 9, 10, 15)."""
    wq, bq, wk, bk, wv, bv, wo, bo, _, p_global = (
        jnp.asarray(w) for w in self.weights)
    n_slices = local.shape[1]
    m = slice_mask.astype(local.dtype)
    count = jnp.sum(m, axis=-1)                             # [B, s]
    summary = (jnp.einsum('bsl,bsld->bsd', m, local)
               / jnp.maximum(count, 1.0)[..., None])        # S̄
    positioned = summary + p_global[:n_slices]
    q, k = positioned @ wq + bq, positioned @ wk + bk
    v = summary @ wv + bv
    t = jnp.arange(n_slices)
    if self._causal:
      # Slice t reads slices u < t with the query of slice t - 1 (§4.1).
      q = jnp.concatenate([jnp.zeros_like(q[:, :1]), q[:, :-1]], axis=1)
      valid = (t[None, :] < t[:, None])[None, None]         # [1, 1, t, u]
    else:
      valid = (count > 0)[:, None, None, :]
    dots = jnp.einsum('bthd,buhd->bhtu', self._heads(q), self._heads(k)) * scale
    weights = self._dropout_weights(_softmax_masked(dots, valid), rng)
    out = self._merge(jnp.einsum('bhtu,buhd->bthd', weights,
                                 self._heads(v))) @ wo + bo
    if self._causal:
      out = jnp.where((t > 0)[None, :, None], out, jnp.zeros_like(out))
    return out

  def _predict(self, x):
    """Causal decoding of x [B, T, D], one position after another."""
    step_weights = tuple(jnp.asarray(w) for w in self.weights)

    def step(state, x_t):
      state, y_t = self._predict_step(step_weights, state, x_t)
      return state, y_t

    state, ys = jax.lax.scan(step, self.state, jnp.swapaxes(x, 0, 1))
    self.state = state
    return jnp.swapaxes(ys, 0, 1)

  def _predict_step(self, weights, state, x):
    """One position x [B, D]: (new state, y [B, D]).

    Every example keeps its own position counter, so a prefill that stops at
    a different length per example (`PerExamplePrefill`) decodes each one
    as its own sequence.
    """
    wq, bq, wk, bk, wv, bv, wo, bo, p_local, p_global = weights
    idx, ring_k, ring_v, ring_pos, slice_sum, g_keys, g_values, g_out = state
    big_l, left = self._slice_len, self._left
    size = left + big_l
    d = x.shape[-1]
    rows_b = jnp.arange(x.shape[0])
    scale = 1.0 / jnp.sqrt(d // self._n_heads).astype(x.dtype)
    s, p = idx // big_l, idx % big_l                        # [B]
    q = (x + p_local[left + p]) @ wq + bq
    slot = idx % size
    ring_k = ring_k.at[rows_b, slot].set(x @ wk + bk)
    ring_v = ring_v.at[rows_b, slot].set(x @ wv + bv)
    ring_pos = ring_pos.at[rows_b, slot].set(idx)
    window_index = ring_pos - (s * big_l - left)[:, None]   # row of P_l
    valid = (ring_pos >= 0) & (window_index >= 0)           # [B, R]
    qh = self._heads(q)                                     # [B, H, dh]
    content = jnp.einsum('bhd,brhd->bhr', qh, self._heads(ring_k))
    # q·(P_l W_k) = (W_k q)·P_l: the key's position term, O(D²) per step.
    q_back = jnp.einsum('bhd,ehd->bhe', qh, self._heads(wk))
    rows = p_local[jnp.clip(window_index, 0, size - 1)]     # [B, R, D]
    dots = (content + jnp.einsum('bhe,bre->bhr', q_back, rows)) * scale
    attn = _softmax_masked(dots, valid[:, None, :])
    local = self._merge(jnp.einsum('bhr,brhd->bhd', attn,
                                   self._heads(ring_v))) @ wo + bo
    y = local
    if self._use_global:
      y = y + g_out
      slice_sum = slice_sum + local
      done = p == big_l - 1                                 # [B]

      def finish_slice(operands):
        slice_sum, g_keys, g_values, g_out = operands
        summary = slice_sum / big_l
        at = jnp.minimum(s, self._max_slices - 1)
        positioned = summary + p_global[at]
        new_keys = g_keys.at[rows_b, at].set(positioned @ wk + bk)
        new_values = g_values.at[rows_b, at].set(summary @ wv + bv)
        g_q = self._heads(positioned @ wq + bq)
        g_dots = jnp.einsum('bhd,buhd->bhu', g_q,
                            self._heads(new_keys)) * scale
        seen = jnp.arange(self._max_slices)[None, :] <= s[:, None]
        g_attn = _softmax_masked(g_dots, seen[:, None, :])
        new_out = self._merge(jnp.einsum('bhu,buhd->bhd', g_attn,
                                         self._heads(new_values))) @ wo + bo

        def pick(new, old):
          return jnp.where(done.reshape((-1,) + (1,) * (new.ndim - 1)),
                           new, old)
        return (pick(jnp.zeros_like(slice_sum), slice_sum),
                pick(new_keys, g_keys), pick(new_values, g_values),
                pick(new_out, g_out))

      slice_sum, g_keys, g_values, g_out = jax.lax.cond(
          jnp.any(done), finish_slice, lambda operands: operands,
          (slice_sum, g_keys, g_values, g_out))
    state = (idx + 1, ring_k, ring_v, ring_pos, slice_sum, g_keys, g_values,
             g_out)
    return state, y

  def init_weights_and_state(self, input_signature):
    d = self._d_model
    signature = input_signature if self._causal else input_signature[0]
    rngs = fastmath.random.split(self.rng, 10)
    weights = []
    for i in range(4):                                      # q, k, v, o
      weights.append(self._kernel_initializer((d, d), rngs[2 * i]))
      weights.append(self._bias_initializer((d,), rngs[2 * i + 1]))
    weights.append(self._position_initializer((self._window, d), rngs[8]))
    weights.append(self._position_initializer((self._max_slices, d), rngs[9]))
    self.weights = tuple(weights)
    if self._mode == 'predict':
      batch, dtype = signature.shape[0], signature.dtype
      size = self._left + self._slice_len
      self.state = (
          jnp.zeros((batch,), jnp.int32),                   # positions
          jnp.zeros((batch, size, d), dtype),               # ring keys
          jnp.zeros((batch, size, d), dtype),               # ring values
          jnp.full((batch, size), -1, jnp.int32),           # their positions
          jnp.zeros((batch, d), dtype),                     # Σ local, slice
          jnp.zeros((batch, self._max_slices, d), dtype),   # global keys
          jnp.zeros((batch, self._max_slices, d), dtype),   # global values
          jnp.zeros((batch, d), dtype),                     # global output
      )
