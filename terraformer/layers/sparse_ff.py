"""Sparse feed-forward block with a low-rank Gumbel-softmax controller (§3.1)."""
import gin
import jax
import numpy as np
import jax.numpy as jnp
from trax import fastmath
from trax import layers as tl
from trax.layers import initializers as init

from terraformer.layers.ops import REPLAY as _REPLAY
from terraformer.layers.ops import split_last

CONTROLLERS = ('trax', 'gumbel_softmax')


@gin.configurable(module='terraformer')
class SparseFF(tl.Layer):
  """Feed-forward block where one unit in every block of N is active (§3.1).

    SparseFF(x) = max(0, (x W1) ⊙ Controller(x)) W2 + b2,
    Controller(x) = one-hot argmax(Reshape(x C1 C2 + c, (-1, N))).

  Train mode, `controller='trax'` (default; Trax 1.4.1's
  `trax.layers.research.sparsity.SparseFF`, i.e. `_SparseFFController` +
  `_SparseFFMain`, which produced the paper's numbers), with l the logits of
  a block and g Gumbel noise:
    hard unit  = argmax(log_softmax(l) + T g), a sample from softmax(l / T);
    soft mask  = softmax(l), no noise;
    mask       = onehot + soft - stop_gradient(soft) (straight-through) with
                 probability `quant_prob` (one draw per call), else soft;
  the mask multiplies x W1 before the ReLU, so the straight-through gradient
  reaches the mask only at the selected unit. `controller='gumbel_softmax'`
  is the textbook straight-through Gumbel-softmax instead: hard unit =
  argmax(l + g) (a sample from softmax(l)), soft mask = softmax((l + g) / T),
  applied after the ReLU. Eval and predict use the plain argmax of l.

  Weights, in this order (C1, C2, c, W1ᵀ, W2, b2); for Trax's weights
  m1 [d_model, d_lowrank], m2 [d_lowrank, n_blocks, N], mb [n_blocks, N],
  w1 [d_model, n_blocks, N], w2 [N, n_blocks, d_model], b2 [d_model]:
    C1  [d_model, d_lowrank] = m1
    C2  [d_lowrank, d_ff]    = m2.reshape(d_lowrank, d_ff)
    c   [d_ff]               = mb.reshape(d_ff)         (controller bias)
    W1ᵀ [d_ff, d_model]      = w1.reshape(d_model, d_ff).T
    W2  [d_ff, d_model]      = w2.transpose(1, 0, 2).reshape(d_ff, d_model)
    b2  [d_model]            = b2
  Unit f = k N + j is element j of block k (Trax's w1[:, k, j], w2[j, k]).
  There is no b1 (Trax has none). W1 is stored transposed so that a unit's
  input and output weights are both one contiguous row: predict mode first
  runs the controller, then gathers only the d_ff/N selected rows of W1ᵀ and
  W2; it never reads the full matrices.

  The train-mode rng is split as in Trax's combinator tree (BatchLeadingAxes
  > Serial of 3 > Serial of 6, controller 2nd, main 3rd), so that the same
  rng draws the same noise and the same hard/soft choice as Trax's layer.
  No dropout inside: Trax applies dropout once to the block's output, which
  is the model's residual dropout here.

  With `store_decisions` (reversible models, §4.2) the train-mode forward
  keeps the controller's choice in every block in its state,
  {'decisions': [..., n_blocks] ints}, and `replay_state` returns the state
  under which a re-run of the forward pass (when a reversible layer is
  reversed) reuses those choices instead of recomputing the argmax from a
  reconstructed input (Trax: `_RememberInReverse`). Eval mode leaves the
  state as it is.
  """

  def __init__(self, d_ff, n_elements_in_block=32, d_lowrank=64,
               temperature=0.1, quant_prob=0.3, mode='train',
               controller='trax',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6),
               store_decisions=False):
    super().__init__(name=f'SparseFF_{d_ff}_N{n_elements_in_block}')
    if d_ff % n_elements_in_block:
      raise ValueError(f'd_ff={d_ff} is not a multiple of the block size '
                       f'N={n_elements_in_block}.')
    if controller not in CONTROLLERS:
      raise ValueError(f'controller must be one of {CONTROLLERS}, got '
                       f'{controller!r}.')
    self._d_ff = d_ff
    self._n_block = n_elements_in_block
    self._d_lowrank = d_lowrank
    self._temperature = temperature
    self._quant_prob = quant_prob
    self._mode = mode
    self._controller = controller
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._store_decisions = store_decisions and mode != 'predict'

  @property
  def n_blocks(self):
    return self._d_ff // self._n_block

  def controller_logits(self, x):
    """Low-rank controller logits x C1 C2 + c, shaped [..., n_blocks, N]."""
    c1, c2, bias = self.weights[:3]
    # (x C1) C2, in this order: never form the d_model x d_ff product C1 C2.
    logits = jnp.dot(jnp.dot(x, c1), c2) + bias
    return logits.reshape(x.shape[:-1] + (self.n_blocks, self._n_block))

  def forward(self, x):
    if self._mode == 'predict':
      return self._forward_selected_rows(x)
    w1t, w2, b2 = self.weights[3:]
    logits = self.controller_logits(x)
    mid = jnp.dot(x, w1t.T).reshape(logits.shape)     # x W1, per block
    if self._mode == 'train':
      choice = (self.state.get(_REPLAY)
                if isinstance(self.state, dict) else None)
      mask, choice = self._train_mask(logits, choice)
      if self._store_decisions:
        self.state = {'decisions': choice.astype(self._decision_dtype)}
      if self._controller == 'trax':
        h = jax.nn.relu(mid * mask)
      else:
        h = jax.nn.relu(mid) * mask
    else:
      mask = jax.nn.one_hot(jnp.argmax(logits, axis=-1), self._n_block,
                            dtype=x.dtype)
      h = jax.nn.relu(mid) * mask
    return jnp.dot(h.reshape(x.shape[:-1] + (self._d_ff,)), w2) + b2

  def _train_rngs(self):
    """(noise rng, hard-or-soft rng), split as in Trax's SparseFF."""
    rng_inner = fastmath.random.split(self.rng, 3)[1]
    rngs = fastmath.random.split(rng_inner, 6)
    return rngs[1], rngs[2]

  def _gumbel(self, rng, shape):
    """Gumbel(0, 1) noise of `shape`, drawn over flattened leading axes."""
    n_rows = int(np.prod(shape[:-2], dtype=np.int64))
    u = fastmath.random.uniform(rng, (n_rows,) + shape[-2:], jnp.float32,
                                minval=1e-6, maxval=1.0 - 1e-6)
    return -jnp.log(-jnp.log(u)).reshape(shape)

  def _train_mask(self, logits, choice=None):
    """(mask, hard choice) of the train-mode controller.

    `choice` ([..., n_blocks] unit indices, e.g. stored decisions) replaces
    the sampled hard unit.
    """
    rng_noise, rng_select = self._train_rngs()
    noise = self._gumbel(rng_noise, logits.shape).astype(logits.dtype)
    if self._controller == 'trax':
      log_probs = logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
      soft = jnp.exp(log_probs)
      sampled = log_probs + self._temperature * noise
    else:
      sampled = logits + noise
      soft = jax.nn.softmax(sampled / self._temperature, axis=-1)
    if choice is None:
      choice = jnp.argmax(sampled, axis=-1)
    hard = jax.nn.one_hot(choice, self._n_block, dtype=logits.dtype)
    straight_through = hard + (soft - jax.lax.stop_gradient(soft))
    use_hard = fastmath.random.uniform(rng_select, (), jnp.float32,
                                       0.0, 1.0) < self._quant_prob
    return jnp.where(use_hard, straight_through, soft), choice

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
    w1t, w2, b2 = self.weights[3:6]
    tokens = x.reshape((-1, x.shape[-1]))                    # [T, d]
    selected = _first_argmax(self.controller_logits(tokens))  # [T, blocks]
    rows = (selected + jnp.arange(self.n_blocks) * self._n_block).reshape(-1)
    w1_rows = _take_rows(w1t, rows).reshape(selected.shape + (-1,))
    w2_rows = _take_rows(w2, rows).reshape(selected.shape + (-1,))
    # Per token: (rows of W1ᵀ) x, then h (rows of W2): two small GEMVs.
    h = jax.nn.relu(jnp.einsum('td,tbd->tb', tokens, w1_rows))
    y = jnp.einsum('tb,tbd->td', h, w2_rows) + b2
    return y.reshape(x.shape)

  def init_weights_and_state(self, input_signature):
    d_model = input_signature.shape[-1]
    rngs = fastmath.random.split(self.rng, 6)
    self.weights = (
        self._kernel_initializer((d_model, self._d_lowrank), rngs[0]),
        self._kernel_initializer((self._d_lowrank, self._d_ff), rngs[1]),
        self._bias_initializer((self._d_ff,), rngs[2]),
        self._kernel_initializer((self._d_ff, d_model), rngs[3]),
        self._kernel_initializer((self._d_ff, d_model), rngs[4]),
        self._bias_initializer((d_model,), rngs[5]),
    )
    if self._store_decisions:
      self.state = {'decisions': jnp.zeros(
          input_signature.shape[:-1] + (self.n_blocks,), self._decision_dtype)}


def _first_argmax(logits):
  """jnp.argmax over the last axis (first maximum), as two plain reductions.

  XLA:CPU runs argmax as a slow variadic (value, index) reduction; max, then
  the largest reversed index among the maxima, vectorizes. XLA:CPU also
  splits a reduction of more than 32 elements along one axis into two
  operations (reduce-window, then reduce), so the last axis is viewed as
  [n / k, k] (k <= 32) and both reduced at once: one operation per
  reduction. Max is exact in any order: the result is jnp.argmax's.
  """
  n = logits.shape[-1]
  view, axes = split_last(logits)
  is_max = view >= jnp.max(view, axis=axes, keepdims=True)
  reversed_index = (n - 1 - jnp.arange(n)).reshape(view.shape[-len(axes):])
  reversed_index = jnp.max(jnp.where(is_max, reversed_index, -1), axis=axes)
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
