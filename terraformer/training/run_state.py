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
  evals (`EvalsBeforeCheckpoints`).
"""
import dataclasses
import math
from typing import Any

import numpy as np
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

