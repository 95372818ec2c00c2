"""End to end on the real aclsum papers: load, split, train vocab, batches."""
import numpy as np

from terraformer.data import aclsum_papers
from terraformer.data import streams
from terraformer.data import vocab as vocab_lib


def test_real_corpus_end_to_end(cache_dir):
  papers = aclsum_papers.load_papers()
  assert len(papers) == 250
  assert all(p['body'] and p['abstract'] for p in papers)
  assert len({p['id'] for p in papers}) == 250
  splits = {s: {p['id'] for p in aclsum_papers.load_split(s)}
            for s in aclsum_papers.SPLITS}
  assert not (splits['train'] & splits['validation'])
  assert not (splits['train'] & splits['test'])
  assert not (splits['validation'] & splits['test'])
  assert set().union(*splits.values()) == {p['id'] for p in papers}
  assert 180 <= len(splits['train']) <= 220
  assert splits == {s: {p['id'] for p in aclsum_papers.load_split(s)}
                    for s in aclsum_papers.SPLITS}

  vocab = vocab_lib.get_vocab(2000)
  assert vocab.vocab_size == 2000
  text = 'Sparse layers make Transformers faster at decoding.'
  assert vocab.decode(vocab.encode(text)) == text

  inputs, targets, weights = next(streams.lm_stream(
      seq_len=256, batch_size=4, vocab_size=2000))
  assert inputs.shape == weights.shape == (4, 256)
  np.testing.assert_array_equal(inputs, targets)
  assert weights.all()  # Only the last window of an epoch has padding.

  inputs, targets, weights = next(streams.seq2seq_stream(
      split='validation', input_len=512, target_len=128, batch_size=4,
      vocab_size=2000, repeat=False))
  assert inputs.shape == (4, 512) and targets.shape == weights.shape == (4, 128)
  assert (weights.sum(axis=1) > 20).all()
  assert np.array_equal(weights > 0, np.cumsum(weights == 0, axis=1) == 0)
