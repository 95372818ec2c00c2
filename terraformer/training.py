"""Training and evaluation through `trax.supervised.training.Loop`.

`train` is gin-configurable as `terraformer.train` (a bare `train.` selector
is ambiguous: Trax registers `trax.supervised.trainer_lib.train` too). Loop
writes checkpoints (`model.pkl.gz`, ...) and TensorBoard event files
(`train/`, `eval/`) into `output_dir`, and resumes from the checkpoint there.
"""
import itertools
import os
import shutil
import time

import gin
import jax
import numpy as np
from trax import layers as tl
from trax import optimizers
from trax.supervised import callbacks as trax_callbacks
from trax.supervised import lr_schedules
from trax.supervised import training

from terraformer import compat
from terraformer import errors
from terraformer import finetune

compat.apply()  # Loop needs them (checkpoint restore, devices) outside CLIs.

# Eval metrics, by name; log_perplexity is the cross-entropy in nats/token.
EVAL_METRICS = ('loss', 'accuracy', 'log_perplexity')


def _eval_metric_layers():
  return [tl.WeightedCategoryCrossEntropy(), tl.WeightedCategoryAccuracy(),
          tl.WeightedCategoryCrossEntropy()]


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


def model_reference():
  """The gin reference bound to `terraformer.train.model` (e.g. @Terraformer)."""
  try:
    return gin.query_parameter('terraformer.train.model')
  except ValueError:
    raise errors.TerraformerError(
        'no model configured: bind terraformer.train.model') from None


def model_from_config():
  """The model function bound to `terraformer.train.model`."""
  ref = model_reference()
  return getattr(ref, 'scoped_configurable_fn', ref)


@gin.configurable(module='terraformer')
def train(output_dir,
          model=gin.REQUIRED,
          train_stream=gin.REQUIRED,
          eval_stream=gin.REQUIRED,
          steps=1000,
          optimizer=optimizers.Adam,
          lr_schedule_fn=lr_schedules.multifactor,
          eval_every=100,
          eval_batches=10,
          checkpoint_every=100,
          permanent_checkpoint_every=None,
          random_seed=None,
          use_memory_efficient_trainer=False,
          callbacks=(),
          init_checkpoint=None):
  """Trains `model` to `steps` total steps, resuming from `output_dir`.

  Args:
    output_dir: directory for checkpoints and TensorBoard event files; if it
      has a checkpoint, training continues from it.
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
    checkpoint_every: save `model.pkl.gz` every this many steps and at the end.
    permanent_checkpoint_every: also keep `model_{step}.pkl.gz` this often.
    random_seed: seed for weight init and rngs; None: from the clock.
    use_memory_efficient_trainer: Loop's memory-efficient trainer.
    callbacks: extra Loop callback classes (`TrainingStepCallback`).
    init_checkpoint: fine-tune from this checkpoint (a training output_dir or
      its `model.pkl.gz`): its weights initialize the model, the optimizer
      state and step start fresh (§4.4). Ignored when `output_dir` has its
      own checkpoint: resuming takes precedence.

  Returns:
    The `trax.supervised.training.Loop` after training (`.step`, `.history`,
    `.model`).
  """
  n_devices = jax.local_device_count()
  # Build model and data first: a config error must not leave files behind.
  train_model, eval_model = model(mode='train'), model(mode='eval')
  train_batch, train_batches = _first_batch(
      train_stream, 'train_stream', n_devices)
  eval_batch, eval_batches_it = _first_batch(
      eval_stream, 'eval_stream', n_devices)
  # Every evaluation sees the same `eval_batches` batches: comparable curves.
  eval_set = list(itertools.islice(eval_batches_it, eval_batches))
  eval_batches_it = itertools.cycle(eval_set)

  train_task = training.TrainTask(
      train_batches, tl.WeightedCategoryCrossEntropy(), optimizer(),
      lr_schedule=lr_schedule_fn(), n_steps_per_checkpoint=checkpoint_every,
      loss_name='loss', sample_batch=train_batch)
  eval_task = training.EvalTask(
      eval_batches_it, _eval_metric_layers(), metric_names=list(EVAL_METRICS),
      n_eval_batches=eval_batches, sample_batch=eval_batch)

  progress = _Progress(steps)
  output_dir = os.path.expanduser(output_dir)
  if init_checkpoint:
    finetune.checkpoint_file(init_checkpoint)  # Fail before writing anything.
  fresh = not os.path.exists(output_dir)
  try:
    loop = training.Loop(
        train_model, [train_task], eval_model=eval_model,
        eval_tasks=[eval_task], output_dir=output_dir,
        eval_at=lambda s: s == 1 or _every(eval_every, steps)(s),
        checkpoint_at=_every(checkpoint_every, steps),
        permanent_checkpoint_at=_every(permanent_checkpoint_every, None),
        random_seed=random_seed,
        use_memory_efficient_trainer=use_memory_efficient_trainer,
        callbacks=[progress.attach] + list(callbacks))
    if init_checkpoint and not loop.step:
      n_loaded = finetune.init_weights(loop, init_checkpoint)
      print(f'Fine-tuning from {init_checkpoint}: loaded {n_loaded} weight '
            'arrays (optimizer state and step start fresh)', flush=True)
  except BaseException:
    if fresh and os.path.isdir(output_dir):  # Nothing of value written yet.
      shutil.rmtree(output_dir)
    raise

  if loop.step:
    print(f'Resuming from checkpoint at step {loop.step} in {output_dir}',
          flush=True)
    if init_checkpoint:
      print(f'init_checkpoint {init_checkpoint} not loaded: resuming from the '
            'checkpoint in output_dir takes precedence', flush=True)
  if loop.step >= steps:
    print(f'Already trained for {loop.step} >= {steps} steps.', flush=True)
    return loop
  print(f'Training steps {loop.step + 1}..{steps} on {loop.n_devices} '
        f'device(s), output in {output_dir}', flush=True)
  loop.run(steps - loop.step)
  progress.report()
  return loop
