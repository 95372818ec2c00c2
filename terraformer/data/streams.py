"""Gin-configurable Trax input streams over the papers corpus.

Each stream function validates its arguments and tokenizes the split eagerly,
then returns a generator of `(inputs, targets, weights)` numpy batches. In gin
the function is passed uncalled, e.g. `train.train_stream = @train/lm_stream`.

Tokenizing the whole 250-paper corpus takes under a second, so tokens are not
cached on disk (only the SentencePiece model is).
"""
import logging

import gin
import numpy as np

from terraformer.data import aclsum_papers
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError


def _pad_to(ids, length):
  """Returns `ids` truncated/zero-padded to `length`, and its weights."""
  ids = np.asarray(ids[:length], np.int32)
  out = np.zeros(length, np.int32)
  out[:len(ids)] = ids
  weights = np.zeros(length, np.float32)
  weights[:len(ids)] = 1.0
  return out, weights


def _batches(make_epoch, batch_size, repeat):
  """Yields batches of the row-aligned arrays that `make_epoch()` returns.

  With `repeat`, loops forever and drops each epoch's last partial batch;
  without, makes one pass and pads the last batch with all-zero rows (zero
  weights), so every example is seen exactly once with static shapes.
  """
  while True:
    arrays = make_epoch()
    n = len(arrays[0])
    stop = n - n % batch_size if repeat else n
    for start in range(0, stop, batch_size):
      batch = tuple(a[start:start + batch_size] for a in arrays)
      missing = batch_size - len(batch[0])
      if missing:
        batch = tuple(
            np.concatenate([a, np.zeros((missing,) + a.shape[1:], a.dtype)])
            for a in batch)
      yield batch
    if not repeat:
      return


def _check_positive(**kwargs):
  for name, value in kwargs.items():
    if not isinstance(value, int) or value <= 0:
      raise TerraformerError(
          f'{name} must be a positive integer, got {value!r}')


def _check_enough(n_examples, batch_size, what, split):
  if n_examples < batch_size:
    raise TerraformerError(
        f'Split {split!r} has {n_examples} {what}, fewer than batch_size='
        f'{batch_size}; use a smaller batch_size or a larger corpus')


@gin.configurable(module='terraformer.data')
def lm_stream(split='train', seq_len=1024, batch_size=8, vocab_size=8000,
              vocab_path=None, papers_dir=None, seed=0, repeat=True,
              shuffle=None):
  """Returns a generator of packed language-model batches.

  Each paper (abstract, newline, body) is tokenized and followed by EOS; the
  documents are concatenated and cut into windows of `seq_len` tokens (the
  last one zero-padded). On shuffled splits, documents and windows are
  reshuffled every epoch.

  Args:
    split: 'train', 'validation' or 'test'.
    seq_len: tokens per example.
    batch_size: examples per batch.
    vocab_size: pieces of the SentencePiece model (must match it).
    vocab_path: a user SentencePiece model; default: the trained, cached one.
    papers_dir: S2ORC papers directory; default: aclsum's bundled papers.
    seed: shuffling seed.
    repeat: loop forever (True) or make one pass (False).
    shuffle: shuffle documents and windows; default: only for 'train'.

  Returns:
    A generator of `(inputs, targets, weights)`, each `(batch_size, seq_len)`,
    int32/int32/float32, with `inputs == targets` (models shift right) and
    weights 1 on tokens, 0 on padding.
  """
  _check_positive(seq_len=seq_len, batch_size=batch_size)
  vocab = vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)
  papers = aclsum_papers.load_split(split, papers_dir)
  docs = vocab.encode_batch(p['abstract'] + '\n' + p['body'] for p in papers)
  docs = [np.asarray(ids + [vocab.eos_id], np.int32) for ids in docs]
  n_tokens = sum(len(d) for d in docs)
  n_windows = -(-n_tokens // seq_len)
  _check_enough(n_windows, batch_size, f'windows of {seq_len} tokens', split)
  logging.info('lm_stream %s: %d papers, %d tokens, %d windows', split,
               len(papers), n_tokens, n_windows)
  shuffle = split == 'train' if shuffle is None else shuffle
  rng = np.random.default_rng(seed)

  def make_epoch():
    order = rng.permutation(len(docs)) if shuffle else range(len(docs))
    tokens = np.zeros(n_windows * seq_len, np.int32)
    tokens[:n_tokens] = np.concatenate([docs[i] for i in order])
    weights = (np.arange(n_windows * seq_len) < n_tokens).astype(np.float32)
    tokens = tokens.reshape(n_windows, seq_len)
    weights = weights.reshape(n_windows, seq_len)
    if shuffle:
      rows = rng.permutation(n_windows)
      tokens, weights = tokens[rows], weights[rows]
    return tokens, tokens, weights

  return _batches(make_epoch, batch_size, repeat)


@gin.configurable(module='terraformer.data')
def seq2seq_stream(split='train', input_len=1024, target_len=256,
                   batch_size=8, vocab_size=8000, vocab_path=None,
                   papers_dir=None, seed=0, repeat=True, shuffle=None):
  """Returns a generator of body -> abstract batches.

  Bodies and abstracts are tokenized, EOS is appended to each, then they are
  truncated and zero-padded to `input_len` / `target_len`.

  Args:
    split: 'train', 'validation' or 'test'.
    input_len: tokens per input (paper body).
    target_len: tokens per target (abstract).
    batch_size: examples per batch.
    vocab_size: pieces of the SentencePiece model (must match it).
    vocab_path: a user SentencePiece model; default: the trained, cached one.
    papers_dir: S2ORC papers directory; default: aclsum's bundled papers.
    seed: shuffling seed.
    repeat: loop forever (True) or make one pass (False).
    shuffle: shuffle examples every epoch; default: only for 'train'.

  Returns:
    A generator of `(inputs, targets, weights)`: inputs `(batch_size,
    input_len)` int32, targets and weights `(batch_size, target_len)`
    int32/float32, weights 1 on target tokens, 0 on padding.
  """
  _check_positive(input_len=input_len, target_len=target_len,
                  batch_size=batch_size)
  vocab = vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)
  papers = aclsum_papers.load_split(split, papers_dir)
  _check_enough(len(papers), batch_size, 'papers', split)
  eos = [vocab.eos_id]
  bodies = vocab.encode_batch(p['body'] for p in papers)
  abstracts = vocab.encode_batch(p['abstract'] for p in papers)
  inputs = np.stack([_pad_to(ids + eos, input_len)[0] for ids in bodies])
  targets, weights = (np.stack(a) for a in zip(
      *[_pad_to(ids + eos, target_len) for ids in abstracts]))
  logging.info('seq2seq_stream %s: %d papers, %.0f%% of targets truncated',
               split, len(papers),
               100 * np.mean([len(a) + 1 > target_len for a in abstracts]))
  shuffle = split == 'train' if shuffle is None else shuffle
  rng = np.random.default_rng(seed)

  def make_epoch():
    if not shuffle:
      return inputs, targets, weights
    rows = rng.permutation(len(papers))
    return inputs[rows], targets[rows], weights[rows]

  return _batches(make_epoch, batch_size, repeat)
