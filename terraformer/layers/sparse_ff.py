"""Sparse feed-forward block with a low-rank Gumbel-softmax controller (§3.1)."""
import gin
import jax
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

_REPLAY = 'replay'  # State key of decisions to reuse (layers/reversible.py).


@gin.configurable(module='terraformer')
class SparseFF(tl.Layer):
  """Feed-forward block where one unit in every block of N is active (§3.1).

    Y = max(0, x W1 + b1) ⊙ Controller(x),   SparseFF(x) = Y W2 + b2,
    Controller(x) = one-hot argmax(Reshape(x C1 C2, (-1, N))).

  Train mode samples the controller with the straight-through Gumbel-softmax
  estimator at `temperature`; the forward pass uses the hard one-hot with
  probability `quant_prob` and the soft sample otherwise (the paper's 30%).
  Eval and predict use the plain argmax.

  Weights (C1, C2, W1ᵀ, b1, W2, b2): W1 is stored transposed, [d_ff, d_model],
  so a unit's input and output weights are both one contiguous row. Predict
  mode first runs the controller, then gathers only the d_ff/N selected rows
  of W1ᵀ and W2: it never reads the full matrices.

  With `store_decisions` (reversible models, §4.2) the train-mode forward
  keeps the controller's choice in every block in its state,
  {'decisions': [..., n_blocks] ints}, and `replay_state` returns the state
  under which a re-run of the forward pass (when a reversible layer is
  reversed) reuses those choices instead of recomputing the argmax from a
  reconstructed input. Eval mode leaves the state as it is.
  """

  def __init__(self, d_ff, n_elements_in_block=32, d_lowrank=64,
               temperature=0.1, quant_prob=0.3, dropout=0.0, mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6),
               store_decisions=False):
    super().__init__(name=f'SparseFF_{d_ff}_N{n_elements_in_block}')
    if d_ff % n_elements_in_block:
      raise ValueError(f'd_ff={d_ff} is not a multiple of the block size '
                       f'N={n_elements_in_block}.')
    self._d_ff = d_ff
    self._n_block = n_elements_in_block
    self._d_lowrank = d_lowrank
    self._temperature = temperature
    self._quant_prob = quant_prob
    self._dropout = dropout
    self._mode = mode
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._store_decisions = store_decisions and mode != 'predict'

  @property
  def n_blocks(self):
    return self._d_ff // self._n_block

  def controller_logits(self, x):
    """Low-rank controller logits x C1 C2, shaped [..., n_blocks, N]."""
    c1, c2 = self.weights[:2]
    # (x C1) C2, in this order: never form the d_model x d_ff product C1 C2.
    logits = jnp.dot(jnp.dot(x, c1), c2)
    return logits.reshape(x.shape[:-1] + (self.n_blocks, self._n_block))

  def forward(self, x):
    if self._mode == 'predict':
      return self._forward_selected_rows(x)
    _, _, w1t, b1, w2, b2 = self.weights
    logits = self.controller_logits(x)
    if self._mode == 'train':
      rng_noise, rng_select, rng_dropout = fastmath.random.split(self.rng, 3)
      choice = (self.state.get(_REPLAY)
                if isinstance(self.state, dict) else None)
      if choice is None:
        choice = jnp.argmax(self._gumbel_noisy(logits, rng_noise), axis=-1)
      mask = self._gumbel_mask(logits, rng_noise, rng_select, choice)
      if self._store_decisions:
        self.state = {'decisions': choice.astype(self._decision_dtype)}
    else:
      mask = jax.nn.one_hot(jnp.argmax(logits, axis=-1), self._n_block,
                            dtype=x.dtype)
    h = jax.nn.relu(jnp.dot(x, w1t.T) + b1)
    h = h.reshape(mask.shape) * mask
    if self._mode == 'train' and self._dropout > 0.0:
      keep = fastmath.random.bernoulli(rng_dropout, 1.0 - self._dropout,
                                       h.shape)
      h = jnp.where(keep, h / (1.0 - self._dropout), 0.0)
    return jnp.dot(h.reshape(x.shape[:-1] + (self._d_ff,)), w2) + b2

  def _gumbel_noisy(self, logits, rng_noise):
    """Logits plus Gumbel noise: their argmax is a sample (Gumbel-max)."""
    u = fastmath.random.uniform(rng_noise, logits.shape, logits.dtype,
                                minval=1e-6, maxval=1.0 - 1e-6)
    return logits - jnp.log(-jnp.log(u))

  def _gumbel_mask(self, logits, rng_noise, rng_select, choice=None):
    """Straight-through Gumbel-softmax sample, hard with prob. quant_prob.

    `choice` ([..., n_blocks] unit indices, e.g. stored decisions) replaces
    the sampled argmax in the hard one-hot.
    """
    noisy = self._gumbel_noisy(logits, rng_noise)
    soft = jax.nn.softmax(noisy / self._temperature, axis=-1)
    if choice is None:
      choice = jnp.argmax(noisy, axis=-1)
    hard = jax.nn.one_hot(choice, self._n_block, dtype=logits.dtype)
    straight_through = hard + (soft - jax.lax.stop_gradient(soft))
    use_hard = fastmath.random.uniform(rng_select, ()) < self._quant_prob
    return jnp.where(use_hard, straight_through, soft)

  @property
  def _decision_dtype(self):
    return jnp.uint8 if self._n_block <= 256 else jnp.int32

  def replay_state(self, state, new_state):
    """State that makes the forward pass reuse `new_state`'s decisions."""
    if not self._store_decisions:
      return state
    return {_REPLAY: new_state['decisions']}

  def _forward_selected_rows(self, x):
    """Decoding: read only the selected row of W1ᵀ and W2 in every block."""
    _, _, w1t, b1, w2, b2 = self.weights
    tokens = x.reshape((-1, x.shape[-1]))                    # [T, d]
    selected = _first_argmax(self.controller_logits(tokens))  # [T, blocks]
    rows = (selected + jnp.arange(self.n_blocks) * self._n_block).reshape(-1)
    w1_rows = _take_rows(w1t, rows).reshape(selected.shape + (-1,))
    w2_rows = _take_rows(w2, rows).reshape(selected.shape + (-1,))
    # Per token: (rows of W1ᵀ) x, then h (rows of W2): two small GEMVs.
    h = jax.nn.relu(jnp.einsum('td,tbd->tb', tokens, w1_rows)
                    + _take_rows(b1, rows).reshape(selected.shape))
    y = jnp.einsum('tb,tbd->td', h, w2_rows) + b2
    return y.reshape(x.shape)

  def init_weights_and_state(self, input_signature):
    d_model = input_signature.shape[-1]
    rngs = fastmath.random.split(self.rng, 6)
    self.weights = (
        self._kernel_initializer((d_model, self._d_lowrank), rngs[0]),
        self._kernel_initializer((self._d_lowrank, self._d_ff), rngs[1]),
        self._kernel_initializer((self._d_ff, d_model), rngs[2]),
        self._bias_initializer((self._d_ff,), rngs[3]),
        self._kernel_initializer((self._d_ff, d_model), rngs[4]),
        self._bias_initializer((d_model,), rngs[5]),
    )
    if self._store_decisions:
      self.state = {'decisions': jnp.zeros(
          input_signature.shape[:-1] + (self.n_blocks,), self._decision_dtype)}


def _first_argmax(logits):
  """jnp.argmax over the last axis (first maximum), as two plain reductions.

  XLA:CPU runs argmax as a slow variadic (value, index) reduction; max, then
  the largest reversed index among the maxima, vectorizes.
  """
  n = logits.shape[-1]
  is_max = logits >= jnp.max(logits, axis=-1, keepdims=True)
  reversed_index = jnp.max(jnp.where(is_max, n - 1 - jnp.arange(n), -1),
                           axis=-1)
  return n - 1 - reversed_index


def _take_rows(array, rows):
  """array[rows] for in-range `rows`, as a plain gather of whole rows.

  jnp.take's default mode masks out-of-range rows with a select over the
  result; the row indices of SparseFF are in range by construction.
  """
  dims = jax.lax.GatherDimensionNumbers(
      offset_dims=tuple(range(1, array.ndim)), collapsed_slice_dims=(0,),
      start_index_map=(0,))
  return jax.lax.gather(
      array, rows[:, None].astype(jnp.int32), dims, (1,) + array.shape[1:],
      indices_are_sorted=False, unique_indices=False,
      mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)
