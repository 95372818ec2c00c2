"""C4 streams on TFDS's mock of C4 (its real feature spec, no download)."""
import itertools

import gin
import numpy as np
import pytest
import tensorflow_datasets as tfds

from terraformer.data import aclsum_papers
from terraformer.data import c4
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError
import synthetic_papers
import tfds_mock

V = synthetic_papers.VOCAB_SIZE


@pytest.fixture
def vocab(shared_cache_dir, papers_dir):
  return vocab_lib.get_vocab(V, papers_dir=papers_dir)


@pytest.fixture
def docs(papers_dir):
  """Documents: the synthetic papers' abstracts and paragraphs."""
  papers = aclsum_papers.load_papers(papers_dir)
  return [t for p in papers for t in [p['abstract']] + p['body'].split('\n')]


def _masked(papers_dir, **kwargs):
  kwargs = dict(dict(split='validation', input_len=64, target_len=24,
                     batch_size=4, vocab_size=V, papers_dir=papers_dir,
                     repeat=False), **kwargs)
  return c4.c4_stream(**kwargs)


def _rows(batches):
  """(inputs, targets) of each non-padding example, unpadded."""
  rows = []
  for inputs, targets, weights in batches:
    for x, y, w in zip(inputs, targets, weights):
      if w.any():
        rows.append((x[x > 0], y[:int(w.sum())]))
  return rows


def _reconstruct(inputs, targets, sentinels, eos):
  """The unmasked tokens: each sentinel replaced by the word it hides."""
  assert inputs[-1] == eos and targets[-1] == eos
  spans, span_ids = [], []
  for t in targets[:-1]:
    if t in sentinels:
      spans.append([])
      span_ids.append(t)
    else:
      spans[-1].append(t)  # Targets start with a sentinel.
  out, k = [], 0
  for t in inputs[:-1]:
    if t in sentinels:
      assert t == span_ids[k] == sentinels[k % len(sentinels)]
      out += spans[k]
      k += 1
    else:
      out.append(t)
  assert k == len(spans)
  return out, spans


def test_masked_words_reconstruct_the_documents_in_order(vocab, docs,
                                                         papers_dir):
  with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
    batches = list(_masked(papers_dir))
  sentinels = list(c4.sentinel_ids(V, 100))
  assert sentinels[:2] == [V + 99, V + 98]  # T5's extra ids.
  for batch, shape in zip(batches[0], [(4, 64), (4, 24), (4, 24)]):
    assert batch.shape == shape
  expected = [t for d in vocab.encode_batch(docs) for t in d]
  tokens, n_spans = [], 0
  for inputs, targets in _rows(batches):
    assert len(inputs) <= 64 and len(targets) <= 24
    out, spans = _reconstruct(list(inputs), list(targets), sentinels,
                              vocab.eos_id)
    tokens += [t for t in out if t != vocab.eos_id]
    n_spans += len(spans)
  assert tokens == expected
  # About noise_density = 15% of the words are masked.
  n_words = sum(c4.word_start_table(vocab)[expected])
  assert 0.11 < n_spans / n_words < 0.19, (n_spans, n_words)


def test_each_span_is_one_whole_word(vocab, docs, papers_dir):
  starts = c4.word_start_table(vocab)
  assert starts[vocab.eos_id] and starts[vocab.encode(' x')[0]]
  sentinels = set(c4.sentinel_ids(V, 100))
  with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
    rows = _rows(_masked(papers_dir))
  for inputs, targets in rows:
    _, spans = _reconstruct(list(inputs), list(targets), list(
        c4.sentinel_ids(V, 100)), vocab.eos_id)
    for span in spans:
      assert span and starts[span[0]] and not starts[span[1:]].any()
    # What follows a masked word in the inputs starts a new word.
    for t, following in zip(inputs[:-1], inputs[1:]):
      if t in sentinels:
        assert following in sentinels or starts[following]


def test_packing_fills_examples_and_no_target_is_truncated(vocab, docs,
                                                           papers_dir):
  with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
    packed = _rows(_masked(papers_dir))
    single = _rows(_masked(papers_dir, pack=False))
  # Full examples: the next word would overflow the inputs or the targets.
  for inputs, targets in packed[:-1]:
    assert len(inputs) > 64 - 8 or len(targets) > 24 - 8
  assert np.mean([len(x) for x, _ in packed]) > 0.7 * 64
  assert len(single) > len(packed)
  # Unpacked: one document per example, no EOS separator inside.
  for inputs, _ in single:
    assert list(inputs).count(vocab.eos_id) == 1
  assert sum(list(x).count(vocab.eos_id) for x, _ in packed) > len(packed)


def test_sentinels_are_reused_cyclically(vocab, docs, papers_dir):
  sentinels = list(c4.sentinel_ids(V, 2))
  with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
    rows = _rows(_masked(papers_dir, n_sentinels=2, input_len=128,
                         target_len=64, noise_density=0.5))
  assert any(len(_reconstruct(list(x), list(y), sentinels,
                              vocab.eos_id)[1]) > 2 for x, y in rows)
  for inputs, _ in rows:
    assert set(inputs[inputs >= V]) <= {V, V + 1}


def test_words_longer_than_an_example_are_cut(vocab, papers_dir):
  text = 'short ' + 'bdfgklmnprstvz' * 20 + ' end'
  ids = vocab.encode(text)
  with tfds_mock.texts({'validation': [{'text': text}]}):
    rows = _rows(_masked(papers_dir, input_len=8, target_len=5,
                         noise_density=0.5))
  tokens = []
  for inputs, targets in rows:
    assert len(inputs) <= 8 and len(targets) <= 5
    out, _ = _reconstruct(list(inputs), list(targets),
                          list(c4.sentinel_ids(V, 100)), vocab.eos_id)
    tokens += out
  assert tokens == ids


def test_seeded_masking_and_shuffling(vocab, docs, papers_dir):
  with tfds_mock.texts({'train': [{'text': d} for d in docs]}):
    def rows(**kwargs):
      return _rows(_masked(papers_dir, split='train', **kwargs))
    first, again, other = rows(seed=0), rows(seed=0), rows(seed=1)
    ordered = rows(seed=0, shuffle=False)
  key = lambda rows: [bytes(x) + b'|' + bytes(y) for x, y in rows]
  assert key(first) == key(again)
  assert key(first) != key(other)
  # 'train' is shuffled by default: same examples, another order.
  assert key(first) != key(ordered)
  assert sorted(key(first)) == sorted(key(ordered))


def test_lm_stream_packs_documents_with_eos(vocab, docs, papers_dir):
  with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
    batches = list(c4.c4_lm_stream(
        split='validation', seq_len=32, batch_size=4, vocab_size=V,
        papers_dir=papers_dir, repeat=False))
    truncated = list(c4.c4_lm_stream(
        split='validation', seq_len=32, batch_size=4, vocab_size=V,
        papers_dir=papers_dir, repeat=False, min_doc_tokens=20,
        max_doc_tokens=30))
  expected = [t for d in vocab.encode_batch(docs) for t in d + [vocab.eos_id]]
  for inputs, targets, weights in batches:
    assert inputs.shape == weights.shape == (4, 32)
    np.testing.assert_array_equal(inputs, targets)
  inputs = np.concatenate([b[0] for b in batches]).reshape(-1)
  weights = np.concatenate([b[2] for b in batches]).reshape(-1)
  np.testing.assert_array_equal(weights, np.arange(len(weights)) <
                                len(expected))
  assert list(inputs[:len(expected)]) == expected
  kept = [d[:30] + [vocab.eos_id] for d in vocab.encode_batch(docs)
          if len(d) >= 20]
  tokens = np.concatenate([b[0][b[2] > 0] for b in truncated])
  assert list(tokens) == [t for d in kept for t in d]


def test_prefix_lm_splits_each_window_into_prefix_and_continuation(
    vocab, docs, papers_dir):
  with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
    batches = list(c4.c4_prefix_lm_stream(
        split='validation', input_len=17, target_len=8, batch_size=2,
        vocab_size=V, papers_dir=papers_dir, repeat=False))
  text = [t for d in vocab.encode_batch(docs) for t in d + [vocab.eos_id]]
  eos = vocab.eos_id
  rows = [tuple(b[i] for b in batch) for batch in batches
          for i in range(len(batch[0]))
          if batch[2][i].any()]  # The last batch is filled with empty rows.
  # Window k holds text[24k : 24k + 24]: 16 prefix tokens + EOS in, 8 out.
  for k, (inputs, targets, weights) in enumerate(rows):
    window = text[24 * k:24 * (k + 1)]
    assert inputs.shape == (17,) and targets.shape == weights.shape == (8,)
    prefix, continuation = window[:16], window[16:]
    assert list(inputs[:len(prefix) + 1]) == prefix + [eos]
    assert list(targets[:len(continuation)]) == continuation
    np.testing.assert_array_equal(weights, np.arange(8) < len(continuation))
  # Every token of the text is read once, in order; a last window without
  # a continuation token is dropped.
  n_windows = len(text) // 24 + (len(text) % 24 > 16)
  assert len(rows) == n_windows


def test_repeat_is_endless(vocab, docs, papers_dir):
  with tfds_mock.texts({'train': [{'text': d} for d in docs[:3]]}):
    one_pass = len(list(_masked(papers_dir, split='train', batch_size=1)))
    stream = _masked(papers_dir, split='train', batch_size=1, repeat=True)
    assert len(list(itertools.islice(stream, 3 * one_pass))) == 3 * one_pass


def test_real_c4_feature_spec_with_random_mock_examples(vocab, papers_dir):
  with tfds.testing.mock_data(num_examples=40):
    inputs, targets, weights = next(_masked(papers_dir, split='train',
                                            repeat=True))
    lm_inputs, _, _ = next(c4.c4_lm_stream(
        seq_len=16, batch_size=2, vocab_size=V, papers_dir=papers_dir))
  assert inputs.shape == (4, 64) and targets.shape == weights.shape == (4, 24)
  assert (inputs >= V).any() and weights.any()
  assert lm_inputs.shape == (2, 16)


def test_errors(vocab, papers_dir, tmp_path):
  with pytest.raises(TerraformerError,
                     match=f'not prepared.*tfds build c4/en --data_dir={tmp_path}'):
    _masked(papers_dir, data_dir=str(tmp_path))
  with pytest.raises(TerraformerError, match='Unknown TFDS dataset'):
    _masked(papers_dir, dataset='no_such_dataset', data_dir=str(tmp_path))
  with pytest.raises(TerraformerError, match='noise_density'):
    _masked(papers_dir, noise_density=0.0)
  with pytest.raises(TerraformerError, match='input_len >= 2'):
    c4.c4_prefix_lm_stream(input_len=1, vocab_size=V, papers_dir=papers_dir)
  with pytest.raises(TerraformerError, match='target_len >= 3'):
    _masked(papers_dir, target_len=2)
  with tfds_mock.texts({'validation': [{'text': ' '}, {'text': ''}]}):
    stream = _masked(papers_dir)
    with pytest.raises(TerraformerError, match='no document'):
      next(stream)
    stream = _masked(papers_dir, repeat=True)  # Must not loop forever.
    with pytest.raises(TerraformerError, match='no document'):
      next(stream)


def test_gin_configurable(vocab, docs, papers_dir):
  @gin.configurable('consumer', module='tests_c4')
  def consumer(stream=None):
    return stream

  try:
    gin.parse_config(f"""
        tests_c4.consumer.stream = @eval/terraformer.data.c4_stream
        eval/c4_stream.split = 'validation'
        c4_stream.input_len = 32
        c4_stream.target_len = 16
        c4_stream.batch_size = 3
        c4_stream.vocab_size = {V}
        c4_stream.papers_dir = '{papers_dir}'
    """)
    with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
      inputs, targets, _ = next(consumer()())
    assert inputs.shape == (3, 32) and targets.shape == (3, 16)
  finally:
    gin.clear_config()


def test_aclsum_source_masks_the_real_paper_bodies(cache_dir):
  """source='aclsum': the masked batches are the validation papers' bodies,
  in split order (real corpus, real 2048-piece vocab)."""
  v = 2048
  vocab = vocab_lib.get_vocab(v)
  papers = aclsum_papers.load_split('validation')
  bodies = [p['body'] for p in papers]
  sentinels = list(c4.sentinel_ids(v, 100))
  stream = c4.c4_stream(split='validation', source='aclsum', input_len=256,
                        target_len=64, batch_size=4, vocab_size=v,
                        repeat=False)
  rows = _rows(stream)
  tokens, n_spans = [], 0
  for inputs, targets in rows:
    assert len(inputs) <= 256 and len(targets) <= 64
    out, spans = _reconstruct(list(inputs), list(targets), sentinels,
                              vocab.eos_id)
    tokens += [t for t in out if t != vocab.eos_id]
    n_spans += len(spans)
  assert tokens == [t for d in vocab.encode_batch(bodies) for t in d]
  # The text itself: decoded back, it starts as the first paper's body.
  text = vocab.decode(tokens[:200])
  assert ' '.join(text.split()[:20]) == ' '.join(bodies[0].split()[:20])
  assert n_spans > 100
  # Not the training papers, and shuffled by default for 'train'.
  train = c4.c4_stream(split='train', source='aclsum', input_len=256,
                       target_len=64, batch_size=4, vocab_size=v)
  inputs, targets, _ = next(train)
  assert inputs.shape == (4, 256) and targets.shape == (4, 64)
  assert (inputs >= v).any()


def test_unknown_source(papers_dir, shared_cache_dir):
  with pytest.raises(TerraformerError, match="Unknown c4_stream source 'c4'"):
    _masked(papers_dir, source='c4')
  with pytest.raises(TerraformerError, match='Unknown split'):
    _masked(papers_dir, source='aclsum', split='train[:1%]')


def test_each_process_reads_its_own_part_of_a_tfds_split(
    vocab, docs, papers_dir, monkeypatch):
  """2 processes: each reads a disjoint half of the split (TFDS's
  split_for_jax_process) and yields ProcessBatches of half the rows."""
  import jax  # pylint: disable=g-import-not-at-top
  from terraformer.data import streaming  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  read = []
  for process in (0, 1):
    monkeypatch.setattr(jax, 'process_index', lambda p=process: p)
    with tfds_mock.texts({'validation': [{'text': d} for d in docs]}):
      batches = list(c4.c4_lm_stream(
          split='validation', seq_len=32, batch_size=4, vocab_size=V,
          papers_dir=papers_dir, repeat=False))
    assert batches and all(isinstance(b, streaming.ProcessBatch)
                           and b[0].shape == (2, 32) for b in batches)
    read.append(list(np.concatenate([b[0][b[2] > 0] for b in batches])))
  half = len(docs) // 2
  for process, part in enumerate((docs[:half], docs[half:2 * half])):
    assert read[process] == [t for d in vocab.encode_batch(part)
                             for t in d + [vocab.eos_id]]
