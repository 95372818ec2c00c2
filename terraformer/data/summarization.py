"""Summarization data: article -> abstract (§4.4, Table 5; appendix 6.6).

One pipeline over two sources:
  'tfds'    arXiv summarization through TFDS (`scientific_papers/arxiv`,
            Cohan et al., the paper's [6]): `article` -> `abstract`;
  'aclsum'  the offline ACL papers bundled with `aclsum` (body -> abstract,
            fixed train/validation/test splits, see `aclsum_papers`).
The paper fine-tunes on arXiv with 16k-token articles and 1k-token abstracts
(set `input_len` / `target_len`). `summarization_pairs` yields the raw text
pairs (for evaluation with ROUGE); `summarization_stream` the tokenized,
truncated and padded training batches.
"""
import itertools
import logging

import gin
import numpy as np

from terraformer.data import aclsum_papers
from terraformer.data import streaming
from terraformer.data import streams
from terraformer.data import tfds_text
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError

SOURCES = ('aclsum', 'tfds')
_PAIRS_PER_ENCODE = 32  # Pairs tokenized together (in parallel).


def _check_source(source):
  if source not in SOURCES:
    raise TerraformerError(
        f'Unknown summarization source {source!r}; expected one of {SOURCES}')


def _pair_reader(split, source, papers_dir, dataset, data_dir, version,
                 article_key, abstract_key, shuffle_files, seed,
                 per_process=False):
  """Returns (function () -> one pass of (article, abstract) pairs, size).

  The size is known for 'aclsum' (None for 'tfds'); with `shuffle_files`,
  each pass has a new order.
  """
  _check_source(source)
  if source == 'aclsum':
    papers = aclsum_papers.load_split(split, papers_dir)
    pairs = [(p['body'], p['abstract']) for p in papers]
    rng = np.random.default_rng(seed)

    def one_pass():
      order = (rng.permutation(len(pairs)) if shuffle_files
               else range(len(pairs)))
      return (pairs[i] for i in order)

    return one_pass, len(pairs)
  return tfds_text.texts(dataset, split, (article_key, abstract_key),
                         data_dir=data_dir, version=version,
                         shuffle_files=shuffle_files, seed=seed,
                         per_process=per_process), None


def _usable(pairs, skip_empty, where):
  """Yields the pairs with a non-blank article and abstract.

  Blank ones are skipped (`skip_empty`) or a TerraformerError; if a pass has
  no usable pair at all, that is a TerraformerError too.
  """
  n_used = n_skipped = 0
  for index, (article, abstract) in enumerate(pairs):
    article, abstract = article.strip(), abstract.strip()
    if not article or not abstract:
      if not skip_empty:
        field = 'article' if not article else 'abstract'
        raise TerraformerError(
            f'{where}: example {index} has an empty {field}')
      n_skipped += 1
      continue
    n_used += 1
    yield article, abstract
  if n_skipped:
    logging.info('%s: skipped %d examples with an empty article or abstract',
                 where, n_skipped)
  if not n_used:
    raise TerraformerError(
        f'{where}: no example with a non-empty article and abstract '
        f'({n_skipped} empty)')


def _where(source, split, dataset):
  return f'{dataset if source == "tfds" else "aclsum papers"} {split!r}'


@gin.configurable(module='terraformer.data')
def summarization_pairs(split='test', source='aclsum', n_examples=None,
                        papers_dir=None, dataset='scientific_papers/arxiv',
                        data_dir=None, version=None, article_key='article',
                        abstract_key='abstract', skip_empty=True):
  """Returns an iterator of (article, abstract) text pairs, in split order.

  Args:
    split: 'train', 'validation' or 'test' (TFDS also takes slices such as
      'test[:100]').
    source: 'aclsum' (offline papers) or 'tfds' (`dataset` through TFDS).
    n_examples: stop after this many pairs (None: the whole split).
    papers_dir: S2ORC papers directory for 'aclsum'; default: aclsum's.
    dataset: TFDS dataset name for 'tfds'.
    data_dir: folder with the prepared TFDS data; None: TFDS's default.
    version: TFDS version; None: TFDS's default.
    article_key: TFDS feature of the article.
    abstract_key: TFDS feature of the abstract.
    skip_empty: skip pairs with a blank article or abstract (else a
      TerraformerError).

  Returns:
    An iterator of `(article, abstract)` str pairs, whitespace-stripped.
  """
  if n_examples is not None:
    streams._check_positive(n_examples=n_examples)  # pylint: disable=protected-access
  one_pass, _ = _pair_reader(split, source, papers_dir, dataset, data_dir,
                             version, article_key, abstract_key,
                             shuffle_files=False, seed=0)
  pairs = _usable(one_pass(), skip_empty, _where(source, split, dataset))
  return itertools.islice(pairs, n_examples)


@gin.configurable(module='terraformer.data')
def summarization_stream(split='train', source='aclsum', input_len=16384,
                         target_len=1024, batch_size=8, vocab_size=8000,
                         vocab_path=None, papers_dir=None,
                         dataset='scientific_papers/arxiv', data_dir=None,
                         version=None, article_key='article',
                         abstract_key='abstract', skip_empty=True,
                         shuffle_buffer=256, seed=0, repeat=True,
                         shuffle=None):
  """Returns a generator of article -> abstract batches.

  Articles and abstracts are tokenized, EOS is appended to each, then they
  are truncated and zero-padded to `input_len` / `target_len` (as
  `seq2seq_stream` does for the offline papers).

  Args:
    split: 'train', 'validation' or 'test' (TFDS: or a slice).
    source: 'aclsum' (offline papers) or 'tfds' (`dataset` through TFDS).
    input_len: tokens per input (article); the paper: 16k.
    target_len: tokens per target (abstract); the paper: 1k.
    batch_size: examples per batch.
    vocab_size: pieces of the SentencePiece model (must match it).
    vocab_path: a SentencePiece model (e.g. T5's); default: the project's
      (`terraformer.data.get_vocab`).
    papers_dir: S2ORC papers for 'aclsum' and for the default vocab.
    dataset, data_dir, version, article_key, abstract_key, skip_empty: see
      `summarization_pairs`.
    shuffle_buffer: examples held by the shuffle buffer.
    seed: seed of file order and shuffling.
    repeat: loop forever (True) or make one pass (False).
    shuffle: shuffle examples; default: only for 'train' splits.

  Returns:
    A generator of `(inputs, targets, weights)`: inputs `(batch_size,
    input_len)` int32, targets and weights `(batch_size, target_len)`
    int32/float32, weights 1 on target tokens, 0 on padding.
  """
  streams._check_positive(  # pylint: disable=protected-access
      input_len=input_len, target_len=target_len, batch_size=batch_size)
  _check_source(source)
  vocab = vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)
  shuffle = split.startswith('train') if shuffle is None else shuffle
  one_pass, size = _pair_reader(split, source, papers_dir, dataset, data_dir,
                                version, article_key, abstract_key,
                                shuffle_files=shuffle, seed=seed,
                                per_process=True)
  where = _where(source, split, dataset)
  if size is not None:  # Offline papers: check now that a batch fits.
    streams._check_enough(size, batch_size, 'papers', split)  # pylint: disable=protected-access
  eos = [vocab.eos_id]
  rng = np.random.default_rng(seed)

  def all_pairs():
    while True:
      yield from _usable(one_pass(), skip_empty, where)
      if not repeat:
        return

  def examples():
    pairs = all_pairs()
    while True:
      group = list(itertools.islice(pairs, _PAIRS_PER_ENCODE))
      if not group:
        return
      articles = vocab.encode_batch(a for a, _ in group)
      abstracts = vocab.encode_batch(b for _, b in group)
      for article, abstract in zip(articles, abstracts):
        inputs, _ = streams._pad_to(article + eos, input_len)  # pylint: disable=protected-access
        targets, weights = streams._pad_to(abstract + eos, target_len)  # pylint: disable=protected-access
        yield inputs, targets, weights

  return streaming.batched(
      streaming.shuffled(examples(), shuffle_buffer if shuffle else 0, rng),
      batch_size, per_process=source == 'tfds')
