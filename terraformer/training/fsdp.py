"""FSDP training: `terraformer.train(weight_sharding='fsdp')`.

Trax's `Loop` (terraformer/training.py) keeps a whole copy of the weights and
optimizer slots on every device, so it trains only what fits on one device.
With `weight_sharding = 'fsdp'` the steps are `distributed.ShardedTrainer`'s
instead: every weight and optimizer slot split over all devices of all
processes (initialized already sharded), the global batch split over the same
mesh axis. This loop does around it what `_CheckpointedLoop` does around
Trax's steps, in the same files and names:

- evaluations at step 1, every `eval_every` steps and at the end, on the same
  `eval_batches` batches, with the eval model (Loop's `run_evals`: training
  weights and state): `metrics/loss`, `metrics/accuracy`,
  `metrics/log_perplexity`; for training `metrics/loss` (mean since the last
  eval), `training/learning_rate`, `training/steps per second`,
  `training/gradients_l2`, `training/weights_l2`. They go into a Trax
  `History` and TensorBoard event files (`train/`, `eval/`) written by
  process 0, with `config.gin`; the metrics are those of the global batch;
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
import shutil
import time

import gin
import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
from trax import jaxboard
from trax import layers as tl
from trax import shapes
from trax.supervised import history as trax_history

from terraformer import checkpoints
from terraformer import distributed
from terraformer import errors
from terraformer import supervisor

def _log(step, message):
  """A Trax-style log line (`Step      N: ...`), process 0 only."""
  if not jax.process_index():
    print(f'Step {step:6d}: {message}', flush=True)


def new_since_eval():
  """Sums of the train metrics of the steps since the last eval (JSON, in
  checkpoint meta; used by FsdpLoop and training._CheckpointedLoop)."""
  return {'loss': 0.0, 'steps': 0, 'stats': {}}


def add_to_since_eval(since_eval, loss, stats):
  """Adds one step's loss and optimizer stats (means over devices)."""
  since_eval['loss'] += float(np.mean(np.asarray(loss)))
  since_eval['steps'] += 1
  for name, value in stats.items():
    since_eval['stats'][name] = (since_eval['stats'].get(name, 0.0)
                                 + float(np.mean(np.asarray(value))))


class FsdpLoop:
  """Training of a `ShardedTrainer` with evals, events and checkpoints.

  Has what callers use of Trax's Loop after training: `step`, `history`.
  """

  def __init__(self, trainer, output_dir, store, train_batches, eval_set,
               metric_layers, metric_names, input_signature,
               write_model_pkl=True, skip_non_finite=False):
    self.trainer = trainer
    self.step = 0
    self.history = trax_history.History()
    self.batches_consumed = 0
    self.skipped_steps = 0
    self.since_eval = new_since_eval()
    self._output_dir = output_dir
    self._store = store
    self._train_batches = train_batches
    self._eval_set = eval_set
    self._metric_layers = metric_layers
    self._metric_names = metric_names
    self._input_signature = input_signature
    self._write_model_pkl = write_model_pkl
    self._skip_non_finite = skip_non_finite
    self._chief = not jax.process_index()
    self._writers = None

  # Checkpoints.

  def _trees(self):
    # eval_state: Loop's name for the eval model's state, which Loop's evals
    # never use (they take the training state); the training state here, so
    # that a run can switch weight_sharding and resume.
    return {'weights': self.trainer.weights, 'state': self.trainer.state,
            'eval_state': self.trainer.state, 'slots0': self.trainer.slots}

  def _arrays(self, convert=lambda x: x):
    arrays = {f'{part}_{j:05d}': convert(leaf)
              for part, tree in self._trees().items()
              for j, leaf in enumerate(jax.tree_util.tree_leaves(tree))}
    # The same on every process, and local to each: saved as numpy.
    arrays['rng'] = convert(np.asarray(self.trainer.rng))
    return arrays

  def restore(self):
    """Resumes from the newest verified checkpoint; returns its step or 0."""
    replicated = NamedSharding(self.trainer.mesh, PartitionSpec())
    wanted = self._arrays(lambda x: (x.shape, x.dtype, getattr(
        x, 'sharding', replicated)))
    wanted['rng'] = wanted['rng'][:2] + (replicated,)
    restored = self._store.restore(wanted)
    if restored is None:
      return 0
    step, arrays, meta = restored
    trees = {}
    for part, tree in self._trees().items():
      n = len(jax.tree_util.tree_leaves(tree))
      trees[part] = jax.tree_util.tree_unflatten(
          jax.tree_util.tree_structure(tree),
          [arrays[f'{part}_{j:05d}'] for j in range(n)])
    self.trainer.weights = trees['weights']
    self.trainer.state = trees['state']
    self.trainer.slots = trees['slots0']
    self.trainer.rng = jax.numpy.asarray(np.asarray(arrays['rng']))
    self.trainer.step = self.step = step
    self.batches_consumed = meta['batches_consumed']
    self.skipped_steps = meta['skipped_steps']
    self.history = trax_history.History.from_dict(meta['history'])
    self.since_eval = meta.get('since_eval', new_since_eval())
    return step

  def save_checkpoint(self, basename='model'):
    """Commits the sharded checkpoint (with basename 'model') and writes
    `{basename}.pkl.gz`; every process stops if either fails anywhere."""
    if basename == 'model':
      self._store.save(self.step, self._arrays(), {
          'step': self.step, 'batches_consumed': self.batches_consumed,
          'skipped_steps': self.skipped_steps,
          'history': self.history.to_dict(), 'since_eval': self.since_eval})
    if not self._write_model_pkl:
      return
    weights = self.trainer.gathered(self.trainer.weights)
    state = self.trainer.gathered(self.trainer.state)
    error = None
    if self._chief:
      flat_weights, flat_state = tl.flatten_weights_and_state(weights, state)
      path = os.path.join(self._output_dir, f'{basename}.pkl.gz')
      try:
        checkpoints.write_trax_checkpoint(path, {
            'step': self.step, 'flat_weights': flat_weights,
            'flat_state': flat_state, 'flat_eval_state': flat_state,
            'history': self.history.to_dict(), 'slots_per_task': [],
            'input_signature': self._input_signature,
            'version_timestamp': 'Mar-10-2021'})
      except OSError as e:
        error = (f'cannot write {basename}.pkl.gz in {self._output_dir} ('
                 f'{"disk full" if checkpoints.is_disk_full(e) else e}); '
                 'partial file removed, the previous one kept')
    error = distributed.broadcast_json(error)
    if error:
      raise errors.TerraformerError(
          error if self._chief else f'process 0: {error}')

  # Metrics.

  def _summaries(self, mode, values, prefix, stdout=True):
    """Loop.log_summary: history, TensorBoard (process 0), log lines."""
    writer = self._writers[mode] if self._writers else None
    width = max(len(name) for name in ['loss'] + self._metric_names)
    for name, value in values.items():
      if stdout:
        _log(self.step, f'{mode.ljust(5)} {name.rjust(width)} | {value: .8f}')
      if writer is not None:
        writer.scalar(prefix + name, value, self.step)
      self.history.append(mode, prefix + name, self.step, value)
    if writer is not None:
      writer.flush()

  def run_evals(self):
    sums = np.zeros(len(self._metric_names))
    for batch in self._eval_set:
      sums += self.trainer.evaluate(batch, self._metric_layers)
    self._summaries('eval', dict(zip(
        self._metric_names, sums / len(self._eval_set))), 'metrics/')

  def _save_gin(self):
    if not self._chief:
      return
    config = gin.operative_config_str()
    with open(os.path.join(self._output_dir, 'config.gin'), 'w') as f:
      f.write(config)
    self._writers['train'].text(
        'gin_config', jaxboard.markdownify_operative_config_str(config))

  # Training.

  def _train_one_step(self):
    loss = self.trainer.train_step(next(self._train_batches))
    self.batches_consumed += 1
    supervisor.report('step', self.step)  # For the one line of a peer death.
    stats = self.trainer.last_stats
    bad = next(((name, value) for name, value in (
        ('loss', loss), ('gradient norm', stats['gradients_l2']))
                if not np.isfinite(value)), None)
    if bad and not self._skip_non_finite:
      steps = self._store.steps()
      raise errors.TerraformerError(
          f'non-finite {bad[0]} ({bad[1]}) at step {self.step}: training '
          'stopped, nothing saved for this step; last checkpoint: '
          f'{f"step {steps[0]}" if steps else "none"}')
    if bad:  # The jitted step kept the weights and slots of before it.
      self.skipped_steps += 1
      if self._chief:
        print(f'Skipped step {self.step}: non-finite {bad[0]} ({bad[1]}); '
              f'{self.skipped_steps} skipped so far', flush=True)
    return loss, stats

  def run(self, n_steps, lr_schedule, eval_at, checkpoint_at,
          permanent_checkpoint_at, on_eval):
    """Trains `n_steps` more steps: each step, its evals, its checkpoints.

    Evals before checkpoints (Trax's Loop.run saves first; `_Checkpointed
    Loop` defers its saves the same way): evaluating draws from the rng, so
    the checkpoint must hold the rng of after the evals for a resumed run to
    draw what the uninterrupted one does (issue 23). A crash during the
    evals resumes from the checkpoint before.
    """
    if self._chief:
      self._writers = {mode: jaxboard.SummaryWriter(
          os.path.join(self._output_dir, mode)) for mode in ('train', 'eval')}
    try:
      start, steps_run = time.time(), 0
      for _ in range(n_steps):
        self.step += 1
        steps_run += 1
        loss, stats = self._train_one_step()
        if np.isfinite(loss):
          add_to_since_eval(self.since_eval, loss, stats)
        if eval_at(self.step):
          elapsed = time.time() - start
          sums, self.since_eval = self.since_eval, new_since_eval()
          n = max(sums['steps'], 1)
          _log(self.step,
               f'Ran {sums["steps"]} train steps in {elapsed:0.2f} secs')
          self._summaries('train', {'loss': sums['loss'] / n}, 'metrics/')
          if self.step == 1:
            self._save_gin()
          self._summaries('train', dict(
              {'learning_rate': float(lr_schedule(self.step)),
               'steps per second': steps_run / max(elapsed, 1e-9)},
              **{k: v / n for k, v in sums['stats'].items()}),
                          'training/', stdout=False)
          self.run_evals()
          on_eval()
          start, steps_run = time.time(), 0
        if checkpoint_at(self.step):
          self.save_checkpoint('model')
        if permanent_checkpoint_at(self.step):
          self.save_checkpoint(f'model_{self.step}')
    finally:
      if self._writers:
        for writer in self._writers.values():
          writer.close()


def train_fsdp(output_dir, train_model, eval_model, train_batch,
               train_batches, eval_set, steps, optimizer, lr_schedule,
               random_seed, keep_checkpoints, skip_non_finite,
               write_model_pkl, gather_weights, eval_at, checkpoint_at,
               permanent_checkpoint_at, metric_layers, metric_names,
               progress, say):
  """Trains to `steps` with FSDP (module docstring); `terraformer.train`'s
  arguments, already checked and built. Returns the `FsdpLoop`."""
  fresh = not jax.process_index() and not os.path.exists(output_dir)
  try:
    store = checkpoints.CheckpointStore(output_dir, keep=keep_checkpoints,
                                        sharded=True)
    trainer = distributed.ShardedTrainer(
        train_model, tl.WeightedCategoryCrossEntropy(), optimizer,
        lr_schedule, train_batch, seed=random_seed,
        skip_non_finite=skip_non_finite, gather_weights=gather_weights,
        eval_model=eval_model)
    n_in = train_model.n_in
    loop = FsdpLoop(trainer, output_dir, store, train_batches, eval_set,
                    metric_layers, metric_names,
                    shapes.signature(tuple(train_batch))[:n_in],
                    write_model_pkl=write_model_pkl,
                    skip_non_finite=skip_non_finite)
    loop.restore()
  except BaseException:
    if fresh and os.path.isdir(output_dir):  # Nothing of value written yet.
      shutil.rmtree(output_dir)
    raise
  for _ in range(loop.batches_consumed):  # Where the checkpoint's data was.
    next(train_batches)
  progress.attach(loop)
  if loop.step:
    say(f'Resuming from checkpoint at step {loop.step} in {output_dir} '
        f'({loop.batches_consumed} train batches skipped)')
  if loop.step >= steps:
    say(f'Already trained for {loop.step} >= {steps} steps.')
    return loop
  processes = (f', {jax.process_count()} processes'
               if distributed.is_multiprocess() else '')
  say(f'Training steps {loop.step + 1}..{steps} with FSDP over '
      f'{jax.device_count()} device(s){processes}, output in {output_dir}')
  loop.run(steps - loop.step, lr_schedule, eval_at, checkpoint_at,
           permanent_checkpoint_at,
           on_eval=progress.report if not jax.process_index() else
           (lambda: None))
  return loop
