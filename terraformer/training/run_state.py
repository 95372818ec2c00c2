"""What both trainers keep about a run besides its arrays, and its guards.

`terraformer.train` runs Trax's Loop (`loop._CheckpointedLoop`, replicated
weights) or, with `weight_sharding = 'fsdp'`, `fsdp.FsdpLoop`. Both:

- start from the same `Inputs` (model and data, built and checked before
  anything is written);
- evaluate the same metrics (`EVAL_METRICS`);
- count, and checkpoint in their JSON meta, where the run stands
  (`RunCounters`: the train batches consumed, the non-finite steps skipped,
  the train metric sums since the last eval), so that a run can switch
  `weight_sharding` and resume (array names: `terraformer.checkpoint.layout`);
- stop at the first non-finite loss or gradient norm with one line, or with
  `skip_non_finite` count the step as skipped (`RunCounters.check_step`);
- stop on every process when process 0 could not do what it alone does
  (`stop_together`);
- end a step as Trax's `Loop.run` orders it, its checkpoints saved after its
  evals (`EvalsBeforeCheckpoints`);
- log the same summaries, lines and `config.gin` (`RunLog`).
"""
import dataclasses
import math
import os
from typing import Any

import gin
import numpy as np
from trax import jaxboard
from trax import layers as tl
from trax.supervised import history as trax_history

from terraformer import distributed
from terraformer import errors
from terraformer import supervisor
from terraformer.distributed import say

# Eval metrics, by name; log_perplexity is the cross-entropy in nats/token.
EVAL_METRICS = ('loss', 'accuracy', 'log_perplexity')


def eval_metric_layers():
  """The layers computing `EVAL_METRICS`, in order."""
  return [tl.WeightedCategoryCrossEntropy(), tl.WeightedCategoryAccuracy(),
          tl.WeightedCategoryCrossEntropy()]


@dataclasses.dataclass(frozen=True)
class Inputs:
  """A run's models and data, built and checked before anything is written.

  `train_batches` iterates over all train batches (`train_batch` first);
  `eval_set` holds the eval batches every evaluation averages over.
  """
  train_model: Any
  eval_model: Any
  train_batch: Any
  train_batches: Any
  eval_batch: Any
  eval_set: list


def new_since_eval():
  """Sums of the train metrics of the steps since the last eval (JSON, in
  checkpoint meta)."""
  return {'loss': 0.0, 'steps': 0, 'stats': {}}


def add_to_since_eval(since_eval, loss, stats):
  """Adds one step's loss and optimizer stats (means over devices)."""
  since_eval['loss'] += float(np.mean(np.asarray(loss)))
  since_eval['steps'] += 1
  for name, value in stats.items():
    since_eval['stats'][name] = (since_eval['stats'].get(name, 0.0)
                                 + float(np.mean(np.asarray(value))))


def first_non_finite(loss, stats):
  """(name, value) of the first non-finite of loss and gradient norm
  (Trax's optimizer stat `gradients_l2`), or None."""
  for name, value in (('loss', loss),
                      ('gradient norm', stats.get('gradients_l2'))):
    if value is not None and not math.isfinite(float(np.mean(value))):
      return name, float(np.mean(value))
  return None


def stop_together(error, chief):
  """Raises process 0's one-line `error` (None: nothing failed) on every
  process, so that all stop together where process 0 alone reads or writes
  `output_dir`; the others' lines say it was process 0's."""
  error = distributed.broadcast_json(error)
  if error:
    raise errors.TerraformerError(error if chief else f'process 0: {error}')


class RunCounters:
  """Where a run stands besides its step: mixed into both loops.

  `batches_consumed`: train batches used (the data stream's position);
  `skipped_steps`: non-finite steps skipped (`skip_non_finite`);
  `since_eval`: train metric sums since the last eval. All three are in the
  checkpoint meta, with the step and Trax's `History`.
  """

  def reset_counters(self):
    self.batches_consumed = 0
    self.skipped_steps = 0
    self.since_eval = new_since_eval()

  def position_meta(self, step, history):
    """The JSON meta of a checkpoint at `step` (`history`: Trax's)."""
    return {'step': step, 'batches_consumed': self.batches_consumed,
            'skipped_steps': self.skipped_steps,
            'history': history.to_dict(), 'since_eval': self.since_eval}

  def set_counters(self, meta):
    """Sets the counters from `position_meta`'s dict; returns its Trax
    `History`."""
    self.batches_consumed = meta['batches_consumed']
    self.skipped_steps = meta['skipped_steps']
    self.since_eval = meta.get('since_eval', new_since_eval())
    return trax_history.History.from_dict(meta['history'])

  def take_since_eval(self):
    """The sums of `since_eval`, which start again from 0 (at a train log)."""
    sums, self.since_eval = self.since_eval, new_since_eval()
    return sums

  def count_step(self, step):
    """Counts step `step`'s train batch as consumed and tells the supervisor
    (for the one line of a peer's death)."""
    self.batches_consumed += 1
    supervisor.report('step', step)

  def check_step(self, step, loss, stats, skip_non_finite, store):
    """The NaN guard of step `step` (`loss`, `stats`: the same on every
    process).

    A finite step's metrics are added to `since_eval`; returns None. A
    non-finite loss or gradient norm stops training with one line (nothing
    is saved for the step) or, with `skip_non_finite`, is counted and
    reported; returns its (name, value), for the caller to undo the step.
    `store`: the `CheckpointStore` (None where process 0 holds it), for the
    last checkpoint's step.
    """
    bad = first_non_finite(loss, stats)
    if bad is None:
      add_to_since_eval(self.since_eval, loss, stats)
      return None
    if not skip_non_finite:
      if store is None:
        last = "process 0's"
      else:
        steps = store.steps()
        last = f'step {steps[0]}' if steps else 'none'
      raise errors.TerraformerError(
          f'non-finite {bad[0]} ({bad[1]}) at step {step}: training '
          f'stopped, nothing saved for this step; last checkpoint: {last}')
    self.skipped_steps += 1
    say(f'Skipped step {step}: non-finite {bad[0]} ({bad[1]}); '
        f'{self.skipped_steps} skipped so far')
    return bad


class EvalsBeforeCheckpoints:
  """Saves a step's checkpoints after the step's evals, in both loops.

  Trax's `Loop.run` asks for a step's checkpoints before its evals, which
  draw from the loop's rng (`new_rng` per eval batch): a checkpoint taken
  there would hold the rng of before the evals, and a run resumed from it
  would draw other numbers (sparse FF noise, dropout) than the uninterrupted
  run does. A save asked for at a step whose evals are still to come waits
  for them (`evals_done`): checkpoint and history then include the step's
  evals; a crash during them resumes from the checkpoint before.

  `eval_at(step)`: whether `step` has evals; `save_now(basename)`: saves.
  """

  def __init__(self, eval_at, save_now):
    self._eval_at = eval_at
    self._save_now = save_now
    self._evals_done_at = None  # Step of the last `evals_done`.
    self._waiting = []  # Basenames waiting for this step's evals.

  def save(self, step, basename):
    """Saves checkpoint `basename` at `step`: now, or after its evals."""
    if self._evals_done_at != step and self._eval_at(step):
      self._waiting.append(basename)
    else:
      self._save_now(basename)

  def evals_done(self, step):
    """The evals of `step` are recorded: saves what waited for them."""
    self._evals_done_at = step
    waiting, self._waiting = self._waiting, []
    for basename in waiting:
      self._save_now(basename)


# Column of the metric names in the log lines: Trax's Loop's (the loss and
# eval metric names of both loops).
_NAME_WIDTH = max(map(len, ('loss',) + EVAL_METRICS))


def _say_stdout(line, stdout=True):
  if stdout:
    say(line)


class RunLog:
  """What both loops log: summaries, lines and `config.gin`.

  `summary` is Trax's `Loop.log_summary`, `train` its
  `Loop._log_training_progress` (from `RunCounters.since_eval`), and
  `config.gin` is written as Trax's `Loop._save_gin` writes it, at step 1
  and at a resumed run's first train log if its bindings changed
  (`retire_stale_config_gin`).

  `output_dir`: where `config.gin` goes; None on a process that writes no
  files (no events either). `log(line, stdout)`: how a line is logged
  (default: `say`, the stdout ones); Trax's Loop: its `_log`. `mean`: the
  means of a list of values over all processes, for metrics that are a
  process's own (Trax's Loop over several processes); None: they are the
  global batch's already.
  """

  def __init__(self, output_dir, log=_say_stdout, mean=None):
    self._output_dir = output_dir
    self._log = log
    self._mean = mean
    self._resumed_at = 0  # Step a run resumed from, until its first log.

  def started(self, step):
    """A run starts at `step` (0: from scratch)."""
    self._resumed_at = step

  def summary(self, history, step, values, writer, value_prefix, mode,
              stdout=True):
    """Per value of `values` (name -> value) at `step`: a line (`stdout`),
    a TensorBoard scalar or image (`writer`, None: no events) and an entry
    of the Trax `history` under `mode`."""
    names = [name for name, value in values.items() if not np.ndim(value)]
    if self._mean is not None and names:
      means = self._mean([values[name] for name in names])
      values = dict(values, **{n: float(m) for n, m in zip(names, means)})
    if self._output_dir is None:
      writer = None
    for name, value in values.items():
      if not np.ndim(value):
        self._log(f'Step {step: 6d}: {mode.ljust(5)} '
                  f'{name.rjust(_NAME_WIDTH)} | {value: .8f}', stdout=stdout)
        if writer is not None:
          writer.scalar(value_prefix + name, value, step)
      elif writer is not None:
        writer.image(value_prefix + name, value, step)
      history.append(mode, value_prefix + name, step, value)
    if writer is not None:
      writer.flush()

  def train(self, history, step, writer, since_eval, elapsed, learning_rate,
            steps_per_second):
    """The train log of an eval step: the steps run since the last eval and
    their time (`elapsed` seconds), their mean loss (`metrics/loss`),
    `config.gin`, then `learning_rate`, `steps_per_second` and the means of
    the optimizer stats (`training/`, on no line). `since_eval`:
    `RunCounters.take_since_eval()` (skipped steps left out)."""
    n = max(since_eval['steps'], 1)
    self._log(f'Step {step: 6d}: Ran {since_eval["steps"]} train steps in '
              f'{elapsed:0.2f} secs', stdout=True)
    self.summary(history, step, {'loss': since_eval['loss'] / n}, writer,
                 'metrics/', 'train')
    resumed_at, self._resumed_at = self._resumed_at, 0
    if self._output_dir is not None and (step == 1 or (
        resumed_at and retire_stale_config_gin(self._output_dir, resumed_at))):
      save_config_gin(self._output_dir, writer)
    stats = {name: value / n for name, value in since_eval['stats'].items()}
    self.summary(history, step, dict(
        {'learning_rate': learning_rate, 'steps per second': steps_per_second},
        **stats), writer, 'training/', 'train', stdout=False)


def save_config_gin(output_dir, writer):
  """Writes the operative gin config to `output_dir`/config.gin and, as
  text 'gin_config', to `writer` (None: not)."""
  config = gin.operative_config_str()
  with open(os.path.join(output_dir, 'config.gin'), 'w') as f:
    f.write(config)
  if writer is not None:
    writer.text('gin_config', jaxboard.markdownify_operative_config_str(config))


def retire_stale_config_gin(output_dir, resumed_from):
  """Renames a stale `config.gin`; returns whether to (re)write it.

  Both loops write `config.gin` after step 1 only, so a run resumed with
  other bindings (a curriculum's next stage, another learning rate) would
  keep its first start's. True when it is missing or differs from the
  operative config; a differing one is first renamed
  `config.until_step_N.gin` (N = `resumed_from`), with one line saying so.
  """
  path = os.path.join(output_dir, 'config.gin')
  if not os.path.exists(path):
    return True
  with open(path) as f:
    if f.read() == gin.operative_config_str():
      return False
  kept = os.path.join(output_dir, f'config.until_step_{resumed_from}.gin')
  os.replace(path, kept)
  say(f'Bindings changed since step {resumed_from}: config.gin rewritten, the '
      f'earlier one kept as {kept}')
  return True
