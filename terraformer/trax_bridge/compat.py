"""Small fixes that make Trax 1.4.1 work with the pinned (newer) JAX, and
two that cut its cost (fix 0: `import trax`; fix 7: `Layer.init`'s traces).

Each fix is one documented monkey-patch of the Trax functions it names;
`apply()` installs all of them and is idempotent. `PATCHES` lists them by
name; tests use `undo(name)` to show that the bug comes back without the fix.
"""
import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import threading
import types

import jax
import numpy as np

_APPLIED = {}  # name -> list of (owner, attribute, original value)


def _install(name, owner, attr, new):
  """Replaces `owner.attr` by `new`, remembering the original for `undo`."""
  _APPLIED.setdefault(name, []).append((owner, attr, owner.__dict__[attr]))
  setattr(owner, attr, new)


# Fix 0: the time `import trax` takes.
#
# `trax.layers.assert_shape.assert_shape`, a class decorator used ~65 times
# while `trax.layers` is imported, calls `inspect.stack()` each time only to
# name its caller's file and line. `inspect.stack()` reads the source of every
# frame on the (deep, import-machinery) stack and, for each frozen frame, scans
# all of `sys.modules` (thousands of modules with TensorFlow): `import trax`
# took 86-102 s instead of 13-14 s on the loaded 2-core CPU, in every CLI and
# test process. Fix: that module alone sees an `inspect` whose `stack()`
# returns the frames without reading sources (Trax uses only `[1][0]`, the
# caller's frame, and reads its line with `getframeinfo`). It must be in place
# before Trax is imported: `import terraformer` installs it (an import hook for
# that one module); once Trax is imported it does nothing.
ASSERT_SHAPE_MODULE = 'trax.layers.assert_shape'


class _InspectWithoutSources(types.ModuleType):
  """`inspect`, but `stack()` lists frames without reading their sources."""

  def __init__(self):
    super().__init__('inspect')

  def __getattr__(self, name):
    return getattr(inspect, name)

  @staticmethod
  def stack(context=1):
    del context  # No source lines: only the frames are used.
    frame, frames = sys._getframe(1), []  # pylint: disable=protected-access
    while frame is not None:
      frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename,
                                      frame.f_lineno, frame.f_code.co_name,
                                      None, None))
      frame = frame.f_back
    return frames


def spec_loading_with(name, path, target, load):
  """`name`'s import spec, its module executed by `load(exec_module, module)`.

  For import hooks (`find_spec`) that act around a module's execution.
  """
  spec = importlib.machinery.PathFinder.find_spec(name, path, target)
  if spec is None or spec.loader is None:
    return spec
  exec_module = spec.loader.exec_module
  spec.loader.exec_module = lambda module: load(exec_module, module)
  return spec


class _AssertShapeImportHook(importlib.abc.MetaPathFinder):
  """Gives `trax.layers.assert_shape` `_InspectWithoutSources` on import."""

  def find_spec(self, name, path, target=None):
    if name != ASSERT_SHAPE_MODULE:
      return None

    def exec_with_fast_stack(exec_module, module):
      exec_module(module)
      module.inspect = _InspectWithoutSources()

    return spec_loading_with(name, path, target, exec_with_fast_stack)


def speed_up_trax_import():
  """Installs the import hook of fix 0 (idempotent; no-op after Trax)."""
  if ASSERT_SHAPE_MODULE in sys.modules:
    return
  if not any(isinstance(f, _AssertShapeImportHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _AssertShapeImportHook())


# Fix 1: restoring a checkpoint.
#
# `trax.fastmath.numpy.tree_unflatten(flat, tree, copy_from_tree)` tests
# `tree in copy_from_tree` on every node, leaves included. Markers to copy are
# `None`, `()` and a dict; with new JAX `jax_array == ()` raises TypeError
# (numpy arrays raise "truth value is ambiguous"), so `Loop.load_checkpoint`
# crashes. An array is never such a marker: skip the test for array leaves.
def _is_array(x):
  return isinstance(x, (np.ndarray, np.generic, jax.Array))


def _fix_tree_unflatten():
  tnp = importlib.import_module('trax.fastmath.numpy')
  fastmath = importlib.import_module('trax.fastmath')
  original = tnp.tree_unflatten

  @functools.wraps(original)
  def tree_unflatten(flat, tree, copy_from_tree=None):
    if copy_from_tree is not None and _is_array(tree):
      copy_from_tree = None
    return original(flat, tree, copy_from_tree=copy_from_tree)

  # The module attribute matters too: the original recurses through it.
  _install('tree_unflatten', tnp, 'tree_unflatten', tree_unflatten)
  _install('tree_unflatten', fastmath, 'tree_unflatten', tree_unflatten)


# Fix 2: efficient attention on numpy inputs.
#
# The batched `forward_and_or_backward` of Trax's efficient attention layers
# (`LSHSelfAttention`, `SelfAttention`, `PureLSHSelfAttention`,
# `EncDecAttention`) loops over heads with `fori_loop` and indexes its
# inputs/weights/state with the traced loop index: `x[idx]` on a numpy array
# now raises TracerArrayConversionError. Layers called eagerly on numpy arrays
# (`layer(x)`, or weights restored from a checkpoint) hit it. Fix: turn numpy
# arrays in the arguments into JAX arrays first.
_EFFICIENT_ATTENTION_CLASSES = (
    'EfficientAttentionBase', 'SelfAttention', 'LSHSelfAttention',
    'PureLSHSelfAttention')


def _numpy_to_jax(tree):
  return jax.tree_util.tree_map(
      lambda x: jax.numpy.asarray(x) if isinstance(x, np.ndarray) else x, tree)


def _fix_efficient_attention():
  ea = importlib.import_module('trax.layers.research.efficient_attention')
  for class_name in _EFFICIENT_ATTENTION_CLASSES:
    cls = getattr(ea, class_name)
    original = cls.__dict__['forward_and_or_backward']

    @functools.wraps(original)
    def forward_and_or_backward(self, *args, _original=original, **kwargs):
      args, kwargs = _numpy_to_jax((args, kwargs))
      return _original(self, *args, **kwargs)

    _install('efficient_attention', cls, 'forward_and_or_backward',
             forward_and_or_backward)


# Fixes 3 and 4: weights and slots on the devices (data parallelism; one
# device).
#
# 3. `trax.layers.acceleration.for_n_devices` replicates weights and optimizer
# slots with `jax.device_put_replicated`, which JAX removed (AttributeError),
# so `Loop` fails on >1 device. Replace that one case by `jax.device_put` of a
# broadcast view, sharded along a new leading device axis (what
# `device_put_replicated` returned, and what `pmap` expects), the axis named
# 'batch' as in Trax's pmaps: the replicas a step returns then have the
# sharding of those it took, and step 2 runs step 1's program.
# On one device `for_n_devices` returned its input as it was: weights and
# state not committed to a device. `jit` now keys its cache on the arguments'
# shardings, so `Trainer`'s update was compiled twice, for step 1 (weights
# unplaced) and for step 2 (the weights step 1 returned, on the device): a
# second lowering and XLA compilation in every training. Fix: on one device,
# arrays are placed on it, as the step's outputs are.
def _replicate(x, devices):
  """`x` stacked `len(devices)` times, one slice on each device."""
  mesh = jax.sharding.Mesh(np.array(devices), ('batch',))
  sharding = jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec('batch'))
  shape = (len(devices),) + np.shape(x)
  if _is_array(x) and not getattr(x, 'weak_type', False):
    # A numpy broadcast view: no stacked copy is materialized on one device.
    return jax.device_put(np.broadcast_to(np.asarray(x), shape), sharding)
  # Python scalars (e.g. the learning rate) keep JAX's weak type.
  return jax.device_put(jax.numpy.broadcast_to(x, shape), sharding)


def _fix_for_n_devices():
  acceleration = importlib.import_module('trax.layers.acceleration')
  tl = importlib.import_module('trax.layers')
  fastmath = importlib.import_module('trax.fastmath')
  original = acceleration.for_n_devices

  @functools.wraps(original)
  def for_n_devices(x, n_devices):
    if n_devices > 1 and fastmath.is_backend(fastmath.Backend.JAX):
      devices = jax.local_devices()
      return fastmath.nested_map(lambda y: _replicate(y, devices), x)
    if n_devices == 1 and fastmath.is_backend(fastmath.Backend.JAX):
      device = jax.local_devices()[0]  # Where jit puts the step's outputs.
      return fastmath.nested_map(
          lambda y: jax.device_put(y, device) if _is_array(y) else y, x)
    return original(x, n_devices)

  _install('for_n_devices', acceleration, 'for_n_devices', for_n_devices)
  _install('for_n_devices', tl, 'for_n_devices', for_n_devices)


# 4. The optimizer `Trainer` then moves the replicated slots to one device with
# `tl.on_cpu`. `pmap` is now `jit` + `shard_map` and rejects an argument
# committed to a single device ("Sharding passed to jit does not match"). Fix:
# `on_cpu` leaves arrays that live on several devices (replicas) where they are.
def _on_several_devices(x):
  return isinstance(x, jax.Array) and len(x.sharding.device_set) > 1


def _fix_on_cpu():
  acceleration = importlib.import_module('trax.layers.acceleration')
  tl = importlib.import_module('trax.layers')
  original = acceleration.on_cpu

  @functools.wraps(original)
  def on_cpu(x):
    return jax.tree_util.tree_map(
        lambda y: y if _on_several_devices(y) else original(y), x)

  _install('on_cpu', acceleration, 'on_cpu', on_cpu)
  _install('on_cpu', tl, 'on_cpu', on_cpu)


# Fix 5: the five-argument `cond`.
#
# Trax's LSH attention decodes with `fastmath.cond(pred=, true_operand=,
# true_fun=, false_operand=, false_fun=)`, JAX's old `lax.cond` signature,
# which JAX removed (TypeError: unexpected keyword argument 'true_operand');
# predict mode of `LSHSelfAttention`/`PureLSHSelfAttention` fails. Fix: map
# that form onto `lax.cond(pred, true_fun, false_fun, operands)`.
_OLD_COND_ARGS = ('pred', 'true_operand', 'true_fun', 'false_operand',
                  'false_fun')


def _fix_cond():
  ops = importlib.import_module('trax.fastmath.ops')
  fastmath = importlib.import_module('trax.fastmath')
  original = ops.cond

  @functools.wraps(original)
  def cond(*args, **kwargs):
    if 'true_operand' not in kwargs and len(args) != 5:
      return original(*args, **kwargs)
    bound = dict(zip(_OLD_COND_ARGS, args), **kwargs)
    return original(
        bound['pred'], lambda ops: bound['true_fun'](ops[0]),
        lambda ops: bound['false_fun'](ops[1]),
        (bound['true_operand'], bound['false_operand']))

  _install('cond', ops, 'cond', cond)
  _install('cond', fastmath, 'cond', cond)


# Fix 6: `stop_gradient` of a Python number.
#
# LSH attention's predict mode passes the query length, a Python int, through
# `fastmath.stop_gradient` and then branches on it (`if q_len > 1`). JAX now
# returns a (traced) array for it, so the branch raises
# TracerBoolConversionError. A Python number has no gradient to stop: return
# it unchanged.
def _fix_stop_gradient():
  ops = importlib.import_module('trax.fastmath.ops')
  fastmath = importlib.import_module('trax.fastmath')
  original = ops.stop_gradient

  @functools.wraps(original)
  def stop_gradient(x):
    if isinstance(x, (bool, int, float)):
      return x
    return original(x)

  _install('stop_gradient', ops, 'stop_gradient', stop_gradient)
  _install('stop_gradient', fastmath, 'stop_gradient', stop_gradient)


# Fix 7: the time `Layer.init` takes.
#
# Trax's combinators find each sublayer's output signature by tracing its
# forward (`Serial.init_weights_and_state` -> `_forward_abstract`, an
# `eval_shape` of `pure_fn`), and that trace runs the forwards of all the
# sublayer's own sublayers: a layer nested k combinators deep is traced k
# times, on the same signatures each time. In the test processes tracing was
# most of the CPU (tests/decoding/test_search.py: 104 CPU-s, 65 s of it
# tracing; with this fix 74 and 41). Fix: while
# a model is initialized, an abstract forward of a layer on the input, weight
# and state signatures of an earlier abstract forward of the same layer gives
# zeros of that call's output and state shapes, not a new trace. Only shapes
# exist there, so the weights, and what the layers keep (`use_cache`), are
# those of Trax's init. Concrete forwards are never replaced, nor calls that
# read a shared layer's weights from Trax's cache, nor weakly typed outputs.
class _InitShapes(threading.local):
  """Per thread: init depth, abstract-forward depth, the shapes seen."""

  def __init__(self):
    super().__init__()
    self.inits, self.abstract, self.seen = 0, 0, None


_init_shapes = _InitShapes()


def _avals_key(tree):
  """Hashable (structure, shapes, dtypes, weak types) of a tree of arrays,
  tracers or ShapeDtypes; None if a leaf is anything else or a key array."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  key = []
  for leaf in leaves:
    dtype = getattr(leaf, 'dtype', None)
    if (not hasattr(leaf, 'shape') or dtype is None
        or jax.dtypes.issubdtype(dtype, jax.dtypes.extended)):
      return None
    weak = getattr(getattr(leaf, 'aval', leaf), 'weak_type', False)
    key.append((tuple(leaf.shape), str(dtype), bool(weak)))
  return treedef, tuple(key)


def _strong_shapes(tree):
  """`tree` with `jax.ShapeDtypeStruct` leaves, or None where zeros of its
  shapes would not stand for it (a leaf that is not an array, a key array,
  a weakly typed value)."""
  key = _avals_key(tree)
  if key is None or any(weak for _, _, weak in key[1]):
    return None
  return jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _zeros_like_shapes(tree):
  return jax.tree_util.tree_map(lambda s: jax.numpy.zeros(s.shape, s.dtype),
                                tree)


def _fix_init_traces():
  base = importlib.import_module('trax.layers.base')
  layer_cls = base.Layer
  init, forward_abstract = layer_cls.init, layer_cls._forward_abstract  # pylint: disable=protected-access
  pure_fn = layer_cls.pure_fn
  here = _init_shapes

  @functools.wraps(init)
  def init_once(self, *args, **kwargs):
    if not here.inits:
      here.seen = {}
    here.inits += 1
    try:
      return init(self, *args, **kwargs)
    finally:
      here.inits -= 1
      if not here.inits:
        here.seen = None  # Drops the layers it kept alive (ids not reused).

  @functools.wraps(forward_abstract)
  def forward_abstract_counted(self, *args, **kwargs):
    here.abstract += 1
    try:
      return forward_abstract(self, *args, **kwargs)
    finally:
      here.abstract -= 1

  @functools.wraps(pure_fn)
  def pure_fn_once(self, x, weights, state, rng, use_cache=False):
    seen = here.seen
    key = None
    if (here.abstract and seen is not None and
        not (isinstance(weights, dict)
             and weights == base.GET_WEIGHTS_FROM_CACHE)):
      key = _avals_key((x, weights, state))
    if key is None:
      return pure_fn(self, x, weights, state, rng, use_cache=use_cache)
    key = (id(self),) + key
    if key in seen:
      _, out_shapes, state_shapes = seen[key]
      new_state = _zeros_like_shapes(state_shapes)
      if use_cache:  # What Trax's pure_fn leaves in the layer.
        self.weights, self.state = weights, new_state
      return _zeros_like_shapes(out_shapes), new_state
    out, new_state = pure_fn(self, x, weights, state, rng, use_cache=use_cache)
    out_shapes, state_shapes = _strong_shapes(out), _strong_shapes(new_state)
    if out_shapes is not None and state_shapes is not None:
      seen[key] = (self, out_shapes, state_shapes)
    return out, new_state

  _install('init_traces', layer_cls, 'init', init_once)
  _install('init_traces', layer_cls, '_forward_abstract',
           forward_abstract_counted)
  _install('init_traces', layer_cls, 'pure_fn', pure_fn_once)


PATCHES = {
    'tree_unflatten': _fix_tree_unflatten,
    'efficient_attention': _fix_efficient_attention,
    'for_n_devices': _fix_for_n_devices,
    'on_cpu': _fix_on_cpu,
    'cond': _fix_cond,
    'stop_gradient': _fix_stop_gradient,
    'init_traces': _fix_init_traces,
}


def apply():
  """Installs all fixes; calling it again does nothing."""
  for name, fix in PATCHES.items():
    if name not in _APPLIED:
      fix()


def undo(name):
  """Removes fix `name` (for tests); `apply()` installs it again."""
  for owner, attr, original in reversed(_APPLIED.pop(name, [])):
    setattr(owner, attr, original)


def applied():
  """Names of the fixes currently installed."""
  return sorted(_APPLIED)
