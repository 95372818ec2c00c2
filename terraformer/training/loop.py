"""Training and evaluation through `trax.supervised.training.Loop`.

`train(output_dir, settings)` trains as its `TrainSettings` say; they are
gin-configurable as `terraformer.train` (a bare `train.` selector is
ambiguous: Trax registers `trax.supervised.trainer_lib.train` too), so that
`terraformer.train.steps = 1000` binds `TrainSettings.steps`. One trainer at
a time writes an `output_dir`: process 0 holds its lock
(terraformer/training/run_lock.py) from start to end. Loop
writes TensorBoard event files (`train/`, `eval/`) into `output_dir`;
checkpoints are crash-safe (`terraformer.checkpoint.store`): `_CheckpointedLoop`
replaces Loop's `save_checkpoint`/`load_checkpoint` and resumes exactly (the
weights, state, optimizer slots, rng, step and data position of the newest
verified checkpoint), and stops at the first non-finite loss or gradient norm.

Multi-process (after `terraformer.distributed.initialize`): every process runs
the same Loop on its own rows of each global batch (`distributed.process_rows`);
Trax's pmap step averages the gradients over all devices of all processes.
Process 0 alone reads and writes `output_dir` (checkpoints, `model.pkl.gz`,
TensorBoard events) and broadcasts the state it resumes from; metrics and the
NaN guard use means over all processes. Trax's own Loop reports host-local
losses and process 0's evals only (its `run_evals` TODO); this one does not.

`weight_sharding = 'fsdp'` trains without Trax's Loop, with every weight and
optimizer slot split over all devices (terraformer/training/fsdp.py). Both
loops share their inputs, counters, guards and messages
(terraformer/training/run_state.py) and their checkpoint layout
(terraformer/checkpoint/layout.py).
"""
import contextlib
import dataclasses
import itertools
import os
import time
from typing import Any

import gin
import jax
import numpy as np
from trax import layers as tl
from trax import optimizers
from trax.supervised import callbacks as trax_callbacks
from trax.supervised import lr_schedules
from trax.supervised import training

from terraformer import distributed
from terraformer import errors
from terraformer.distributed import say
from terraformer.checkpoint import format as checkpoint_format
from terraformer.checkpoint import layout
from terraformer.checkpoint import store as checkpoints
from terraformer.data import streaming
from terraformer.training import finetune
from terraformer.training import fsdp as sharded_training
from terraformer.training import resume
from terraformer.training import run_lock
from terraformer.training import run_state


def _first_batch(stream_fn, name, n_devices):
  """Returns (first batch, iterator over all batches) of a stream function."""
  stream = iter(stream_fn())
  try:
    batch = next(stream)
  except StopIteration:
    raise errors.TerraformerError(f'{name} produced no batches') from None
  if not isinstance(batch, (tuple, list)) or len(batch) < 2:
    raise errors.TerraformerError(
        f'{name} must yield (inputs, targets, weights) tuples, '
        f'got {type(batch).__name__}')
  shape = np.shape(batch[0])
  if not shape or shape[0] % n_devices:
    raise errors.TerraformerError(
        f'{name}: batch size {shape[0] if shape else None} is not divisible '
        f'by the number of devices ({n_devices})')
  return batch, itertools.chain([batch], stream)


def _every(n, last):
  """Step predicate: every `n` steps (never if `n` is falsy) and at `last`."""
  return lambda step: bool(n) and step % n == 0 or step == last


def _this_process_rows(stream_fn):
  """`stream_fn` whose batches keep this process's rows (all, alone).

  A `ProcessBatch` (a TFDS stream that read only this process's part of the
  split) already holds them.
  """
  if not distributed.is_multiprocess():
    return stream_fn

  def stream():
    for batch in stream_fn():
      if isinstance(batch, streaming.ProcessBatch):
        batch = tuple(batch)
      elif isinstance(batch, (tuple, list)) and np.ndim(batch[0]):
        rows = distributed.process_rows(np.shape(batch[0])[0])
        batch = tuple(np.asarray(x)[rows] for x in batch)
      yield batch
  return stream


class _CheckpointedLoop(run_state.RunCounters, training.Loop):
  """Trax's Loop with crash-safe checkpoints, exact resume, a NaN guard.

  Overrides `Loop.save_checkpoint`/`load_checkpoint` (trax/supervised/
  training.py): a checkpoint is committed whole by `checkpoints.
  CheckpointStore` with the Loop's rng and the number of batches consumed
  (`run_state.RunCounters`, `terraformer.checkpoint.layout`), and Trax's
  `model.pkl.gz` is written next to it in one atomic file.
  `_run_one_step` stops at the first non-finite loss or gradient norm
  (before that step's checkpoint), or with `skip_non_finite` restores the
  weights and slots of before the step and counts it. A step's checkpoints
  wait for its evals (`run_state.EvalsBeforeCheckpoints`); summaries, lines
  and `config.gin` are `run_state.RunLog`'s.
  """

  def __init__(self, *args, store, skip_non_finite=False, **kwargs):
    self._store = store
    self._skip_non_finite = skip_non_finite
    self.reset_counters()  # Checkpointed with the step (`RunCounters`).
    self._in_train_step = False
    self._in_run = False  # Inside `run` (its evals follow its saves).
    self._saves = run_state.EvalsBeforeCheckpoints(
        lambda step: self._in_run and self._eval_at(step),
        self._save_checkpoint_now)
    super().__init__(*args, **kwargs)
    self._run_log = run_state.RunLog(
        self._output_dir if self.is_chief else None,
        log=training._log,  # pylint: disable=protected-access
        mean=(distributed.global_mean if distributed.is_multiprocess()
              else None))

  def _trees(self):
    """part -> tree of everything a resume needs, but the rng."""
    trees = {'weights': self._model.weights, 'state': self._model.state,
             'eval_state': self._eval_model.state}
    for i, trainer in enumerate(self._trainer_per_task):
      trees[f'slots{i}'] = trainer.slots
    return trees

  def _train_state(self, convert=np.asarray):
    """name -> numpy array (`convert` of each leaf) of everything a resume
    needs."""
    return layout.arrays_of(self._trees(), self._rng, convert)

  def _set_train_state(self, arrays):
    trees = layout.trees_of(arrays, self._trees())
    self.update_weights_and_state(trees['weights'], trees['state'])
    self._eval_model.weights = self._model.weights
    self._eval_model.state = trees['eval_state']
    for i, trainer in enumerate(self._trainer_per_task):
      trainer.slots = trees[f'slots{i}']
    self._rng = jax.numpy.asarray(arrays[layout.RNG])

  def load_checkpoint(self, directory=None, filename=None):
    if directory or filename:
      return super().load_checkpoint(directory, filename)
    if self._store is not None:  # Process 0 (or the only one).
      self._restore()
    if distributed.is_multiprocess():  # Everyone resumes from process 0's.
      self._take_state_of_process_0()

  def _restore(self):
    # Shapes only: no host copy of the weights and slots at start-up.
    shapes = self._train_state(lambda x: (np.shape(x), np.dtype(x.dtype)))
    restored = self._store.restore(shapes)
    if restored is None:
      self._load_trax_checkpoint()
      return
    step, arrays, meta = restored
    self._set_train_state(arrays)
    self._set_position(dict(meta, step=step))

  def _position(self):
    """Where training stands, as the checkpoint's JSON meta says it."""
    return self.position_meta(self._step, self._history)

  def _set_position(self, meta):
    self._step = meta['step']
    self._history = self.set_counters(meta)

  def _take_state_of_process_0(self):
    meta = distributed.broadcast_json(self._position())
    if not meta['step']:
      return  # Fresh start: the shared seed made the same weights everywhere.
    self._set_train_state(distributed.broadcast_from_process_0(
        self._train_state()))
    self._set_position(meta)

  def _load_trax_checkpoint(self):
    """Resumes from a Trax-only `model.pkl.gz` (written before checkpoints/)."""
    path = os.path.join(self._output_dir, checkpoint_format.CHECKPOINT)
    if not os.path.isfile(path):
      return
    flat = checkpoint_format.read_trax_checkpoint(path)['flat_weights']
    n_model = len(jax.tree_util.tree_leaves(self._model.weights))
    if len(flat) != n_model:
      raise errors.TerraformerError(
          f'checkpoint {path} has {len(flat)} weight arrays, the model '
          f'{n_model}: use another --output_dir for another model')
    super().load_checkpoint()
    self.batches_consumed = self._step
    print(f'Resumed from Trax checkpoint {path} (no stream position or rng '
          'saved: resume is not exact)', flush=True)

  def save_checkpoint(self, basename):
    # Inside `run`, a step's saves wait for its evals (`run_evals`).
    self._saves.save(self.step, basename)

  def run(self, n_steps=1):
    self._in_run = True
    self._run_log.started(self.step)
    try:
      return super().run(n_steps)
    finally:
      self._in_run = False

  def run_evals(self, summary_writers=None):
    super().run_evals(summary_writers)
    self._saves.evals_done(self.step)

  def _save_checkpoint_now(self, basename):
    if not distributed.is_multiprocess():
      if self._output_dir is not None:
        self._save(basename, self._snapshot(basename))
      return
    # Every process takes the snapshot (the same device work everywhere, so
    # the collectives that follow match); process 0 writes it; all learn
    # whether it could and stop together if not.
    snapshot = self._snapshot(basename)
    error = None
    if self._store is not None:
      try:
        self._save(basename, snapshot)
      except errors.TerraformerError as e:
        error = str(e)
    run_state.stop_together(error, chief=self._store is not None)

  def _snapshot(self, basename):
    """(arrays of the checkpoint or None, Trax's checkpoint dict), on host."""
    arrays = self._train_state() if basename == 'model' else None
    trax_checkpoint = self._trax_checkpoint()
    for key in ('flat_weights', 'flat_state', 'flat_eval_state',
                'slots_per_task'):
      trax_checkpoint[key] = jax.tree_util.tree_map(
          lambda x: np.asarray(x) if hasattr(x, 'shape') else x,
          trax_checkpoint[key])
    return arrays, trax_checkpoint

  def _save(self, basename, snapshot):
    arrays, trax_checkpoint = snapshot
    if arrays is not None:
      self._store.save(self.step, arrays, self._position())
    layout.write_trax_checkpoint(self._output_dir, basename, trax_checkpoint)

  def _trax_checkpoint(self):
    """The dict of Loop.save_checkpoint, weights and slots inline."""
    flat_weights, flat_state = tl.flatten_weights_and_state(
        self._model.weights, self._model.state)
    _, flat_eval_state = tl.flatten_weights_and_state(
        self._model.weights, self._eval_model.state)
    slots = [self._to_bits(training._flatten_and_remove_empty(t.slots))  # pylint: disable=protected-access
             for t in self._trainer_per_task]
    return layout.trax_checkpoint(
        self.step, self._to_bits(flat_weights), flat_state, flat_eval_state,
        self._history.to_dict(), slots,
        self._batch_signature[:self._model.n_in])

  def new_rng(self):
    rng = super().new_rng()
    if self._in_train_step and distributed.is_multiprocess():
      # Trax's Trainer splits the step's rng over the local devices: without
      # this, device i of every process would draw the same dropout masks.
      rng = jax.random.fold_in(rng, jax.process_index())
    return rng

  def _log_training_progress(self, task, total_loss, n_steps, elapsed_time,
                              optimizer_metrics, summary_writer):
    """Logs the train metrics since the last eval from `since_eval`, which
    checkpoints carry (Loop.run's sums start at 0 in every process: the
    first eval after a resume between two evals would average fewer steps
    than the uninterrupted run's), by `run_state.RunLog.train`."""
    del total_loss, n_steps, optimizer_metrics  # Loop.run's; this process's.
    sums = self.take_since_eval()
    # Trax's own lines first: a blank one, at step 1 the number of weights.
    training._log('')  # pylint: disable=protected-access
    if self.step == 1:
      self._log_n_weights()
    self._run_log.train(
        self._history, self.step, summary_writer, sums, elapsed_time,
        task.learning_rate(self.step), max(sums['steps'], 1) / elapsed_time)

  def log_summary(self, values, summary_writer, value_prefix, log_prefix,
                  stdout=True):
    """Logs metrics averaged over all processes (Trax: this process's)."""
    self._run_log.summary(self._history, self.step, values, summary_writer,
                          value_prefix, log_prefix, stdout=stdout)

  def _run_one_step(self, task_index, task_changed):
    trainer = self._trainer_per_task[task_index]
    if self._skip_non_finite:
      before = (self._model.weights, self._model.state, trainer.slots)
      if self.n_devices > 1:  # The multi-device update donates its inputs.
        before = jax.tree_util.tree_map(np.array, before)
    self._in_train_step = True
    try:
      loss, stats = super()._run_one_step(task_index, task_changed)
    finally:
      self._in_train_step = False
    self.count_step(self.step)
    if distributed.is_multiprocess():  # The same decision on every process.
      # Host copies first: no computation on the step's outputs here.
      loss, gradients_l2 = distributed.global_mean([
          np.mean(np.asarray(loss)),
          np.mean(np.asarray(stats.get('gradients_l2', 0.0)))])
      stats = dict(stats, gradients_l2=gradients_l2)
    if self.check_step(self.step, loss, stats, self._skip_non_finite,
                       self._store):  # Skipped: undone.
      self.update_weights_and_state(*before[:2])
      trainer.slots = before[2]
    return loss, stats


class _Progress(trax_callbacks.TrainingStepCallback):
  """Prints one line per eval: step, train loss, eval metrics, speed."""

  def __init__(self, total_steps):
    super().__init__(None)  # The loop comes later, in `attach`.
    self._total = total_steps
    self._done = 0  # Last step reported.
    self._time = time.time()

  def attach(self, loop):
    """Used as a Loop callback 'class': Loop calls it with itself."""
    self._loop = loop
    self._done = loop.step
    return self

  def call_at(self, step):
    return True

  def on_step_begin(self, step):
    if not jax.process_index():
      self.report()  # The eval of the previous step ran after its on_step_end.

  def on_step_end(self, step):
    pass

  def report(self):
    """Prints the evals recorded since the last report."""
    history = self._loop.history
    for step, log_ppl in history.get('eval', 'metrics/log_perplexity'):
      if step <= self._done:
        continue
      train_loss = dict(history.get('train', 'metrics/loss')).get(step)
      accuracy = dict(history.get('eval', 'metrics/accuracy')).get(step)
      now = time.time()
      parts = [f'step {step}/{self._total}']
      if train_loss is not None:
        parts.append(f'train loss {train_loss:.4f}')
      parts.append(f'eval log_perplexity {log_ppl:.4f} '
                   f'(perplexity {np.exp(min(log_ppl, 50.0)):.2f})')
      if accuracy is not None:
        parts.append(f'eval accuracy {accuracy:.4f}')
      parts.append(f'{(step - self._done) / (now - self._time):.2f} steps/s')
      print(' | '.join(parts), flush=True)
      self._done, self._time = step, now


def _remove_broken_data_counters(output_dir):
  """Removes unreadable Trax `data_counters*.pkl` (Loop would crash on them).

  Trax 1.4.1 rewrote them in place at each save; a kill could leave them
  empty. They count `trax.data` pipelines, which our streams do not use.
  """
  if not os.path.isdir(output_dir):
    return
  for name in os.listdir(output_dir):
    path = os.path.join(output_dir, name)
    if name.startswith('data_counters') and name.endswith('.pkl'):
      try:
        training.unpickle_from_file(path)
      except Exception:  # pylint: disable=broad-except
        os.remove(path)
        print(f'Removed {path}: unreadable (left by an interrupted Trax '
              'save; unused here)', flush=True)


@gin.configurable('train', module='terraformer')
@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """What `train` trains and how: gin's `terraformer.train.*` bindings.

  `TrainSettings()` takes its fields from the bindings (`terraformer.train.
  steps = 1000` in a gin file, `--config=terraformer.train.steps=10` on a
  command line); fields given as arguments take precedence, as for any gin
  configurable.

  Attributes:
    model: Trax model function taking `mode=` ('train' or 'eval').
    train_stream: function with no args returning an iterator of
      `(inputs, targets, weights)` numpy batches.
    eval_stream: same as `train_stream`, for evaluation.
    steps: total number of training steps (not the number to run now).
    optimizer: Trax optimizer class, called with no args (configure via gin).
    lr_schedule_fn: function with no args returning a schedule step -> lr.
    eval_every: evaluate at step 1, every this many steps and at the end.
    eval_batches: number of eval batches averaged per evaluation; the first
      `eval_batches` of `eval_stream`, the same ones at every evaluation.
    checkpoint_every: commit a checkpoint (`checkpoints/<step>/` and
      `model.pkl.gz`) every this many steps and at the end.
    permanent_checkpoint_every: also keep `model_{step}.pkl.gz` this often.
    random_seed: seed for weight init and rngs; None: from the clock (of
      process 0, shared by all processes).
    use_memory_efficient_trainer: Loop's memory-efficient trainer.
    callbacks: extra Loop callback classes (`TrainingStepCallback`).
    init_checkpoint: fine-tune from this checkpoint (a training output_dir or
      its `model.pkl.gz`): its weights initialize the model, the optimizer
      state and step start fresh (§4.4). Ignored when `output_dir` has its
      own checkpoint: resuming takes precedence.
    keep_checkpoints: committed checkpoints kept in `checkpoints/` (K).
    skip_non_finite: on a NaN/Inf loss or gradient norm, undo that step and
      count it instead of stopping with an error.
    weight_sharding: 'replicated': Trax's Loop, a whole copy of the weights
      and slots on every device (pmap). 'fsdp': every weight and optimizer
      slot split over all devices of all processes (`ShardedTrainer`, one
      jitted SPMD step; sharded checkpoints; terraformer/training/fsdp.py)
      for models that do not fit on one device. Not with
      `use_memory_efficient_trainer`, `callbacks` or `init_checkpoint`.
    write_model_pkl: 'fsdp' only: also write `model.pkl.gz` (the weights
      gathered on process 0) at every checkpoint; False for weights larger
      than a host's memory (the sharded `checkpoints/` are always written).
    fsdp_gather_weights: 'fsdp' only: gather every weight whole at the start
      of each step so that the activations split along the batch
      (`ShardedTrainer(gather_weights=True)`); for weights that fit on one
      device (the 800M configs, not 17B).
  """
  model: Any = gin.REQUIRED
  train_stream: Any = gin.REQUIRED
  eval_stream: Any = gin.REQUIRED
  steps: int = 1000
  optimizer: Any = optimizers.Adam
  lr_schedule_fn: Any = lr_schedules.multifactor
  eval_every: Any = 100
  eval_batches: int = 10
  checkpoint_every: Any = 100
  permanent_checkpoint_every: Any = None
  random_seed: Any = None
  use_memory_efficient_trainer: bool = False
  callbacks: Any = ()
  init_checkpoint: Any = None
  keep_checkpoints: int = 2
  skip_non_finite: bool = False
  weight_sharding: str = 'replicated'
  write_model_pkl: bool = True
  fsdp_gather_weights: bool = False

  def eval_at(self, step):
    """Whether to evaluate after `step`: at 1, every `eval_every`, the end."""
    return step == 1 or _every(self.eval_every, self.steps)(step)

  def checkpoint_at(self, step):
    return _every(self.checkpoint_every, self.steps)(step)

  def permanent_checkpoint_at(self, step):
    return _every(self.permanent_checkpoint_every, None)(step)


def train(output_dir, settings=None, **overrides):
  """Trains `settings.model` to `settings.steps` total steps, resuming from
  `output_dir`.

  Args:
    output_dir: directory for checkpoints and TensorBoard event files; if it
      has a checkpoint, training continues from it. One trainer at a time:
      a second one on a directory that a live run holds raises
      `run_lock.RunDirInUse` and writes nothing (terraformer/training/
      run_lock.py).
    settings: a `TrainSettings`; None: `TrainSettings()`, from the gin
      bindings `terraformer.train.*`.
    **overrides: `TrainSettings` fields that take precedence over those of
      `settings` or the bindings (e.g. `steps=` of a command-line flag).

  Returns:
    The `trax.supervised.training.Loop` after training (`.step`, `.history`,
    `.model`); with 'fsdp' a `sharded_training.FsdpLoop` (`.step`,
    `.history`, `.trainer`).
  """
  settings = _checked(settings, overrides)
  output_dir = os.path.expanduser(output_dir)
  progress = _Progress(settings.steps)
  with _output_dir_held(output_dir) as made_dir:
    # Model and data before anything else: a config error leaves no files.
    with resume.removed_if_failed(output_dir, made_dir):
      inputs = _inputs(settings)
    if settings.weight_sharding == 'fsdp':
      return sharded_training.train_fsdp(output_dir, settings, inputs,
                                         made_dir, progress)
    return _train_replicated(output_dir, settings, inputs, made_dir, progress)


def _checked(settings, overrides):
  """`settings` (or the bound ones) with `overrides`, checked before
  anything is built, with the random seed of process 0."""
  if settings is None:
    settings = TrainSettings(**overrides)
  elif overrides:
    settings = dataclasses.replace(settings, **overrides)
  fsdp = _check_weight_sharding(
      settings.weight_sharding, settings.use_memory_efficient_trainer,
      settings.callbacks, settings.init_checkpoint)
  if (distributed.is_multiprocess() and jax.local_device_count() == 1
      and not fsdp):  # Loop then jits: no cross-device sum.
    raise errors.TerraformerError(
        'a multi-process job needs more than one device per process: '
        "Trax's Loop averages gradients across processes only through "
        'pmap, which it uses for 2 or more local devices')
  if settings.init_checkpoint:
    finetune.checkpoint_file(settings.init_checkpoint)  # Fail early.
  if fsdp or distributed.is_multiprocess():  # Same initial weights.
    settings = dataclasses.replace(
        settings, random_seed=distributed.shared_seed(settings.random_seed))
  return settings


@contextlib.contextmanager
def _output_dir_held(output_dir):
  """Holds `output_dir`'s `run_lock.RunLock` (on process 0, which alone
  owns it) while the block runs; yields whether it made the directory.

  A refusal stops every process before anything is written.
  """
  chief = not jax.process_index()
  lock = run_lock.RunLock(output_dir)
  refusal = None
  if chief:
    try:
      lock.acquire()
    except run_lock.RunDirInUse as e:
      refusal = e
  if refusal is not None and not distributed.is_multiprocess():
    raise refusal
  run_state.stop_together(refusal and str(refusal), chief)
  try:
    yield lock.made_dir
  finally:
    lock.release()


def _inputs(settings):
  """The `run_state.Inputs` of `settings`: models and first batches built,
  each process's rows of the batches of a multi-process job."""
  n_devices = jax.local_device_count()
  train_stream = _this_process_rows(settings.train_stream)
  eval_stream = _this_process_rows(settings.eval_stream)
  train_model = settings.model(mode='train')
  eval_model = settings.model(mode='eval')
  train_batch, train_batches = _first_batch(
      train_stream, 'train_stream', n_devices)
  eval_batch, eval_batches = _first_batch(
      eval_stream, 'eval_stream', n_devices)
  # Every evaluation sees the same `eval_batches` batches: comparable curves.
  eval_set = list(itertools.islice(eval_batches, settings.eval_batches))
  return run_state.Inputs(train_model, eval_model, train_batch,
                          train_batches, eval_batch, eval_set)


def _train_replicated(output_dir, settings, inputs, made_dir, progress):
  """Trains with Trax's Loop (`_CheckpointedLoop`); returns it."""
  chief = not jax.process_index()  # Reads and writes output_dir.
  try:
    with resume.removed_if_failed(output_dir, made_dir):
      loop = _start_loop(output_dir if chief else None, settings, inputs,
                         progress)
  except BaseException as e:
    if _another_process_failed(e):
      raise _process_group_error(e, 'start-up') from None
    raise
  steps = settings.steps
  if not resume.resume(loop, inputs.train_batches, steps, output_dir,
                       settings.init_checkpoint):
    return loop
  processes = (f' ({jax.process_count()} processes, '
               f'{jax.device_count()} devices in all)'
               if distributed.is_multiprocess() else '')
  say(f'Training steps {loop.step + 1}..{steps} on {loop.n_devices} '
      f'device(s){processes}, output in {output_dir}')
  try:
    loop.run(steps - loop.step)
  except jax.errors.JaxRuntimeError as e:
    if _another_process_failed(e):
      raise _process_group_error(e, f'step {loop.step}') from None
    raise
  if chief:
    progress.report()
  return loop


def _start_loop(output_dir, settings, inputs, progress):
  """The `_CheckpointedLoop` of `settings`, resumed from `output_dir`'s
  checkpoint or initialized from `init_checkpoint`; `output_dir` is None
  on processes other than 0."""
  train_task = training.TrainTask(
      inputs.train_batches, tl.WeightedCategoryCrossEntropy(),
      settings.optimizer(), lr_schedule=settings.lr_schedule_fn(),
      n_steps_per_checkpoint=settings.checkpoint_every, loss_name='loss',
      sample_batch=inputs.train_batch)
  eval_task = training.EvalTask(
      itertools.cycle(inputs.eval_set), run_state.eval_metric_layers(),
      metric_names=list(run_state.EVAL_METRICS),
      n_eval_batches=settings.eval_batches, sample_batch=inputs.eval_batch)
  store = None
  if output_dir is not None:
    _remove_broken_data_counters(output_dir)
    store = checkpoints.CheckpointStore(output_dir,
                                        keep=settings.keep_checkpoints)
  loop = _CheckpointedLoop(
      inputs.train_model, [train_task], eval_model=inputs.eval_model,
      eval_tasks=[eval_task], output_dir=output_dir,
      eval_at=settings.eval_at, checkpoint_at=settings.checkpoint_at,
      permanent_checkpoint_at=settings.permanent_checkpoint_at,
      random_seed=settings.random_seed,
      use_memory_efficient_trainer=settings.use_memory_efficient_trainer,
      callbacks=[progress.attach] + list(settings.callbacks), store=store,
      skip_non_finite=settings.skip_non_finite)
  init_checkpoint = settings.init_checkpoint
  if init_checkpoint and not loop.step:
    n_loaded = finetune.init_weights(loop, init_checkpoint)
    say(f'Fine-tuning from {init_checkpoint}: loaded {n_loaded} weight '
        'arrays (optimizer state and step start fresh)')
  return loop


def _check_weight_sharding(weight_sharding, memory_efficient, callbacks,
                           init_checkpoint):
  """Whether `weight_sharding` is 'fsdp' (vs 'replicated'); one-line errors
  for other values and for what the FSDP path does not do."""
  if weight_sharding not in ('replicated', 'fsdp'):
    raise errors.TerraformerError(
        f"terraformer.train.weight_sharding must be 'replicated' or 'fsdp', "
        f'got {weight_sharding!r}')
  if weight_sharding == 'replicated':
    return False
  for name, value in (('use_memory_efficient_trainer', memory_efficient),
                      ('callbacks', callbacks),
                      ('init_checkpoint', init_checkpoint)):
    if value:
      raise errors.TerraformerError(
          f"terraformer.train.{name} is not supported with weight_sharding="
          "'fsdp' (it is a Trax Loop feature)")
  return True


def _another_process_failed(error):
  return (isinstance(error, jax.errors.JaxRuntimeError)
          and distributed.is_multiprocess())


def _process_group_error(error, where):
  """The one-line error of a collective that failed: a process died."""
  return distributed.ProcessGroupError(
      f'{where}: a collective with the other processes failed (another '
      f'process probably died): {errors.first_line(error)}')
