"""Shuffling and batching of example streams too large to hold in memory.

`streams.py` shuffles and batches whole epochs of the small offline corpus;
these helpers do the same for streams read from TFDS (C4, arXiv): a bounded
shuffle buffer, and batches of fixed-shape examples.

In a multi-process job a TFDS stream reads only its process's part of the
split (`tfds_text.texts(per_process=True)`) and `batched(per_process=True)`
yields `ProcessBatch`es of that process's rows of each global batch.
"""
import itertools

import numpy as np


class ProcessBatch(tuple):
  """A batch of this process's rows only (global batch size / processes),
  from data this process alone read: the trainer feeds it as it is, instead
  of taking this process's rows of a global batch."""


def process_batch_size(batch_size):
  """(rows per process, processes) of a global `batch_size`."""
  import jax  # pylint: disable=g-import-not-at-top
  from terraformer import distributed  # pylint: disable=g-import-not-at-top
  rows = distributed.process_rows(batch_size)
  return rows.stop - rows.start, jax.process_count()


def shuffled(examples, buffer_size, rng):
  """Yields `examples` in a random order, holding `buffer_size` of them.

  Each incoming example replaces a uniformly chosen one of the buffer, which
  is yielded; at the end the buffer is emptied in random order. With
  `buffer_size` <= 1 the order is unchanged.
  """
  if buffer_size <= 1:
    yield from examples
    return
  examples = iter(examples)
  buffer = list(itertools.islice(examples, buffer_size))
  for example in examples:
    i = rng.integers(len(buffer))
    yield buffer[i]
    buffer[i] = example
  for i in rng.permutation(len(buffer)):
    yield buffer[i]


def batched(examples, batch_size, per_process=False):
  """Yields batches (tuples of stacked arrays) of fixed-shape examples.

  An example is a tuple of numpy arrays; a batch stacks `batch_size` of them.
  A finite stream's last partial batch is filled with all-zero rows (zero
  weights), so every example is seen once with static shapes. With
  `per_process` in a multi-process job, `examples` are this process's part
  of the data and the batches `ProcessBatch`es of batch_size / processes
  rows.
  """
  wrap = tuple
  if per_process:
    local, processes = process_batch_size(batch_size)
    if processes > 1:
      batch_size, wrap = local, ProcessBatch
  examples = iter(examples)
  while True:
    rows = list(itertools.islice(examples, batch_size))
    if not rows:
      return
    batch = tuple(np.stack(column) for column in zip(*rows))
    missing = batch_size - len(rows)
    if missing:
      batch = tuple(
          np.concatenate([a, np.zeros((missing,) + a.shape[1:], a.dtype)])
          for a in batch)
    yield wrap(batch)
    if missing:
      return
