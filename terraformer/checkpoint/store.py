"""Crash-safe checkpoints: written whole, committed atomically, verified.

A training checkpoint is an orbax-checkpoint step directory
`<output_dir>/checkpoints/<step>/` with two items: `arrays` (a flat dict of
numpy arrays: weights, model state, optimizer slots, the Loop's rng) and
`meta` (JSON: step, batches consumed, array shapes, history). The protocol
(Orbax's and t5x's: temporary path, rename, then a marker written last):

  1. orbax writes the step under a temporary name and renames it when whole;
  2. every file and directory in it is fsynced;
  3. `COMMITTED` (holding the step) is written, fsynced, and the step
     directory and its parent are fsynced. Only a step with this marker
     exists for `restore`;
  4. then steps older than the newest `keep` are deleted, marker first.

On start (`CheckpointStore.__init__`) leftovers of interrupted saves (orbax
temporaries, steps without the marker, `*.tmp-*` / Trax `*._tmp_` files) are
removed, one line each. `restore` takes the newest committed step whose
marker, JSON and every array read back in full and agree on the step, with
shapes equal to the model's; a damaged one is reported in one line, moved to
`checkpoints.damaged/` (kept for inspection) and the previous one is tried.

Sharded (`CheckpointStore(sharded=True)`, FSDP training): the arrays are
global `jax.Array`s split over the devices of all processes; every process
writes and reads only its own shards (orbax; `output_dir` must then be on a
disk all processes share), process 0 alone removes leftovers, writes the
marker and deletes old steps, and the processes agree on every outcome (a
step damaged for one of them is set aside for all).

Trax's `model.pkl.gz` (read by `init_checkpoint`, terraformer-decode/eval and
Trax's `Loop.load_checkpoint`) is written too, as one self-contained file
(flat weights and slots inline: the older Loop format that Trax still reads),
by `terraformer.checkpoint.format`.
"""
import errno
import json
import os
import shutil
import sys
import time

import numpy as np

from terraformer import errors
from terraformer.checkpoint import format as checkpoint_format
from terraformer.checkpoint.format import atomic_write
from terraformer.checkpoint.format import fsync

CHECKPOINTS = 'checkpoints'
DAMAGED = 'checkpoints.damaged'
MARKER = 'COMMITTED'


def fsync_tree(root):
  """fsyncs every file and directory under `root`, `root` last."""
  for folder, _, files in os.walk(root, topdown=False):
    for name in files:
      fsync(os.path.join(folder, name))
    fsync(folder)


def is_disk_full(error):
  """Whether `error` (or what it wraps) is 'no space left on device'."""
  while error is not None:
    if getattr(error, 'errno', None) == errno.ENOSPC or (
        'No space left on device' in str(error)):
      return True
    error = error.__cause__ or error.__context__
  return False


def _shapes(arrays):
  return {k: [list(np.shape(v)), str(np.dtype(v.dtype))]
          for k, v in sorted(arrays.items())}


def _json_safe(value):
  return json.loads(json.dumps(value, default=float))


def committed_steps(output_dir):
  """Steps committed in `output_dir` (with their marker), newest first."""
  folder = os.path.join(output_dir, CHECKPOINTS)
  if not os.path.isdir(folder):
    return []
  return sorted((int(n) for n in os.listdir(folder)
                 if n.isdigit() and os.path.isfile(
                     os.path.join(folder, n, MARKER))), reverse=True)


def _failure(error):
  """One line naming `error` (disk full in words)."""
  if is_disk_full(error):
    return 'disk full'
  return f'{type(error).__name__}: {errors.first_line(error, 200)}'


class CheckpointStore:
  """The committed training checkpoints of one output directory.

  Unsharded (default): numpy arrays, one process reads and writes. Sharded:
  every process of the job holds a store over the same directory and
  passes global `jax.Array`s (module docstring).
  """

  def __init__(self, output_dir, keep=2, sharded=False):
    if not isinstance(keep, int) or keep < 1:
      raise errors.TerraformerError(
          f'keep_checkpoints must be a positive integer, got {keep!r}')
    import jax  # pylint: disable=g-import-not-at-top
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
    self._ocp = ocp
    self.output_dir = output_dir
    self.directory = os.path.join(output_dir, CHECKPOINTS)
    self.keep = keep
    self.sharded = sharded
    self.primary = not sharded or not jax.process_index()
    self.last_step = None  # Newest committed step (after restore/save).
    if self.primary:
      self._remove_leftovers()
    self._agree(None)  # Nobody looks before the leftovers are gone.
    self._manager = None

  def _agree(self, value):
    """Every process's JSON-able `value` (a list by process) when sharded
    over several processes, else [value]. A barrier, too."""
    from terraformer import distributed  # pylint: disable=g-import-not-at-top
    if not (self.sharded and distributed.is_multiprocess()):
      return [value]
    return distributed._exchange(value)  # pylint: disable=protected-access

  def _manager_(self):
    if self._manager is None:
      os.makedirs(self.directory, exist_ok=True)
      # Old steps are deleted by `_drop_old`, after the new one is committed.
      import jax  # pylint: disable=g-import-not-at-top
      if self.sharded:  # Every process writes its shards.
        processes = self._ocp.options.MultiprocessingOptions(primary_host=0)
      else:  # In a multi-process job only process 0 has a store.
        processes = self._ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(),
            active_processes={jax.process_index()})
      options = self._ocp.CheckpointManagerOptions(
          max_to_keep=None, enable_async_checkpointing=False, create=False,
          multiprocessing_options=processes)
      self._manager = self._ocp.CheckpointManager(
          self.directory, options=options)
    return self._manager

  def _remove_leftovers(self):
    """Removes what interrupted saves left: nothing of it was committed."""
    from terraformer import distributed  # pylint: disable=g-import-not-at-top
    leftovers = []
    if os.path.isdir(self.directory):
      for name in os.listdir(self.directory):
        path = os.path.join(self.directory, name)
        if not (name.isdigit() and os.path.isfile(
            os.path.join(path, MARKER))):
          leftovers.append(path)
    if os.path.isdir(self.output_dir):
      leftovers += [os.path.join(self.output_dir, name)
                    for name in os.listdir(self.output_dir)
                    if checkpoint_format.TMP in name or name.endswith('._tmp_')]
    for path in sorted(leftovers):
      if os.path.isdir(path):
        shutil.rmtree(path)
      else:
        os.remove(path)
      distributed.say(
          f'Removed {path}: left by an interrupted save (not committed)')

  def steps(self):
    """Committed steps, newest first."""
    return committed_steps(self.output_dir)

  def save(self, step, arrays, meta):
    """Commits checkpoint `step`: `arrays` (name -> array) and `meta`.

    On any error (disk full included, on any process) the partial step is
    removed, the previous checkpoints are kept, and a TerraformerError says
    so (on every process).
    """
    ocp = self._ocp
    meta = _json_safe(dict(meta, step=step, shapes=_shapes(arrays)))
    path = os.path.join(self.directory, str(step))
    error = None
    try:
      manager = self._manager_()
      if os.path.exists(path) and self.primary:  # Re-done after damage.
        shutil.rmtree(path)
      self._agree(None)
      manager.reload()
      manager.save(step, force=True, args=ocp.args.Composite(
          arrays=ocp.args.StandardSave(arrays),
          meta=ocp.args.JsonSave(meta)))
      manager.wait_until_finished()
      if self.primary:
        fsync_tree(path)
        atomic_write(os.path.join(path, MARKER),
                     lambda f: f.write(f'{step}\n'.encode()))
        fsync(self.directory)
    except Exception as e:  # pylint: disable=broad-except
      error = e
    failed = [e for e in self._agree(
        None if error is None else _failure(error)) if e]
    if failed:
      self._abort(step, error, failed[0])
    self.last_step = step
    self._drop_old()

  def _drop_old(self):
    """Deletes all but the newest `keep` steps, each marker first.

    Without its marker a half-deleted step is a leftover, never a damaged
    committed one.
    """
    if self.primary:
      for step in self.steps()[self.keep:]:
        path = os.path.join(self.directory, str(step))
        os.remove(os.path.join(path, MARKER))
        fsync(path)
        shutil.rmtree(path)
    self._agree(None)
    self._manager_().reload()

  def _abort(self, step, error, what):
    """Removes the partial step `step` and raises one TerraformerError."""
    self._manager = None
    for name in (os.listdir(self.directory)
                 if os.path.isdir(self.directory) and self.primary else []):
      if name.split('.')[0] == str(step) and not os.path.isfile(
          os.path.join(self.directory, name, MARKER)):
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
    self._agree(None)
    if error is None:
      what = f'on another process: {what}'
    kept = (f'last good checkpoint: step {self.steps()[0]}' if self.steps()
            else 'no earlier checkpoint')
    raise errors.TerraformerError(
        f'cannot save the checkpoint of step {step} in {self.directory} '
        f'({what}); partial files removed, {kept}') from None

  def restore(self, shapes):
    """(step, arrays, meta) of the newest verified checkpoint, or None.

    Args:
      shapes: name -> (shape, dtype) of the arrays the model needs; a
        checkpoint with other names or shapes is a TerraformerError (another
        model), not damage. Sharded: also the `jax.sharding.Sharding` of
        each array (name -> (shape, dtype, sharding)); the arrays come back
        as global `jax.Array`s, each process reading its own shards.
    """
    want = _json_safe({k: [list(s[0]), str(np.dtype(s[1]))]
                       for k, s in sorted(shapes.items())})
    for step in self.steps():
      path = os.path.join(self.directory, str(step))
      error = restored = None
      try:
        restored = self._read(step, path, want, shapes)
      except errors.TerraformerError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        error = e
      failed = [e for e in self._agree(
          None if error is None else _failure(error)) if e]
      if failed:
        self._set_aside(step, path, error, failed[0])
        continue
      self.last_step = step
      return restored
    return None

  def _read(self, step, path, want, shapes):
    """One checkpoint, verified; raises on damage (TerraformerError: model)."""
    import jax  # pylint: disable=g-import-not-at-top
    ocp = self._ocp
    with open(os.path.join(path, MARKER)) as f:
      marker_step = int(f.read())
    manager = self._manager_()
    manager.reload()
    meta = manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore()))['meta']
    if not marker_step == meta['step'] == step:
      raise ValueError(f'steps differ: directory {step}, marker '
                       f'{marker_step}, meta {meta["step"]}')
    if meta['shapes'] != want:
      names = sorted(set(meta['shapes']) | set(want))
      first = next(n for n in names
                   if meta['shapes'].get(n) != want.get(n))
      raise errors.TerraformerError(
          f'checkpoint {path} does not match the model: {first}: checkpoint '
          f'{meta["shapes"].get(first)} vs model {want.get(first)}; use '
          'another --output_dir for another model')
    abstract = {k: jax.ShapeDtypeStruct(tuple(s[0]), np.dtype(s[1]),
                                        sharding=s[2] if self.sharded else None)
                for k, s in shapes.items()}
    arrays = manager.restore(step, args=ocp.args.Composite(
        arrays=ocp.args.StandardRestore(abstract)))['arrays']
    for name, shape in shapes.items():
      if tuple(np.shape(arrays[name])) != tuple(shape[0]):
        raise ValueError(f'{name} read back with shape '
                         f'{np.shape(arrays[name])}, not {tuple(shape[0])}')
    if self.sharded:
      jax.block_until_ready(arrays)  # Reading errors show here, not later.
      return step, arrays, meta
    return step, {k: np.asarray(v) for k, v in arrays.items()}, meta

  def _set_aside(self, step, path, error, what):
    aside = os.path.join(self.output_dir, DAMAGED,
                         f'{step}-{time.strftime("%Y%m%d-%H%M%S")}')
    aside = self._agree(aside)[0]  # Process 0's name.
    if self.primary:
      os.makedirs(os.path.dirname(aside), exist_ok=True)
      os.replace(path, aside)
      fsync(self.directory)
    self._agree(None)
    self._manager = None
    where = '' if error is not None else ' for another process'
    if self.primary:
      print(f'Checkpoint step {step} in {self.directory} is damaged{where} '
            f'({what}); moved to {aside}, trying the previous one',
            file=sys.stderr, flush=True)
