"""Start, resume or stop: what both trainers do around their steps.

`terraformer.train` runs Trax's Loop (`loop._CheckpointedLoop`) or, with
`weight_sharding = 'fsdp'`, `fsdp.FsdpLoop`; both start the same way:

- one trainer at a time: process 0 holds the output directory's lock
  (`run_lock`) from start to end, and a second trainer stops before writing;
- a failed start (bad config, model or data found while building the loop)
  removes the output directory if it made it (nothing of value was written);
- a restored checkpoint says how many train batches it had consumed: they are
  skipped, so training goes on with the data it would have seen;
- one line says where training resumes, or that it is already done.

What both do while they run: terraformer/training/run_state.py.
"""
import contextlib
import os
import shutil

from terraformer.distributed import say


@contextlib.contextmanager
def removed_if_failed(output_dir, fresh):
  """Removes `output_dir` if the block fails and `fresh`: this run made it
  (`run_lock.RunLock.made_dir`, on process 0, which owns it), so nothing of
  value is in it."""
  try:
    yield
  except BaseException:
    if fresh and os.path.isdir(output_dir):  # Nothing of value written yet.
      shutil.rmtree(output_dir)
    raise


def resume(loop, train_batches, steps, output_dir, init_checkpoint=None):
  """Skips the batches `loop`'s checkpoint consumed; says where it resumes.

  Returns False if `loop` has trained for `steps` already, else True.
  """
  for _ in range(loop.batches_consumed):  # Where the checkpoint's data was.
    next(train_batches)
  if loop.step:
    say(f'Resuming from checkpoint at step {loop.step} in {output_dir} '
        f'({loop.batches_consumed} train batches skipped)')
    if init_checkpoint:
      say(f'init_checkpoint {init_checkpoint} not loaded: resuming from the '
          'checkpoint in output_dir takes precedence')
  if loop.step >= steps:
    say(f'Already trained for {loop.step} >= {steps} steps.')
    return False
  return True

