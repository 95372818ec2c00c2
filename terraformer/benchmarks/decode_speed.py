"""Unbatched decoding speed of predict-mode models (paper Tables 1, 2, 6, 7).

The paper's headline figure is the time to decode ONE token, batch 1, on CPU.
That step is memory-bound: it reads every weight it touches once and does
little arithmetic per byte. So next to the measured time this module counts
the bytes of weights and caches a step reads and turns them into a bound,
`bytes / GEMV bandwidth` (the bandwidth measured in the same process): a
sparse model is fast because it reads few bytes, and an implementation is
good when it runs close to that bound.

The step timed is `terraformer.decoding.step.make_step`, the one decoding
uses; this module gives it random weights, times it and counts its bytes.
"""
import contextlib
import collections
import functools
import gc
import inspect
import math
import re
import resource
import time
import warnings

import gin
import jax
import jax.numpy as jnp
import numpy as np
from trax import layers as tl
from trax.layers import attention as trax_attention
from trax.layers import combinators as trax_combinators
from trax.layers import core as trax_core

from terraformer import errors
from terraformer.decoding import step as decode_step
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.lsh_attention import CausalDotProductAttention
from terraformer.layers.prefix_attention import PrefixCausalAttention
from terraformer.layers.ops import bucket_for
from terraformer.layers.sparse_ff import SparseFF

# Most random values `random_weights` draws per array (2^22, 16 MB).
RANDOM_BLOCK = 1 << 22
# Keyword arguments of model functions that set the number of decoder blocks.
BLOCK_KWARGS = ('n_decoder_layers', 'n_layers')

# ---------------------------------------------------------------------------
# Shape-correct random weights, without running the initializers.


def _run_once_mask(model, weights):
  """Tree like `weights`: True for leaves of layers under a tl.Cache.

  Those layers (the encoder, the encoder-decoder keys and values) run on the
  first call only; decoding steps never read their weights.
  """
  return kernel_layers.map_leaf_layers(
      model, weights,
      lambda layer, w, run_once: jax.tree_util.tree_map(
          lambda _: run_once, w))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _repeated(block, scale, shape, dtype):
  """`block` repeated in flat order to fill `shape`, times `scale`, as
  `dtype`: one fused XLA loop, so only the result is allocated (numpy's
  np.resize + a copy to JAX held the matrix up to three times)."""
  size = math.prod(shape)
  flat = jnp.tile(block.ravel(), -(-size // block.size))[:size]
  return (flat * scale).reshape(shape).astype(dtype)


def random_weights(weight_shapes, seed=0, model=None):
  """Random arrays in place of a weights tree of shapes (fast, no init).

  Matrices get N(0, 1/fan_in), vectors N(0, 0.02^2) (arrays over
  RANDOM_BLOCK values repeat their first RANDOM_BLOCK): decoding speed does
  not depend on the values, but they must stay finite through the layers.
  Given the `model`, the weights of layers that only run on the first call
  (under tl.Cache: the encoder) share one array per shape, to save memory;
  every weight a decoding step reads is its own array. Leaves that are
  already arrays (not jax.ShapeDtypeStruct) are kept.
  """
  rng = np.random.default_rng(seed)
  shared = {}

  def fill(leaf, run_once=False):
    if isinstance(leaf, (jax.Array, np.ndarray)):
      return leaf
    key = (leaf.shape, jnp.dtype(leaf.dtype).name)
    if run_once and key in shared:
      return shared[key]
    size = math.prod(leaf.shape)
    if not jnp.issubdtype(leaf.dtype, jnp.floating):
      value = jnp.zeros(leaf.shape, leaf.dtype)
    else:
      # Arrays larger than RANDOM_BLOCK (the 17B ones) repeat one random
      # block: drawing gigabytes of normals would take minutes.
      block = rng.standard_normal(min(size, RANDOM_BLOCK), dtype=np.float32)
      scale = (1.0 / np.sqrt(leaf.shape[0])) if len(leaf.shape) >= 2 else (
          0.02)
      if size > RANDOM_BLOCK:
        value = _repeated(block, np.float32(scale), leaf.shape, leaf.dtype)
      else:
        block *= scale
        value = jnp.asarray(block.reshape(leaf.shape), dtype=leaf.dtype)
    if run_once:
      shared[key] = value
    return value

  if model is None:
    return jax.tree_util.tree_map(fill, weight_shapes)
  return jax.tree_util.tree_map(fill, weight_shapes,
                                _run_once_mask(model, weight_shapes))


def random_stored_matrix(shape, storage, rng):
  """(matrix, (row scales,) or ()): a random N(0, 1/shape[0]) matrix of
  `shape` created directly in `storage`, as `kernel_layers._store` stores one.

  A block of whole rows (at most RANDOM_BLOCK values) is drawn in float32
  and stored (int8: `kernel_layers.quantize_rows`, so each row spans -127..127
  like a quantized random matrix, with its own scale); the matrix repeats
  those rows. Only the stored matrix is allocated at full size.
  """
  rows, cols = shape[0], math.prod(shape[1:])
  n = max(1, min(rows, RANDOM_BLOCK // max(cols, 1)))
  block = rng.standard_normal((n, cols), dtype=np.float32)
  block *= 1.0 / np.sqrt(rows)
  one = np.float32(1)
  if storage == 'int8':
    q, scale = kernel_layers.quantize_rows(block)
    return (_repeated(q.astype(jnp.float32), one, tuple(shape), jnp.int8),
            (_repeated(scale, one, (rows,), jnp.float32),))
  return _repeated(block, one, tuple(shape), jnp.dtype(storage)), ()


def random_stored_weights(model, weight_shapes, storage, seed=0):
  """Random weights made directly in the decode storage (int8, bfloat16).

  `model` must have its kernel layers installed (`decode_step.make_step`
  does it). The kernel layers' matrices, those `kernel_layers.store_weights`
  would convert, are created one at a time by `random_stored_matrix` in
  `storage` (int8 with float32 row scales); every other weight is float32
  from `random_weights` (run-once weights shared per shape). The result has
  the structure, shapes and dtypes of `store_weights(model,
  random_weights(weight_shapes, ...), storage)`, but no float32 copy of a
  kernel matrix is ever made: how the 17B models fit in memory.
  """
  rng = np.random.default_rng(seed + 1)
  stored = kernel_layers.store_weights(
      model, weight_shapes, storage,
      lambda shape, storage_: random_stored_matrix(shape.shape, storage_, rng))
  return random_weights(stored, seed, model)


# How terraformer-bench makes a model's random weights.
WEIGHT_SOURCES = ('float32', 'stored')
_WEIGHTS_ATTR = '_terraformer_bench_weights'


@gin.configurable(module='terraformer')
def bench_weights(created='float32'):
  """How terraformer-bench creates random weights (gin; checked).

  created: 'float32': a float32 tree that the step converts to
    `decode_options.weights` (every storage of one config then decodes the
    same weights: --agreement); 'stored': the kernel layers' matrices made
    directly in `decode_options.weights` (`random_stored_weights`), never a
    float32 copy: the 17B models in int8.
  """
  if created not in WEIGHT_SOURCES:
    raise errors.TerraformerError(
        f'bench_weights.created must be one of {WEIGHT_SOURCES}, got '
        f'{created!r}')
  return created


def bind_bench_weights(model, created=None):
  """Fixes `model`'s `bench_weights` now (default: the gin one)."""
  setattr(model, _WEIGHTS_ATTR, created or bench_weights())
  return getattr(model, _WEIGHTS_ATTR)


def weights_created(model):
  """`model`'s bound bench_weights, else the gin one."""
  return getattr(model, _WEIGHTS_ATTR, None) or bench_weights()


def decode_weights(model, weight_shapes, seed=0, step=None):
  """Random weights of `model` in its decode storage, as bench_weights says
  (`step`: its `decode_step.make_step`, made here if not given)."""
  step = step or decode_step.make_step(model)
  _, storage = decode_step.model_options(model)
  if weights_created(model) == 'stored':
    return random_stored_weights(model, weight_shapes, storage, seed)
  return step.store_weights(random_weights(weight_shapes, seed, model))


def memory_by_kind(model, weights):
  """{'<layer class> <dtype>[ (under tl.Cache)]': bytes} of `weights`
  (arrays or shapes), each array counted once (`random_weights` shares the
  arrays of layers under tl.Cache, the encoder's, per shape; the shared
  embedding is the encoder's too)."""
  seen, out = set(), collections.Counter()

  def count(layer, w, run_once):
    for leaf in jax.tree_util.tree_leaves(w):
      if id(leaf) in seen or not hasattr(leaf, 'dtype'):
        continue
      seen.add(id(leaf))
      kind = f'{type(layer).__name__} {jnp.dtype(leaf.dtype).name}'
      out[kind + (' (under tl.Cache)' if run_once else '')] += _nbytes(leaf)
    return w

  kernel_layers.map_leaf_layers(model, weights, count)
  return dict(out)


def weights_memory(weight_shapes, model=None):
  """Bytes `random_weights(weight_shapes, model=model)` allocates."""
  if model is None:
    return _nbytes(weight_shapes)
  total, seen = 0, set()
  for leaf, run_once in zip(
      jax.tree_util.tree_leaves(weight_shapes),
      jax.tree_util.tree_leaves(_run_once_mask(model, weight_shapes))):
    key = (leaf.shape, jnp.dtype(leaf.dtype).name)
    if run_once and key in seen:
      continue
    if run_once:
      seen.add(key)
    total += _nbytes(leaf)
  return total


# ---------------------------------------------------------------------------
# Bytes a decoding step reads.


def _nbytes(tree):
  return sum(int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
             for leaf in jax.tree_util.tree_leaves(tree))


def _row_bytes(array, n_rows):
  """Bytes of `n_rows` slices array[i] (rows of the leading axis)."""
  return n_rows * int(np.prod(array.shape[1:], dtype=np.int64)) * (
      array.dtype.itemsize)


def _leaf_layer_bytes(layer, weights, state, position, n_tokens,
                      encoder_len=0):
  """Bytes one step reads from a layer without sublayers.

  Default: all its weights and all its state (caches). Layers known to read
  less say so here; the code they describe is their predict-mode forward.
  """
  if isinstance(layer, SparseFF):
    # Controller (C1, C2, c), b2; one row of W1ᵀ and W2 per block per token
    # (SparseFF._forward_selected_rows).
    c1, c2, c, w1t, w2, b2 = weights[:6]
    rows = n_tokens * layer.n_blocks
    # int8 storage (terraformer/kernels): one scale per selected row too.
    scales = sum(_row_bytes(s, rows) for s in weights[6:])
    return (_nbytes((c1, c2, c, b2)) + _row_bytes(w1t, rows)
            + _row_bytes(w2, rows) + scales)
  if isinstance(layer, trax_core.Dropout) and layer._mode != 'train':  # pylint: disable=protected-access
    return 0  # Its state (the rate) is only read in train mode.
  if isinstance(layer, trax_core.Embedding):
    return _row_bytes(weights, n_tokens)
  if isinstance(layer, trax_attention.PositionalEncoding):
    table = weights[0] if isinstance(weights, (tuple, list)) else weights
    return _row_bytes(table.reshape((-1, table.shape[-1])), n_tokens) + (
        _nbytes(state))
  if isinstance(layer, PrefixCausalAttention) and len(state) == 3:
    # Keys and values [batch * heads, max_len, d_head]: the step reads the
    # smallest bucket holding positions 0..position.
    keys, values, index = state
    size = bucket_for(position + n_tokens, keys.shape[1],
                      min_bucket=layer.buckets[0])
    per_position = lambda a: _nbytes(a) // a.shape[1]
    return size * (per_position(keys) + per_position(values)) + _nbytes(index)
  if isinstance(layer, CausalDotProductAttention) and len(state) == 4:
    # The Terraformer's decoder cache [batch * heads, max_len, ...] holds the
    # encoder_len encoder positions, then the decoder's: the step reads the
    # keys, values and validity of the smallest bucket holding them all.
    keys, values, valid, index = state
    size = bucket_for(encoder_len + position + n_tokens, keys.shape[1],
                      min_bucket=layer.buckets[0])
    per_position = lambda a: _nbytes(a) // a.shape[1]
    return size * sum(per_position(a) for a in (keys, values, valid)) + (
        _nbytes(index))
  return _nbytes(weights) + _nbytes(state)


def _layer_bytes(layer, weights, state, position, n_tokens, out,
                 encoder_len=0):
  if isinstance(weights, dict) and weights == tl.GET_WEIGHTS_FROM_CACHE:
    weights = layer.weights  # A shared layer, read again at each use.
  if isinstance(layer, trax_combinators.Cache):
    cached, sub_state = state
    if not (isinstance(cached, tuple) and not cached):
      # After the first call: the cached outputs are read, the layer not run.
      out['Cache'] += _nbytes(cached)
      return
    _layer_bytes(layer.sublayer, weights[0], sub_state, position, n_tokens,
                 out, encoder_len)
    return
  subs = layer.sublayers
  if subs:
    for i, sub in enumerate(subs):
      sub_w = weights[i] if len(weights) == len(subs) else ()
      sub_s = state[i] if (isinstance(state, (tuple, list))
                           and len(state) == len(subs)) else ()
      _layer_bytes(sub, sub_w, sub_s, position, n_tokens, out, encoder_len)
    return
  n = _leaf_layer_bytes(layer, weights, state, position, n_tokens,
                        encoder_len)
  if n:
    out[type(layer).__name__] += n


def step_bytes(model, weights, state, position, n_tokens=1, encoder_len=0):
  """Bytes of weights and caches one predict step reads, by layer class.

  Args:
    model: predict-mode Trax layer.
    weights: its weights (arrays or ShapeDtypeStructs).
    state: its state (or shapes) at the step, after the first call (the
      encoder then is cached and not run again).
    position: decoder position of the token the step decodes (0 first).
    n_tokens: tokens per step (batch size; 1 unbatched).
    encoder_len: encoder positions ahead of the decoder's in a decoder cache
      that holds both (the Terraformer's `CausalDotProductAttention`: its
      first call primes the cache with the encoder_len encoder positions, so
      decoder position p sits at cache index encoder_len + p).

  Returns:
    {layer class name: bytes}; activations (vectors of d_model floats) are
    not counted.
  """
  out = collections.Counter()
  _layer_bytes(model, weights, state, position, n_tokens, out, encoder_len)
  return dict(out)


# ---------------------------------------------------------------------------
# XLA operations a step runs.

# HLO instructions of the entry computation that do no work at run time.
_FREE_HLO_OPS = ('parameter', 'constant', 'get-tuple-element', 'tuple',
                 'bitcast')


def xla_op_counts(model, prompt_len=16):
  """{HLO op kind: count} of the compiled steady-state decoding step.

  Counts the instructions of the optimized entry computation (each fusion,
  dot, copy, conditional, ... is one operation the CPU runtime launches per
  token), without the free ones. A `conditional` runs one of its branches:
  the operations of its largest branch count too (`hlo_op_counts`), so a
  `lax.switch` does not hide the work it runs. Compiled from shapes only: no
  weights are allocated.
  """
  signature = decode_step.predict_signature(model, prompt_len)
  weights, state = decode_step.init_shapes(model, signature)
  scalars = lambda tree: jax.tree_util.tree_map(
      lambda s: np.zeros((), s.dtype), tree)
  step = decode_step.make_step(model)
  weights = jax.eval_shape(step.store_weights, weights)
  model.weights, model.state = scalars(weights), scalars(state)
  jitted = step.jitted
  x = jax.tree_util.tree_map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), signature)
  rng = jax.random.PRNGKey(0)
  _, steady = jax.eval_shape(jitted, x, weights, state, rng)  # tl.Cache full
  return hlo_op_counts(jitted.lower(x, weights, steady, rng).compile()
                       .as_text())


def _hlo_computations(text):
  """{computation name: [(op kind, instruction text)]}, and the entry's."""
  computations, entry, name = {}, None, None
  for line in text.split('\n'):
    header = re.match(r'(ENTRY )?%?([\w.-]+) \(.*\{$', line)
    if header and not line.startswith(' '):
      name = header.group(2)
      computations[name] = []
      if header.group(1):
        entry = name
    elif line.startswith('}'):
      name = None
    elif name is not None and ' = ' in line:
      match = re.search(r' ([a-z][\w-]*)\(', ' ' + line.split(' = ', 1)[1])
      computations[name].append((match.group(1) if match else '?', line))
  return computations, entry


def hlo_op_counts(text):
  """{op kind: count} of an optimized HLO module's entry computation.

  Free instructions (parameters, constants, tuples, bitcasts) do not count;
  a `conditional` counts once plus the operations of its largest branch; a
  `while` once plus one pass of its condition and body (the trip count is
  not known here); a `call` its callee's operations.
  """
  computations, entry = _hlo_computations(text)

  def count(name, seen=()):
    counts = collections.Counter()
    for kind, line in computations.get(name, ()):
      if kind in _FREE_HLO_OPS:
        continue
      if kind != 'call':
        counts[kind] += 1
      if name in seen:
        continue
      inner = seen + (name,)
      if kind == 'conditional':
        branches = re.search(r'branch_computations=\{([^}]*)\}', line)
        names = ([b.strip().lstrip('%') for b in branches.group(1).split(',')]
                 if branches else re.findall(
                     r'(?:true|false)_computation=%?([\w.-]+)', line))
        counts.update(max((count(b, inner) for b in names),
                          key=lambda c: sum(c.values()),
                          default=collections.Counter()))
      elif kind == 'while':
        for key in ('condition', 'body'):
          callee = re.search(key + r'=%?([\w.-]+)', line)
          if callee:
            counts.update(count(callee.group(1), inner))
      elif kind == 'call':
        callee = re.search(r'to_apply=%?([\w.-]+)', line)
        if callee:
          counts.update(count(callee.group(1), inner))
    return counts

  return dict(count(entry))


# ---------------------------------------------------------------------------
# Memory bandwidth.


def gemv_bandwidth(megabytes=256, repeats=10):
  """GB/s of a jitted float32 GEMV over a `megabytes` matrix (median, max)."""
  cols = 1024
  rows = megabytes * 2**20 // (4 * cols)
  matrix = jnp.asarray(np.random.default_rng(0).standard_normal(
      (rows, cols), dtype=np.float32))
  vector = jnp.ones((cols,), jnp.float32)
  gemv = jax.jit(jnp.dot)
  gemv(matrix, vector).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    gemv(matrix, vector).block_until_ready()
    times.append(time.perf_counter() - start)
  size = matrix.size * 4
  del matrix
  return size / np.median(times) / 1e9, size / min(times) / 1e9


# ---------------------------------------------------------------------------
# Timing.


def _logits(outputs):
  return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


@jax.jit
def _greedy(logits):
  return jnp.argmax(logits[:, -1, :], axis=-1).astype(jnp.int32)[:, None]


# The trace annotation around DecodeTimer's timed steps.
TIMED_STEPS = 'terraformer_timed_steps'


@contextlib.contextmanager
def _first_call_donation_quiet():
  """The first call changes the state's structure (tl.Cache fills in): some
  donated buffers cannot be reused there, which JAX warns about."""
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', message='Some donated buffers')
    yield


class DecodeTimer:
  """Greedy decoding of one model with random weights, batch 1, timed.

  Each `repeat()` starts from empty caches: (enc-dec) one call with the
  `prompt_len`-token prompt runs the encoder, (LM) the prompt is fed token
  by token; then `tokens` steps are timed, each feeding the argmax of the
  previous logits, and the time per token (ms) is returned. The first
  repeat also compiles: `warm_up()` runs one untimed.
  """

  def __init__(self, model, tokens=32, prompt_len=16, seed=0, shapes_=None):
    decode_step.check_model(model)
    self.model, self.tokens, self.seed = model, tokens, seed
    self.encdec = decode_step.is_encoder_decoder(model)
    self.signature = decode_step.predict_signature(model, prompt_len)
    weight_shapes, self.state_shapes = shapes_ or decode_step.init_shapes(
        model, self.signature)
    step = decode_step.make_step(model)
    # Kernel layers' weights in their decode storage (bf16/int8), if asked.
    self.weights = decode_weights(model, weight_shapes, seed, step)
    self.decode_path = decode_step.describe_options(
        decode_step.model_options(model))
    self.prompt = jnp.asarray(np.random.default_rng(seed).integers(
        1, 100, size=(1, prompt_len)).astype(np.int32))
    self.rng = jax.random.PRNGKey(seed)
    # pure_fn restores the model's weights and state after each call: give
    # it the tree structure only (scalars), not a second set of caches.
    model.weights = self.weights
    model.state = jax.tree_util.tree_map(
        lambda s: np.zeros((), s.dtype), self.state_shapes)
    self._step = step.jitted
    self.steady_state = None    # State shapes after the first call.
    # Encoder positions primed into a decoder cache (step_bytes).
    self.encoder_len = prompt_len if self.encdec else 0
    self.first_position = None  # Decoder position of the first timed token.

  def _prime(self):
    """Empty caches + prompt; returns (state, first token to feed)."""
    step, weights, rng = self._step, self.weights, self.rng
    state = decode_step.zero_state(self.state_shapes)
    token = jnp.zeros((1, 1), jnp.int32)
    if self.encdec:
      outputs, state = step((self.prompt, token), weights, state, rng)
      token = _greedy(_logits(outputs))
      self.first_position = 1
    else:  # Positions 0..P-1 get 0, p_0, ..., p_{P-2}; then p_{P-1}.
      for t in range(self.prompt.shape[1]):
        _, state = step(token, weights, state, rng)
        token = self.prompt[:, t:t + 1]
      self.first_position = self.prompt.shape[1]
    if self.steady_state is None:
      self.steady_state = jax.tree_util.tree_map(
          lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    return state, token

  @property
  def step_module(self):
    """The step's HLO module name ('jit_' + its function's name), as a
    profile's events name it."""
    return 'jit_' + getattr(self._step, '__name__', 'pure_fn')

  def compiled_step_text(self):
    """The optimized HLO of the steady-state step (after the prompt), whose
    instruction names a profile's operation events carry."""
    with _first_call_donation_quiet():
      state, token = self._prime()
    x = (self.prompt, token) if self.encdec else token
    return self._step.lower(x, self.weights, state,
                            self.rng).compile().as_text()

  def repeat(self):
    """Decodes `tokens` tokens from empty caches; returns ms per token."""
    step, weights, rng = self._step, self.weights, self.rng
    with _first_call_donation_quiet():
      state, token = self._prime()
      jax.block_until_ready(token)
      # Marks the timed steps in a profile (step_profile; free otherwise).
      with jax.profiler.TraceAnnotation(TIMED_STEPS):
        start = time.perf_counter()
        for _ in range(self.tokens):
          x = (self.prompt, token) if self.encdec else token
          outputs, state = step(x, weights, state, rng)
          token = _greedy(_logits(outputs))
        jax.block_until_ready(token)
        elapsed = time.perf_counter() - start
    del state, outputs
    return 1e3 * elapsed / self.tokens

  def warm_up(self):
    self.repeat()

  def logits(self, feed=None):
    """(logits [tokens, vocab] float32, greedy tokens) of one decode.

    Feeds `feed` (tokens of another model's decode) instead of this
    model's own argmax when given, so that two models' logits are compared
    at the same positions.
    """
    step, weights, rng = self._step, self.weights, self.rng
    with _first_call_donation_quiet():
      state, token = self._prime()
      rows, own = [], []
      for t in range(self.tokens):
        x = (self.prompt, token) if self.encdec else token
        outputs, state = step(x, weights, state, rng)
        last = _logits(outputs)
        rows.append(np.asarray(last[0, -1], np.float32))
        own.append(int(_greedy(last)[0, 0]))
        token = (jnp.asarray([[feed[t]]], jnp.int32) if feed is not None
                 else _greedy(last))
    return np.stack(rows), own

  def step_bytes(self):
    """(bytes by layer class, total): step_bytes averaged over the timed
    positions."""
    if self.steady_state is None:
      self.warm_up()
    totals = collections.Counter()
    for position in range(self.first_position,
                          self.first_position + self.tokens):
      totals.update(step_bytes(self.model, self.weights, self.steady_state,
                               position, encoder_len=self.encoder_len))
    by_layer = {k: v / self.tokens for k, v in totals.items()}
    return by_layer, sum(by_layer.values())

  @property
  def n_params(self):
    return sum(int(np.prod(l.shape, dtype=np.int64))
               for l in jax.tree_util.tree_leaves(self.weights))

  def memory_by_kind(self):
    """{kind: bytes} of the weights held (`memory_by_kind`) and 'state
    (caches)' after the first call."""
    out = memory_by_kind(self.model, self.weights)
    if self.steady_state is not None:
      out['state (caches)'] = _nbytes(self.steady_state)
    return out

  def close(self):
    """Frees the weights (the model keeps None leaves)."""
    to_none = lambda tree: jax.tree_util.tree_map(lambda _: None, tree)
    self.model.weights = to_none(self.model.weights)
    self.model.state = to_none(self.model.state)
    self.weights = None
    self._step = None


def format_memory(by_kind):
  """'12.3 GiB: KernelDense int8 8.1, ...' (GiB, largest first)."""
  gib = lambda n: n / 2**30
  parts = ', '.join(f'{k} {gib(v):.2f}' for k, v in sorted(
      by_kind.items(), key=lambda kv: -kv[1]) if gib(v) >= 0.005)
  return f'{gib(sum(by_kind.values())):.2f} GiB held: {parts}'


def peak_rss_bytes():
  """Peak resident memory of this process (bytes; Linux ru_maxrss)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _available_memory():
  """Bytes of memory available (MemAvailable), or None if unknown."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def time_models(models, tokens=32, prompt_len=16, repeats=5, seed=0,
                memory_budget=None, log=None):
  """Times several models, interleaving their repeats to share the noise.

  Models whose weights and state fit together in `memory_budget` bytes
  (default: 40% of the available memory; a process holding models of N bytes
  needs about 1.4 N) are held at once and timed in
  rounds, one repeat of each per round; larger sets are split into such
  groups, in order.

  Models whose weights are created in their decode storage
  (`bench_weights.created='stored'`) count those stored bytes.

  Returns:
    one dict per model: ms_per_token_repeats, bytes_by_layer,
    bytes_per_token, n_params, decode_path, memory_by_kind (bytes of the
    weights held, by layer class and dtype, and of the caches).
  """
  if memory_budget is None:
    available = _available_memory()
    memory_budget = 0.4 * available if available else float('inf')
  sizes, all_shapes = [], []
  for model in models:
    decode_step.check_model(model)
    shapes_ = decode_step.init_shapes(
        model, decode_step.predict_signature(model, prompt_len))
    all_shapes.append(shapes_)
    weight_shapes = shapes_[0]
    if weights_created(model) == 'stored':
      weight_shapes = jax.eval_shape(decode_step.prepare_model(model),
                                     weight_shapes)
    sizes.append(weights_memory(weight_shapes, model) + _nbytes(shapes_[1]))
  groups, group, used = [], [], 0
  for i, size in enumerate(sizes):
    if group and used + size > memory_budget:
      groups.append(group)
      group, used = [], 0
    group.append(i)
    used += size
  groups.append(group)
  results = [None] * len(models)
  for group in groups:
    timers = {}
    step_bytes_ = {}
    for i in group:
      if log:
        log(f'model {i + 1}/{len(models)}: making {sizes[i] / 2**30:.2f} GiB '
            'of weights and caches')
      timers[i] = DecodeTimer(models[i], tokens, prompt_len, seed,
                              all_shapes[i])
      timers[i].warm_up()
      step_bytes_[i] = timers[i].step_bytes()
      if log:
        log(f'model {i + 1}/{len(models)}: ' + format_memory(
            timers[i].memory_by_kind()))
    if log:
      log(f'timing {len(group)} model(s) together: {repeats} rounds')
    times = {i: [] for i in group}
    for _ in range(repeats):
      for i in group:
        times[i].append(timers[i].repeat())
    for i in group:
      by_layer, total = step_bytes_[i]
      results[i] = {'ms_per_token_repeats': times[i],
                    'bytes_by_layer': by_layer, 'bytes_per_token': total,
                    'n_params': timers[i].n_params,
                    'decode_path': timers[i].decode_path,
                    'memory_by_kind': timers[i].memory_by_kind()}
      timers[i].close()
    del timers
    gc.collect()
  return results


def measure_model(model, tokens=32, prompt_len=16, repeats=5, seed=0):
  """Times one predict-mode model and counts its step bytes (time_models)."""
  return time_models([model], tokens, prompt_len, repeats, seed)[0]


# ---------------------------------------------------------------------------
# Benchmarking.


ModelSpec = collections.namedtuple(
    'ModelSpec', ['name', 'model', 'base_model', 'n_blocks'])
ModelSpec.__doc__ = """A model to benchmark.

  name: label in tables.
  model: the predict-mode layer (not initialized: it gets random weights).
  base_model: the same model without decoder blocks (its embedding, cached
    encoder and logits), for the per-block figures; None if not available.
  n_blocks: number of decoder blocks of `model`, or None if unknown.
"""


def blocks_kwarg(model_fn):
  """The keyword of `model_fn` setting its decoder blocks, or None."""
  try:
    params = inspect.signature(model_fn).parameters
  except (TypeError, ValueError):
    return None
  for name in BLOCK_KWARGS:
    if name in params:
      return name
  return None


def _result(spec, full, base, bandwidth_gbps):
  """A benchmark result from time_models' results for a spec's models."""
  ms = full['ms_per_token_repeats']
  result = {
      'name': spec.name, 'n_blocks': spec.n_blocks,
      'n_params': full['n_params'],
      'ms_per_token': float(np.median(ms)),
      'ms_per_token_min': float(min(ms)),
      'ms_per_token_max': float(max(ms)),
      'ms_per_token_repeats': [float(m) for m in ms],
      'bytes_per_token': full['bytes_per_token'],
      'bytes_by_layer': full['bytes_by_layer'],
      'ms_per_block': None, 'bytes_per_block': None,
      'decode_path': full.get('decode_path'),
      'memory_by_kind': full.get('memory_by_kind'),
  }
  if base is not None:
    base_ms = float(np.median(base['ms_per_token_repeats']))
    result['ms_no_blocks'] = base_ms
    result['ms_per_block'] = (result['ms_per_token'] - base_ms) / spec.n_blocks
    result['bytes_per_block'] = (
        full['bytes_per_token'] - base['bytes_per_token']) / spec.n_blocks
  if bandwidth_gbps:
    result['bandwidth_gbps'] = bandwidth_gbps
    result['bound_ms_per_token'] = 1e3 * result['bytes_per_token'] / (
        bandwidth_gbps * 1e9)
    result['achieved_over_bound'] = (result['ms_per_token'] /
                                     result['bound_ms_per_token'])
    if result['bytes_per_block'] is not None:
      result['bound_ms_per_block'] = 1e3 * result['bytes_per_block'] / (
          bandwidth_gbps * 1e9)
  return result


def benchmark_all(specs, tokens=32, prompt_len=16, repeats=5, seed=0,
                  bandwidth_gbps=None, memory_budget=None, log=None):
  """Benchmarks ModelSpecs together: ms/token, ms/block, bytes, bound.

  All models (and base models) are timed by one `time_models` call, so
  repeats of models that fit in memory together are interleaved.

  The per-block figures are differences between `spec.model` and
  `spec.base_model` (no decoder blocks), divided by `spec.n_blocks`: the
  paper's "per block" column (Table 1) leaves out embedding and logits.

  Returns:
    one dict per spec: name, n_blocks, n_params, ms_per_token (median over
    repeats), ms_per_token_min/max/repeats, ms_per_block, ms_no_blocks,
    bytes_per_token, bytes_per_block, bytes_by_layer and, given
    `bandwidth_gbps`, bound_ms_per_token, bound_ms_per_block and
    achieved_over_bound (ms_per_token / bound_ms_per_token).
  """
  models, index = [], []
  for spec in specs:
    use_base = spec.base_model is not None and bool(spec.n_blocks)
    index.append((len(models), len(models) + 1 if use_base else None))
    models.append(spec.model)
    if use_base:
      models.append(spec.base_model)
  timed = time_models(models, tokens, prompt_len, repeats, seed,
                      memory_budget, log)
  return [_result(spec, timed[i], None if j is None else timed[j],
                  bandwidth_gbps)
          for spec, (i, j) in zip(specs, index)]


def benchmark(spec, tokens=32, prompt_len=16, repeats=5, seed=0,
              bandwidth_gbps=None):
  """benchmark_all for one ModelSpec."""
  return benchmark_all([spec], tokens, prompt_len, repeats, seed,
                       bandwidth_gbps)[0]
