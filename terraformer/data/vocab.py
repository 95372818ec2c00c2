"""SentencePiece vocabulary: trained on the train split once, then cached.

Ids follow the T5 convention: pad=0, eos=1, unk=2, no bos. A user model
(e.g. T5's `spm` model) can be passed as `vocab_path` instead.
"""
import io
import logging
import os

import sentencepiece as spm

from terraformer.checkpoint.format import atomic_write
from terraformer.data import aclsum_papers
from terraformer.errors import TerraformerError

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2


def cache_dir():
  """Returns the cache directory: $TERRAFORMER_CACHE_DIR or ~/.cache/..."""
  return os.environ.get('TERRAFORMER_CACHE_DIR') or os.path.join(
      os.path.expanduser('~'), '.cache', 'terraformer')


class Vocab:
  """A SentencePiece model: text <-> list of ids."""

  def __init__(self, path):
    self.path = path
    with open(path, 'rb') as f:
      self.model_bytes = f.read()
    self._sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)

  @property
  def vocab_size(self):
    return self._sp.get_piece_size()

  @property
  def eos_id(self):
    return self._sp.eos_id()

  @property
  def pad_id(self):
    return self._sp.pad_id()

  def encode(self, text):
    """Returns the ids of `text` (a str) as a list of ints, without EOS."""
    return self._sp.encode(text)

  def encode_batch(self, texts, num_threads=-1):
    """Returns a list of id lists, encoding `texts` in parallel."""
    return self._sp.encode(list(texts), num_threads=num_threads)

  def decode(self, ids):
    """Returns the text of `ids` (ints); pad/eos/unk ids are dropped."""
    return self._sp.decode([int(i) for i in ids])


def _train(papers, vocab_size, seed=0):
  """Trains a unigram SentencePiece model; returns the serialized model."""
  lines = [line for p in papers
           for line in [p['abstract']] + p['body'].split('\n') if line.strip()]
  spm.set_random_generator_seed(seed)
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        vocab_size=vocab_size,
        model_type='unigram',
        character_coverage=0.9995,
        # Sample and shuffle lines: bounds time and memory on larger corpora.
        input_sentence_size=200_000,
        shuffle_input_sentence=True,
        max_sentence_length=16384,
        num_threads=os.cpu_count() or 1,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        minloglevel=2)
  except RuntimeError as e:
    raise TerraformerError(
        f'SentencePiece training (vocab_size={vocab_size}) failed: '
        f'{str(e).strip().splitlines()[-1]}') from e
  return model.getvalue()


def default_vocab_path(vocab_size, corpus):
  """Returns the cache path of the vocab trained on `corpus` (a name)."""
  return os.path.join(cache_dir(), f'spm_unigram-{corpus}-{vocab_size}.model')


def get_vocab(vocab_size=8000, vocab_path=None, papers_dir=None):
  """Returns a Vocab, training and caching it on first use.

  Args:
    vocab_size: number of pieces; must match the model at `vocab_path`.
    vocab_path: a user SentencePiece model; default: train one on the train
      split of `papers_dir` and cache it in `cache_dir()`.
    papers_dir: S2ORC papers directory; default: aclsum's bundled papers.

  Returns:
    A Vocab with exactly `vocab_size` pieces.
  """
  if vocab_path is not None:
    vocab_path = os.path.expanduser(vocab_path)
    if not os.path.isfile(vocab_path):
      raise TerraformerError(f'SentencePiece model not found: {vocab_path}')
  else:
    papers = aclsum_papers.load_papers(papers_dir)
    corpus = aclsum_papers.corpus_name(papers, papers_dir)
    vocab_path = default_vocab_path(vocab_size, corpus)
    if not os.path.isfile(vocab_path):
      papers = aclsum_papers.select_split(papers, 'train', papers_dir)
      logging.info('Training a %d-piece SentencePiece vocab on %d papers -> %s',
                   vocab_size, len(papers), vocab_path)
      atomic_write(vocab_path, _train(papers, vocab_size))
  try:
    vocab = Vocab(vocab_path)
  except (RuntimeError, OSError) as e:
    raise TerraformerError(
        f'Not a SentencePiece model: {vocab_path} ({e})') from e
  if vocab.vocab_size != vocab_size:
    raise TerraformerError(
        f'vocab_size={vocab_size} does not match the {vocab.vocab_size} pieces '
        f'of {vocab_path}; set vocab_size={vocab.vocab_size}')
  if vocab.eos_id < 0:
    raise TerraformerError(f'SentencePiece model has no EOS id: {vocab_path}')
  return vocab
