"""Random weights for benchmarks: shape-correct, in the decode storage.

Decoding speed does not depend on the weights' values, only on their shapes
and dtypes, so the benchmarks never run a model's initializers: this module
fills the shapes `terraformer.decoding.step.init_shapes` gives with random
arrays (float32, or directly in the decode storage, int8 with row scales or
bfloat16, as `terraformer.kernels.layers.store_weights` would store them),
and counts the memory they hold. `bench_weights` (gin) says which of the two
`terraformer-bench` makes.
"""
import collections
import functools
import math

import gin
import jax
import jax.numpy as jnp
import numpy as np

from terraformer import errors
from terraformer.benchmarks import bytes_read
from terraformer.decoding import step as decode_step
from terraformer.kernels import layers as kernel_layers

# Most random values `random_weights` draws per array (2^22, 16 MB).
RANDOM_BLOCK = 1 << 22


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
  `shape` created directly in `storage`, as `kernel_layers._store` stores one
  ('q8': packed, `_random_q8_matrix`).

  A block of whole rows (at most RANDOM_BLOCK values) is drawn in float32
  and stored (int8: `kernel_layers.quantize_rows`, so each row spans -127..127
  like a quantized random matrix, with its own scale); the matrix repeats
  those rows. Only the stored matrix is allocated at full size.
  """
  if storage == 'q8':
    return _random_q8_matrix(shape, rng)
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


def _random_q8_matrix(shape, rng):
  """`random_stored_matrix` for 'q8': W [K, N] packed by
  `kernel_layers.pack_q8`. A random N(0, 1/K) block of whole groups of 16
  outputs (at most RANDOM_BLOCK values, at least one group) is packed with
  its scales; the packed array and the scales repeat it (groups are
  contiguous in the packed order)."""
  k, n = shape
  packed_shape = kernel_layers.q8_packed_shape(k, n)
  group = math.prod(packed_shape[1:])
  outputs = kernel_layers.Q8_ROWS * max(1, min(packed_shape[0],
                                               RANDOM_BLOCK // group))
  block = rng.standard_normal((k, outputs), dtype=np.float32)
  block *= 1.0 / np.sqrt(k)
  packed, scale = kernel_layers.pack_q8(block)
  one = np.float32(1)
  return (_repeated(packed.astype(jnp.float32), one, packed_shape, jnp.int8),
          (_repeated(scale, one, (n,), jnp.float32),))


def random_stored_weights(model, weight_shapes, storage, seed=0):
  """Random weights made directly in the decode storage (int8, q8, bfloat16).

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
_NOISE_ATTR = '_terraformer_bench_noise'


@gin.configurable(module='terraformer')
def bench_weights(created='float32', noise=0.0):
  """How terraformer-bench creates random weights (gin; checked).

  created: 'float32': a float32 tree that the step converts to
    `decode_options.weights` (every storage of one config then decodes the
    same weights: --agreement); 'stored': the kernel layers' matrices made
    directly in `decode_options.weights` (`random_stored_weights`), never a
    float32 copy: the 17B models in int8.
  noise: r > 0 adds Gaussian noise of r times each float32 array's RMS to
    the weights (random or a checkpoint's) before their decode storage
    (`with_noise`): a model that is known to differ, to calibrate what
    --agreement's max |delta logit| and greedy agreement show.

  Returns:
    `created` (`noise`: `bench_noise()`).
  """
  if created not in WEIGHT_SOURCES:
    raise errors.TerraformerError(
        f'bench_weights.created must be one of {WEIGHT_SOURCES}, got '
        f'{created!r}')
  if isinstance(noise, bool) or not isinstance(noise, (int, float)) or (
      not noise >= 0):
    raise errors.TerraformerError(
        f'bench_weights.noise must be >= 0, got {noise!r}')
  return created


def bench_noise():
  """The gin `bench_weights.noise` (0.0 unless bound)."""
  try:
    noise = gin.query_parameter('terraformer.bench_weights.noise')
  except ValueError:  # Not bound: bench_weights' default.
    return 0.0
  return float(noise)


def bind_bench_weights(model, created=None, noise=None):
  """Fixes `model`'s `bench_weights` (created and noise) now (default: the
  gin ones); returns `created`."""
  setattr(model, _WEIGHTS_ATTR, created or bench_weights())
  setattr(model, _NOISE_ATTR, bench_noise() if noise is None else noise)
  return getattr(model, _WEIGHTS_ATTR)


def weights_created(model):
  """`model`'s bound bench_weights, else the gin one."""
  return getattr(model, _WEIGHTS_ATTR, None) or bench_weights()


def weights_noise(model):
  """`model`'s bound bench_weights noise, else the gin one."""
  noise = getattr(model, _NOISE_ATTR, None)
  return bench_noise() if noise is None else noise


def with_noise(weights, relative, seed=0):
  """`weights` with Gaussian noise of `relative` times each floating
  array's RMS added (a float32 tree; other arrays are kept)."""
  rng = np.random.default_rng(seed + 2)

  def add(w):
    w = np.asarray(w)
    if not np.issubdtype(w.dtype, np.floating) or not w.size:
      return w
    rms = np.sqrt(np.mean(np.square(w, dtype=np.float64)))
    noise = rng.standard_normal(w.shape, dtype=np.float32)
    return jnp.asarray(w + np.float32(relative * rms) * noise, w.dtype)

  return jax.tree_util.tree_map(add, weights)


def decode_weights(model, weight_shapes, seed=0, step=None, weights=None):
  """`model`'s weights in its decode storage, as bench_weights says:
  random, or `weights` (a float32 tree of `weight_shapes`, e.g. a trained
  checkpoint's) stored (`step`: its `decode_step.make_step`, made here if
  not given)."""
  step = step or decode_step.make_step(model)
  _, storage = decode_step.model_options(model)
  noise = weights_noise(model)
  if weights_created(model) == 'stored':
    if weights is not None or noise:
      raise errors.TerraformerError(
          "bench_weights.created = 'stored' makes random weights directly "
          'in their storage: no noise or given weights')
    return random_stored_weights(model, weight_shapes, storage, seed)
  if weights is None:
    weights = random_weights(weight_shapes, seed, model)
  if noise:
    weights = with_noise(weights, noise, seed)
  return step.store_weights(weights)


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
      kind += ' (under tl.Cache)' if run_once else ''
      out[kind] += bytes_read.nbytes(leaf)
    return w

  kernel_layers.map_leaf_layers(model, weights, count)
  return dict(out)


def weights_memory(weight_shapes, model=None):
  """Bytes `random_weights(weight_shapes, model=model)` allocates."""
  if model is None:
    return bytes_read.nbytes(weight_shapes)
  total, seen = 0, set()
  for leaf, run_once in zip(
      jax.tree_util.tree_leaves(weight_shapes),
      jax.tree_util.tree_leaves(_run_once_mask(model, weight_shapes))):
    key = (leaf.shape, jnp.dtype(leaf.dtype).name)
    if run_once and key in seen:
      continue
    if run_once:
      seen.add(key)
    total += bytes_read.nbytes(leaf)
  return total
