"""Summarization pairs and streams: arXiv through TFDS's mock of
`scientific_papers/arxiv`, and the real bundled aclsum papers offline."""
import itertools

import gin
import numpy as np
import pytest
import tensorflow_datasets as tfds

from terraformer.data import aclsum_papers
from terraformer.data import summarization
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError
import synthetic_papers
import tfds_mock

V = synthetic_papers.VOCAB_SIZE


@pytest.fixture
def vocab(shared_cache_dir, papers_dir):
  return vocab_lib.get_vocab(V, papers_dir=papers_dir)


@pytest.fixture
def arxiv(papers_dir):
  """Mock arXiv splits built from the synthetic papers (article = body)."""
  examples = {
      split: [{'article': p['body'], 'abstract': p['abstract'],
               'section_names': 'introduction\nconclusion'}
              for p in aclsum_papers.load_split(split, papers_dir)]
      for split in aclsum_papers.SPLITS}
  with tfds_mock.texts(examples):
    yield examples


def _stream(vocab, **kwargs):
  kwargs = dict(dict(source='tfds', input_len=48, target_len=16,
                     batch_size=2, vocab_size=V, vocab_path=vocab.path,
                     repeat=False), **kwargs)
  return summarization.summarization_stream(**kwargs)


def _check_rows(vocab, batches, pairs, input_len, target_len):
  """Rows are the encoded pairs + EOS, truncated and zero-padded."""
  rows = [(x, y, w) for b in batches for x, y, w in zip(*b)]
  assert len(rows) >= len(pairs)
  for (x, y, w), (article, abstract) in zip(rows, pairs):
    article = (vocab.encode(article) + [vocab.eos_id])[:input_len]
    abstract = (vocab.encode(abstract) + [vocab.eos_id])[:target_len]
    np.testing.assert_array_equal(x[:len(article)], article)
    assert not x[len(article):].any()
    np.testing.assert_array_equal(y[:len(abstract)], abstract)
    assert not y[len(abstract):].any()
    np.testing.assert_array_equal(w, np.arange(target_len) < len(abstract))
  for x, y, w in rows[len(pairs):]:  # Padding rows of the last batch.
    assert not x.any() and not y.any() and not w.any()


def test_tfds_pairs_are_article_and_abstract_in_order(arxiv):
  pairs = list(summarization.summarization_pairs('test', source='tfds'))
  assert pairs == [(e['article'], e['abstract']) for e in arxiv['test']]
  two = summarization.summarization_pairs('validation', source='tfds',
                                          n_examples=1)
  assert list(two) == [(arxiv['validation'][0]['article'],
                        arxiv['validation'][0]['abstract'])]


def test_tfds_stream_truncates_pads_and_weights(vocab, arxiv):
  for input_len, target_len in ((48, 16), (4096, 512)):
    batches = list(_stream(vocab, split='validation', input_len=input_len,
                           target_len=target_len))
    for inputs, targets, weights in batches:
      assert inputs.shape == (2, input_len) and inputs.dtype == np.int32
      assert targets.shape == weights.shape == (2, target_len)
      assert weights.dtype == np.float32
    pairs = [(e['article'], e['abstract']) for e in arxiv['validation']]
    _check_rows(vocab, batches, pairs, input_len, target_len)


def test_train_split_is_shuffled_with_a_seed(vocab, arxiv):
  def targets(**kwargs):
    batches = _stream(vocab, split='train', batch_size=1, target_len=64,
                      **kwargs)
    return [bytes(b[1]) for b in batches]

  ordered = targets(shuffle=False)
  first = targets(seed=0)
  assert first == targets(seed=0)
  assert first != ordered and targets(seed=1) != first
  assert sorted(first) == sorted(ordered)


def test_empty_articles_are_skipped_or_an_error(vocab):
  examples = [{'article': 'A real article.', 'abstract': 'An abstract.'},
              {'article': '  \n', 'abstract': 'Abstract of nothing.'},
              {'article': 'Article without abstract.', 'abstract': ''}]
  with tfds_mock.texts({'test': examples, 'train': examples[1:]}):
    assert list(summarization.summarization_pairs('test', source='tfds')) == [
        ('A real article.', 'An abstract.')]
    with pytest.raises(TerraformerError, match='example 1 has an empty '
                       'article'):
      list(summarization.summarization_pairs('test', source='tfds',
                                             skip_empty=False))
    stream = _stream(vocab, split='train', repeat=True)
    with pytest.raises(TerraformerError, match='no example with a non-empty'):
      next(stream)


def test_tfds_not_prepared_names_the_build_command(vocab, tmp_path):
  with pytest.raises(TerraformerError, match=(
      'not prepared.*tfds build scientific_papers/arxiv '
      f'--data_dir={tmp_path}')):
    _stream(vocab, data_dir=str(tmp_path))
  with pytest.raises(TerraformerError, match='not prepared'):
    summarization.summarization_pairs(source='tfds', data_dir=str(tmp_path))
  with pytest.raises(TerraformerError, match='Unknown summarization source'):
    _stream(vocab, source='pubmed')


def test_real_arxiv_feature_spec_with_random_mock_examples(vocab):
  with tfds.testing.mock_data(num_examples=5):
    inputs, targets, weights = next(_stream(vocab, split='train',
                                            repeat=True))
    pairs = list(summarization.summarization_pairs('test', source='tfds'))
  assert inputs.shape == (2, 48) and targets.shape == (2, 16)
  assert weights.any() and len(pairs) == 5


def test_aclsum_source_on_the_real_bundled_papers(vocab):
  """Offline: body -> abstract of aclsum's papers, fixed splits."""
  test = aclsum_papers.load_split('test')
  pairs = list(summarization.summarization_pairs('test'))
  assert pairs == [(p['body'], p['abstract']) for p in test]
  assert 20 <= len(pairs) <= 35
  batches = list(_stream(vocab, source='aclsum', split='test',
                         input_len=256, target_len=64, batch_size=4))
  assert len(batches) == -(-len(test) // 4)
  _check_rows(vocab, batches, pairs, 256, 64)
  # Splits are the fixed aclsum ones: disjoint article sets.
  articles = {split: {a for a, _ in summarization.summarization_pairs(split)}
              for split in aclsum_papers.SPLITS}
  assert not articles['train'] & articles['test']
  assert not articles['validation'] & articles['test']
  stream = _stream(vocab, source='aclsum', split='train', repeat=True,
                   batch_size=8)
  assert len(list(itertools.islice(stream, 60))) == 60  # > 1 epoch.
  with pytest.raises(TerraformerError, match='fewer than batch_size'):
    _stream(vocab, source='aclsum', split='test', batch_size=1000)


def test_gin_configurable(vocab, arxiv):
  @gin.configurable('consumer', module='tests_summarization')
  def consumer(stream=None, pairs=None):
    return stream, pairs

  try:
    gin.parse_config(f"""
        tests_summarization.consumer.stream = @train/terraformer.data.summarization_stream
        tests_summarization.consumer.pairs = @terraformer.data.summarization_pairs
        summarization_stream.source = 'tfds'
        summarization_stream.input_len = 40
        summarization_stream.target_len = 12
        summarization_stream.batch_size = 3
        summarization_stream.vocab_size = {V}
        summarization_stream.vocab_path = '{vocab.path}'
        summarization_pairs.source = 'tfds'
        summarization_pairs.split = 'validation'
    """)
    stream_fn, pairs_fn = consumer()
    inputs, targets, _ = next(stream_fn())
    assert inputs.shape == (3, 40) and targets.shape == (3, 12)
    assert list(pairs_fn()) == [(e['article'], e['abstract'])
                                for e in arxiv['validation']]
  finally:
    gin.clear_config()
