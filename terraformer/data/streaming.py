"""Shuffling and batching of example streams too large to hold in memory.

`streams.py` shuffles and batches whole epochs of the small offline corpus;
these helpers do the same for streams read from TFDS (C4, arXiv): a bounded
shuffle buffer, and batches of fixed-shape examples.
"""
import itertools

import numpy as np


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


def batched(examples, batch_size):
  """Yields batches (tuples of stacked arrays) of fixed-shape examples.

  An example is a tuple of numpy arrays; a batch stacks `batch_size` of them.
  A finite stream's last partial batch is filled with all-zero rows (zero
  weights), so every example is seen once with static shapes.
  """
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
    yield batch
    if missing:
      return
