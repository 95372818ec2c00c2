"""Tests for terraformer.data.streams."""
import itertools

import gin
import numpy as np
import pytest

from terraformer.data import aclsum_papers
from terraformer.data import streams
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError
import synthetic_papers

V = synthetic_papers.VOCAB_SIZE


@pytest.fixture
def vocab(shared_cache_dir, papers_dir):
  return vocab_lib.get_vocab(V, papers_dir=papers_dir)


def _lm(papers_dir, **kwargs):
  kwargs = dict(dict(seq_len=16, batch_size=4, vocab_size=V), **kwargs)
  return streams.lm_stream(papers_dir=papers_dir, **kwargs)


def _s2s(papers_dir, **kwargs):
  kwargs = dict(dict(input_len=32, target_len=24, batch_size=2,
                     vocab_size=V), **kwargs)
  return streams.seq2seq_stream(papers_dir=papers_dir, **kwargs)


def _lm_documents(vocab, papers_dir, split):
  """The expected token stream: each paper's tokens, then EOS, in order."""
  papers = aclsum_papers.load_split(split, papers_dir)
  return [vocab.encode(p['abstract'] + '\n' + p['body']) + [vocab.eos_id]
          for p in papers]


def _check_batch(batch, shapes):
  assert len(batch) == 3
  for array, shape, dtype in zip(batch, shapes,
                                 (np.int32, np.int32, np.float32)):
    assert array.shape == shape and array.dtype == dtype


def test_lm_batches_shapes_dtypes_and_inputs_equal_targets(vocab, papers_dir):
  for batch in itertools.islice(_lm(papers_dir), 5):
    _check_batch(batch, [(4, 16)] * 3)
    inputs, targets, weights = batch
    np.testing.assert_array_equal(inputs, targets)
    assert set(np.unique(weights)) <= {0.0, 1.0}


def test_lm_one_pass_packs_documents_in_order_with_eos(vocab, papers_dir):
  split = 'validation'
  batches = list(_lm(papers_dir, split=split, repeat=False))
  expected = np.concatenate(_lm_documents(vocab, papers_dir, split))
  inputs = np.concatenate([b[0] for b in batches]).reshape(-1)
  weights = np.concatenate([b[2] for b in batches]).reshape(-1)
  n_windows = -(-len(expected) // 16)
  assert len(batches) == -(-n_windows // 4)
  # Weights are one exactly on the real tokens, which come first, in order.
  np.testing.assert_array_equal(weights,
                                np.arange(len(weights)) < len(expected))
  np.testing.assert_array_equal(inputs[:len(expected)], expected)
  assert not inputs[len(expected):].any()
  n_docs = len(aclsum_papers.load_split(split, papers_dir))
  assert np.sum(expected == vocab.eos_id) == n_docs


def test_lm_shuffled_epochs_are_seeded_permutations(vocab, papers_dir):
  unshuffled = np.concatenate(_lm_documents(vocab, papers_dir, 'train'))
  n_batches = (-(-len(unshuffled) // 16)) // 4  # Full batches per epoch.

  def epochs(seed):
    stream = _lm(papers_dir, seed=seed)
    return [list(itertools.islice(stream, n_batches)) for _ in range(2)]

  def tokens(epoch):
    return np.concatenate([b[0][b[2] > 0] for b in epoch])

  first, second = epochs(0)
  same_seed, _ = epochs(0)
  other_seed, _ = epochs(1)
  for a, b in zip(first, same_seed):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  assert not np.array_equal(tokens(first), tokens(second))
  assert not np.array_equal(tokens(first), tokens(other_seed))
  assert not np.array_equal(tokens(first), unshuffled[:len(tokens(first))])
  # Each shuffled epoch holds the same tokens (minus at most one partial batch).
  for epoch in (first, second, other_seed):
    assert len(tokens(epoch)) > len(unshuffled) - 4 * 16
    counts = np.bincount(tokens(epoch), minlength=V)
    assert np.all(counts <= np.bincount(unshuffled, minlength=V))


def test_lm_repeat_is_infinite_and_one_pass_is_not(vocab, papers_dir):
  n = sum(1 for _ in _lm(papers_dir, repeat=False))
  assert len(list(itertools.islice(_lm(papers_dir), 3 * n + 1))) == 3 * n + 1


def test_seq2seq_batches_truncate_pad_and_weight_targets(vocab, papers_dir):
  split = 'test'
  papers = aclsum_papers.load_split(split, papers_dir)
  batches = list(_s2s(papers_dir, split=split, repeat=False))
  assert len(batches) == 1
  _check_batch(batches[0], [(2, 32), (2, 24), (2, 24)])
  inputs, targets, weights = batches[0]
  for i, p in enumerate(papers):
    body = (vocab.encode(p['body']) + [vocab.eos_id])[:32]
    abstract = (vocab.encode(p['abstract']) + [vocab.eos_id])[:24]
    np.testing.assert_array_equal(inputs[i, :len(body)], body)
    assert not inputs[i, len(body):].any()
    np.testing.assert_array_equal(targets[i, :len(abstract)], abstract)
    assert not targets[i, len(abstract):].any()
    np.testing.assert_array_equal(weights[i], np.arange(24) < len(abstract))


def test_seq2seq_eos_ends_targets_that_fit(vocab, papers_dir):
  (_, targets, weights), = _s2s(papers_dir, split='test', repeat=False,
                                target_len=512)
  lengths = weights.sum(axis=1).astype(int)
  assert (lengths < 512).all()
  np.testing.assert_array_equal(targets[np.arange(2), lengths - 1],
                                [vocab.eos_id] * 2)


def test_seq2seq_one_pass_pads_last_batch_with_zero_weight_rows(
    vocab, papers_dir):
  batches = list(_s2s(papers_dir, split='train', batch_size=3, repeat=False))
  n_train = synthetic_papers.SPLIT_COUNTS['train']
  assert len(batches) == -(-n_train // 3)
  rows_with_weight = sum(int((b[2].sum(axis=1) > 0).sum()) for b in batches)
  assert rows_with_weight == n_train
  last = batches[-1]
  assert not last[0][n_train % 3:].any() and not last[2][n_train % 3:].any()


def test_seq2seq_shuffle_is_seeded_and_covers_each_epoch(vocab, papers_dir):
  n = synthetic_papers.SPLIT_COUNTS['train']

  def epochs(seed):
    stream = _s2s(papers_dir, batch_size=n, seed=seed)
    return next(stream)[1], next(stream)[1]

  ordered = next(_s2s(papers_dir, batch_size=n, shuffle=False))[1]
  first, second = epochs(0)
  np.testing.assert_array_equal(first, epochs(0)[0])
  assert not np.array_equal(first, second)
  assert not np.array_equal(first, epochs(1)[0])
  for epoch in (first, second):
    assert sorted(map(bytes, epoch)) == sorted(map(bytes, ordered))


def test_errors_are_raised_when_called_not_when_iterated(vocab, papers_dir):
  with pytest.raises(TerraformerError, match='batch_size'):
    _lm(papers_dir, split='validation', seq_len=1024, batch_size=8)
  with pytest.raises(TerraformerError, match='batch_size'):
    _s2s(papers_dir, split='test', batch_size=3)
  with pytest.raises(TerraformerError, match='vocab_size'):
    _lm(papers_dir, vocab_size=V + 1, vocab_path=vocab.path)
  with pytest.raises(TerraformerError, match='seq_len'):
    _lm(papers_dir, seq_len=0)


def test_empty_split_raises(shared_cache_dir, tmp_path):
  papers_dir = synthetic_papers.make_corpus(
      tmp_path, {'train': 6, 'validation': 0, 'test': 1})
  for make in (_lm, _s2s):
    with pytest.raises(TerraformerError, match="'validation'.*empty"):
      make(papers_dir, split='validation')


def test_gin_scoped_reference_calls_stream_with_bindings(vocab, papers_dir):
  @gin.configurable('consumer', module='tests_data')
  def consumer(stream=None):
    return stream

  try:
    gin.parse_config(f"""
        tests_data.consumer.stream = @train/terraformer.data.lm_stream
        train/lm_stream.seq_len = 8
        train/lm_stream.batch_size = 3
        lm_stream.vocab_size = {V}
        lm_stream.papers_dir = '{papers_dir}'
    """)
    stream_fn = consumer()
    inputs, _, _ = next(stream_fn())
    assert inputs.shape == (3, 8)
  finally:
    gin.clear_config()


def test_lm_shuffle_permutes_windows_within_an_epoch(vocab, tmp_path):
  # One training paper: document shuffling is a no-op, windows must move.
  papers_dir = synthetic_papers.make_corpus(
      tmp_path, {'train': 1, 'validation': 0, 'test': 0})
  kwargs = dict(seq_len=16, batch_size=1, vocab_path=vocab.path)
  packed = [b[0][0] for b in _lm(papers_dir, repeat=False, shuffle=False,
                                 **kwargs)]
  epoch = [b[0][0] for b in itertools.islice(_lm(papers_dir, **kwargs),
                                              len(packed))]
  assert len(packed) > 5
  assert sorted(map(bytes, epoch)) == sorted(map(bytes, packed))
  assert [bytes(w) for w in epoch] != [bytes(w) for w in packed]
