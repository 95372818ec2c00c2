"""FSDP training: `terraformer.train(weight_sharding='fsdp')`.

Trax's `Loop` (terraformer/training/loop.py) keeps a whole copy of the
weights and optimizer slots on every device, so it trains only what fits on
one device. With `weight_sharding = 'fsdp'` the steps are `ShardedTrainer`'s
(below) instead: every weight and optimizer slot split over all devices of all
processes (initialized already sharded), the global batch split over the same
mesh axis. This loop does around it what `_CheckpointedLoop` does around
Trax's steps, in the same files and names (terraformer/checkpoint/layout.py)
with the same counters, guards and messages
(terraformer/training/run_state.py):

- evaluations at step 1, every `eval_every` steps and at the end, on the same
  `eval_batches` batches, with the eval model (Loop's `run_evals`: training
  weights and state): `metrics/loss`, `metrics/accuracy`,
  `metrics/log_perplexity`; for training `metrics/loss` (mean since the last
  eval), `training/learning_rate`, `training/steps per second`,
  `training/gradients_l2`, `training/weights_l2`. They go into a Trax
  `History` and TensorBoard event files (`train/`, `eval/`) written by
  process 0, with `config.gin` (`run_state.RunLog`, as Loop's); the metrics
  are those of the global batch;
- a step's checkpoints saved after its evals
  (`run_state.EvalsBeforeCheckpoints`, as Loop's);
- sharded crash-safe checkpoints (`CheckpointStore(sharded=True)`): each
  process writes and reads its own shards, process 0 the `COMMITTED` marker;
  the arrays and meta are those of Loop's checkpoints (`weights_*`,
  `state_*`, `eval_state_*`, `slots0_*`, `rng`; step, batches consumed,
  history), so a run can switch `weight_sharding` and resume;
- `model.pkl.gz` (Trax's format: terraformer-decode/eval/export, fine-tuning)
  with the weights gathered one array at a time and written by process 0 at
  every checkpoint (no optimizer slots: those are in `checkpoints/`), unless
  `write_model_pkl=False` (weights larger than a host's memory);
- the NaN guard (one line, exit 2, nothing saved for the step) and
  `skip_non_finite` (decided inside the jitted step).
"""
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
from trax import jaxboard
from trax import layers as tl
from trax import shapes
from trax.supervised import history as trax_history

from terraformer import distributed
from terraformer import errors
from terraformer.checkpoint import layout
from terraformer.checkpoint import store as checkpoints
from terraformer.distributed import say
from terraformer.training import resume
from terraformer.training import run_state

MESH_AXIS = 'fsdp'  # One axis: weights, slots and the batch split over it.


def device_mesh(devices=None):
  """A 1-D mesh (axis `MESH_AXIS`) over `devices` (default: all, global)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (MESH_AXIS,))


def fsdp_spec(shape, n_devices):
  """PartitionSpec splitting the largest axis of `shape` divisible by
  `n_devices` over the mesh; replicated if no axis divides (small vectors)."""
  candidates = [(size, -axis) for axis, size in enumerate(shape)
                if size >= n_devices and size % n_devices == 0]
  if n_devices == 1 or not candidates:
    return PartitionSpec()
  axis = -max(candidates)[1]
  return PartitionSpec(*[MESH_AXIS if i == axis else None
                         for i in range(len(shape))])


def fsdp_shardings(tree, mesh):
  """NamedShardings of `fsdp_spec` for every array leaf of `tree`."""
  n = mesh.devices.size
  return jax.tree_util.tree_map(
      lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), n)), tree)


def _replicated(tree, mesh):
  return jax.tree_util.tree_map(
      lambda _: NamedSharding(mesh, PartitionSpec()), tree)


def _batch_shardings(batch, mesh):
  return tuple(NamedSharding(mesh, PartitionSpec(MESH_AXIS)) for _ in batch)


class ShardedTrainer:
  """Jitted training steps of a Trax model with FSDP-sharded weights/slots.

  The training math is Trax's (`tl.Serial(model, loss_layer)`, the
  optimizer's `tree_update` at 1-based steps, as `trax.optimizers.Trainer`
  does for one device); only where arrays live differs. Weights are
  initialized as Trax's `Loop` does for the same seed (the second half of
  `PRNGKey(seed)` split in two), but by one jitted call whose outputs are
  already sharded: initialization never puts a whole model on a host or a
  device. Evaluations run `eval_model` (default: `model`) with the training
  weights and state, as Loop's `run_evals`. Every
  process builds the same trainer and calls `train_step` with its own rows
  of each global batch (`process_rows`).

  With `skip_non_finite`, a step whose loss or gradient norm is not finite
  leaves weights and slots unchanged (decided inside the jitted step). With
  `abstract`, nothing is allocated (weights, slots and state are shapes
  with shardings): for `compiled_step_memory` only.

  With `gather_weights`, every weight is gathered whole at the start of the
  step (and of an evaluation); weights and slots stay split at rest and the
  update. Without it XLA follows the weights' split along their feature axis
  into tensor-parallel attention and loss, keeping the attention scores of
  the whole batch on every device (README, "Sharded weights"); with it the
  activations are split along the batch, at the cost of the whole weights on
  each device during the step: for models whose weights fit on one device.
  """

  def __init__(self, model, loss_layer, optimizer, lr_schedule, sample_batch,
               mesh=None, seed=0, skip_non_finite=False, abstract=False,
               gather_weights=False, eval_model=None):
    self.mesh = device_mesh() if mesh is None else mesh
    self._lr_schedule = lr_schedule
    self._optimizer = optimizer
    self._eval_model = model if eval_model is None else eval_model
    self._model_with_loss = tl.Serial(model, loss_layer)
    self._skip_non_finite = skip_non_finite
    self._gather_weights = gather_weights
    signature = shapes.signature(tuple(sample_batch))
    self.rng, init_rng = jax.random.split(jax.random.PRNGKey(seed))

    def init(rng):
      weights, state = model.init(signature, rng=rng)
      return weights, state, optimizer.tree_init(weights)[0]
    weights, state, slots = jax.eval_shape(init, init_rng)
    self._w_shard = fsdp_shardings(weights, self.mesh)
    self._s_shard = fsdp_shardings(slots, self.mesh)
    self._state_shard = _replicated(state, self.mesh)
    shardings = (self._w_shard, self._state_shard, self._s_shard)
    if abstract:
      self.weights, self.state, self.slots = jax.tree_util.tree_map(
          lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
          (weights, state, slots), shardings)
    else:
      self.weights, self.state, self.slots = jax.jit(
          init, out_shardings=shardings)(init_rng)
    self._loss_weights = loss_layer.weights
    self._loss_state = loss_layer.state
    self._opt_params = optimizer.tree_init(())[1]
    self.step = 0
    self.last_stats = {}
    self._batch_shard = _batch_shardings(sample_batch, self.mesh)
    self._sample_batch = [jax.ShapeDtypeStruct(np.shape(x), x.dtype)
                          for x in sample_batch]
    replicated = NamedSharding(self.mesh, PartitionSpec())
    self._replicated = replicated
    self._step_fn = jax.jit(
        self._train_step,
        in_shardings=(self._w_shard, self._s_shard, self._state_shard,
                      self._batch_shard, replicated, replicated, None),
        out_shardings=(self._w_shard, self._s_shard, self._state_shard,
                       replicated, replicated),
        donate_argnums=(0, 1))
    self._eval_fns = {}

  def _train_step(self, weights, slots, state, batch, rng, step, opt_params):
    def loss_fn(w):
      w = self._gathered_in_step(w)
      loss, new_state = self._model_with_loss.pure_fn(
          batch, (w, self._loss_weights), (state, self._loss_state), rng)
      return loss, new_state[0]
    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        weights)
    new_weights, new_slots, stats = self._optimizer.tree_update(
        step, grads, weights, slots, opt_params, store_slots=False)
    if self._skip_non_finite:
      finite = jnp.isfinite(loss) & jnp.isfinite(stats['gradients_l2'])
      keep = lambda new, old: jnp.where(finite, new, old)
      new_weights = jax.tree_util.tree_map(keep, new_weights, weights)
      new_slots = jax.tree_util.tree_map(keep, new_slots, slots)
      new_state = jax.tree_util.tree_map(keep, new_state, state)
    return new_weights, new_slots, new_state, loss, stats

  def compiled_step_memory(self):
    """XLA's memory analysis of the compiled training step, per device.

    Returns a dict of bytes: `arguments` (weights, slots, state and batch
    shards), `outputs`, `aliased` (outputs written over donated arguments),
    `temporaries` (activations and other scratch), and `peak` = arguments +
    outputs - aliased + temporaries.
    """
    batch = tuple(jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
                  for x, s in zip(self._sample_batch, self._batch_shard))
    opt_params = dict(self._opt_params, learning_rate=jnp.float32(0))
    analysis = self._step_fn.lower(
        self.weights, self.slots, self.state, batch, self.rng,
        jnp.asarray(1), opt_params).compile().memory_analysis()
    memory = {'arguments': analysis.argument_size_in_bytes,
              'outputs': analysis.output_size_in_bytes,
              'aliased': analysis.alias_size_in_bytes,
              'temporaries': analysis.temp_size_in_bytes}
    memory['peak'] = (memory['arguments'] + memory['outputs']
                      - memory['aliased'] + memory['temporaries'])
    return memory

  def _gathered_in_step(self, weights):
    if not self._gather_weights:
      return weights
    return jax.lax.with_sharding_constraint(
        weights, _replicated(weights, self.mesh))

  def global_batch(self, local_batch):
    """Global arrays from this process's rows of each batch array."""
    return tuple(jax.make_array_from_process_local_data(s, np.asarray(x))
                 for s, x in zip(self._batch_shard, local_batch))

  def new_rng(self):
    self.rng, rng = jax.random.split(self.rng)
    return rng

  def _collective(self, call):
    try:
      return call()
    except jax.errors.JaxRuntimeError as e:
      if jax.process_count() == 1:
        raise
      raise distributed.ProcessGroupError(
          f'step {self.step}: a collective with the other processes failed '
          f'(another process probably died): {errors.first_line(e)}') from None

  def train_step(self, local_batch):
    """One step on this process's rows; returns the global batch's loss.

    `last_stats` then holds the step's `gradients_l2`, `weights_l2` and
    `loss` (Trax's Trainer's stats).
    """
    self.step += 1
    rng = self.new_rng()
    opt_params = dict(self._opt_params)
    opt_params['learning_rate'] = jnp.asarray(
        self._lr_schedule(self.step), jnp.float32)

    def call():
      self.weights, self.slots, self.state, loss, stats = self._step_fn(
          self.weights, self.slots, self.state,
          self.global_batch(local_batch), rng, jnp.asarray(self.step),
          opt_params)
      loss = float(loss)
      # Trax's Trainer adds the loss to the optimizer's stats.
      self.last_stats = dict({k: float(v) for k, v in stats.items()},
                             loss=loss)
      return loss
    return self._collective(call)

  def evaluate(self, local_batch, metric_layers):
    """Each of `metric_layers` on the global batch (this process's rows),
    by the eval model with the current weights and state."""
    key = tuple(id(m) for m in metric_layers)
    if key not in self._eval_fns:
      branch = tl.Branch(*metric_layers)
      metrics = tl.Serial(self._eval_model, branch)
      metric_weights, metric_state = branch.weights, branch.state

      def evaluate(weights, state, batch, rng):
        weights = self._gathered_in_step(weights)
        values, _ = metrics.pure_fn(batch, (weights, metric_weights),
                                    (state, metric_state), rng)
        return tuple(values) if len(metric_layers) > 1 else (values,)
      self._eval_fns[key] = jax.jit(evaluate, in_shardings=(
          self._w_shard, self._state_shard, self._batch_shard,
          self._replicated), out_shardings=self._replicated)
    rng = self.new_rng()
    return self._collective(lambda: [float(v) for v in self._eval_fns[key](
        self.weights, self.state, self.global_batch(local_batch), rng)])

  def gathered_weights(self):
    """The full weights as numpy arrays (on every process)."""
    return self.gathered(self.weights)

  def gathered(self, tree):
    """`tree` of global arrays as numpy arrays, on every process.

    One leaf at a time: a device holds at most the largest leaf whole.
    """
    gather = jax.jit(lambda x: x, out_shardings=self._replicated)
    return jax.tree_util.tree_map(
        lambda x: np.asarray(self._collective(lambda: gather(x))), tree)


class FsdpLoop(run_state.RunCounters):
  """Training of a `ShardedTrainer` with evals, events and checkpoints.

  Has what callers use of Trax's Loop after training: `step`, `history`.
  `settings`: `terraformer.train`'s (`loop.TrainSettings`).
  """

  def __init__(self, trainer, output_dir, store, inputs, settings):
    self.trainer = trainer
    self.step = 0
    self.history = trax_history.History()
    self.reset_counters()  # Checkpointed with the step (`RunCounters`).
    self._output_dir = output_dir
    self._store = store
    self._train_batches = inputs.train_batches
    self._eval_set = inputs.eval_set
    self._metric_layers = run_state.eval_metric_layers()
    self._metric_names = list(run_state.EVAL_METRICS)
    self._input_signature = shapes.signature(
        tuple(inputs.train_batch))[:inputs.train_model.n_in]
    self._settings = settings
    self._chief = not jax.process_index()
    self._writers = None
    self._saves = run_state.EvalsBeforeCheckpoints(settings.eval_at,
                                                   self.save_checkpoint)
    self._run_log = run_state.RunLog(output_dir if self._chief else None)

  # Checkpoints.

  def _trees(self):
    # eval_state: Loop's name for the eval model's state, which Loop's evals
    # never use (they take the training state); the training state here, so
    # that a run can switch weight_sharding and resume.
    return {'weights': self.trainer.weights, 'state': self.trainer.state,
            'eval_state': self.trainer.state, 'slots0': self.trainer.slots}

  def _arrays(self, convert=lambda x: x):
    # The rng is the same on every process, and local to each: saved as
    # numpy.
    return layout.arrays_of(self._trees(), np.asarray(self.trainer.rng),
                            convert)

  def restore(self):
    """Resumes from the newest verified checkpoint; returns its step or 0."""
    replicated = NamedSharding(self.trainer.mesh, PartitionSpec())
    wanted = self._arrays(lambda x: (x.shape, x.dtype, getattr(
        x, 'sharding', replicated)))
    wanted[layout.RNG] = wanted[layout.RNG][:2] + (replicated,)
    restored = self._store.restore(wanted)
    if restored is None:
      return 0
    step, arrays, meta = restored
    trees = layout.trees_of(arrays, self._trees())
    self.trainer.weights = trees['weights']
    self.trainer.state = trees['state']
    self.trainer.slots = trees['slots0']
    self.trainer.rng = jax.numpy.asarray(np.asarray(arrays[layout.RNG]))
    self.trainer.step = self.step = step
    self.history = self.set_counters(meta)
    return step

  def save_checkpoint(self, basename='model'):
    """Commits the sharded checkpoint (with basename 'model') and writes
    `{basename}.pkl.gz`; every process stops if either fails anywhere."""
    if basename == 'model':
      self._store.save(self.step, self._arrays(),
                       self.position_meta(self.step, self.history))
    if not self._settings.write_model_pkl:
      return
    weights = self.trainer.gathered(self.trainer.weights)
    state = self.trainer.gathered(self.trainer.state)
    error = None
    if self._chief:
      flat_weights, flat_state = tl.flatten_weights_and_state(weights, state)
      try:
        layout.write_trax_checkpoint(self._output_dir, basename,
                                     layout.trax_checkpoint(
                                         self.step, flat_weights, flat_state,
                                         flat_state, self.history.to_dict(),
                                         [], self._input_signature))
      except errors.TerraformerError as e:
        error = str(e)
    run_state.stop_together(error, self._chief)

  # Metrics.

  def _writer(self, mode):
    return self._writers[mode] if self._writers else None

  def run_evals(self):
    sums = np.zeros(len(self._metric_names))
    for batch in self._eval_set:
      sums += self.trainer.evaluate(batch, self._metric_layers)
    self._run_log.summary(
        self.history, self.step,
        dict(zip(self._metric_names, sums / len(self._eval_set))),
        self._writer('eval'), 'metrics/', 'eval')

  # Training.

  def _train_one_step(self):
    loss = self.trainer.train_step(next(self._train_batches))
    self.count_step(self.step)
    # Non-finite and skipped: the jitted step kept the weights and slots of
    # before it.
    self.check_step(self.step, loss, self.trainer.last_stats,
                    self._settings.skip_non_finite, self._store)

  def run(self, n_steps, lr_schedule, on_eval):
    """Trains `n_steps` more steps: each step, then its checkpoints and
    evals as Trax's Loop.run asks for them (when `settings` say), the
    checkpoints saved after the evals (`run_state.EvalsBeforeCheckpoints`).
    """
    settings = self._settings
    if self._chief:
      self._writers = {mode: jaxboard.SummaryWriter(
          os.path.join(self._output_dir, mode)) for mode in ('train', 'eval')}
    self._run_log.started(self.step)
    try:
      start, steps_run = time.time(), 0
      for _ in range(n_steps):
        self.step += 1
        steps_run += 1
        self._train_one_step()
        if settings.checkpoint_at(self.step):
          self._saves.save(self.step, 'model')
        if settings.permanent_checkpoint_at(self.step):
          self._saves.save(self.step, f'model_{self.step}')
        if settings.eval_at(self.step):
          elapsed = time.time() - start
          self._run_log.train(
              self.history, self.step, self._writer('train'),
              self.take_since_eval(), elapsed, float(lr_schedule(self.step)),
              steps_run / max(elapsed, 1e-9))
          self.run_evals()
          on_eval()
          self._saves.evals_done(self.step)
          start, steps_run = time.time(), 0
    finally:
      if self._writers:
        for writer in self._writers.values():
          writer.close()


def train_fsdp(output_dir, settings, inputs, made_dir, progress):
  """Trains to `settings.steps` with FSDP (module docstring); returns the
  `FsdpLoop`.

  Args:
    output_dir: the run's directory, its lock held by `terraformer.train`.
    settings: `terraformer.train`'s `loop.TrainSettings`, checked, with the
      random seed of process 0.
    inputs: the `run_state.Inputs` built from them.
    made_dir: whether this run made `output_dir` (removed if start-up
      fails).
    progress: `loop._Progress`, told of every evaluation.
  """
  with resume.removed_if_failed(output_dir, made_dir):
    store = checkpoints.CheckpointStore(
        output_dir, keep=settings.keep_checkpoints, sharded=True)
    lr_schedule = settings.lr_schedule_fn()
    trainer = ShardedTrainer(
        inputs.train_model, tl.WeightedCategoryCrossEntropy(),
        settings.optimizer(), lr_schedule, inputs.train_batch,
        seed=settings.random_seed, skip_non_finite=settings.skip_non_finite,
        gather_weights=settings.fsdp_gather_weights,
        eval_model=inputs.eval_model)
    loop = FsdpLoop(trainer, output_dir, store, inputs, settings)
    loop.restore()
  progress.attach(loop)
  steps = settings.steps
  if not resume.resume(loop, inputs.train_batches, steps, output_dir):
    return loop
  processes = (f', {jax.process_count()} processes'
               if distributed.is_multiprocess() else '')
  say(f'Training steps {loop.step + 1}..{steps} with FSDP over '
      f'{jax.device_count()} device(s){processes}, output in {output_dir}')
  loop.run(steps - loop.step, lr_schedule,
           on_eval=progress.report if not jax.process_index() else
           (lambda: None))
  return loop
