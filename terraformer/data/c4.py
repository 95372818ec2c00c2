"""C4 pretraining streams (§4.4 and appendix 6.5): masked words, plain LM
and prefix LM.

The paper pretrains on C4 and says only that it "mask[s] single words (we do
not use the Pegasus sentence loss)" (§4.4). It gives no masking rate nor
format, so we follow T5's span corruption (Raffel et al., the paper's [30])
with every span one word long:

* a word is a SentencePiece piece starting with '▁' plus the pieces that
  follow it up to the next such piece;
* each word is masked independently with probability `noise_density` (T5's
  15%); separators between packed documents are never masked;
* each masked word is replaced in the inputs by one sentinel; the targets are
  the sentinels, each followed by the word it hides, then EOS:
  `inputs  = Thank you <X> me to your <Y> last week EOS`
  `targets = <X> for inviting <Y> party EOS`  (T5 marks spans the same way);
* sentinels are T5's extra ids, above the SentencePiece pieces: sentinel k
  is `vocab_size + n_sentinels - 1 - k` (with T5's 32000-piece model and 100
  sentinels: 32099, 32098, ...), so the model's vocabulary has
  `vocab_size + n_sentinels` entries. Examples with more masked words than
  sentinels reuse them cyclically (the order still tells them apart).

Documents are packed: words are taken in order, across document boundaries
(marked by EOS), until the inputs or the targets would overflow; so no
target is ever truncated. Decoder-only models use `c4_lm_stream`: documents
with EOS, concatenated and cut into windows. `c4_prefix_lm_stream` cuts the
same windows into an encoder prefix and the decoder's continuation (T5's
prefix LM; not the paper's objective).

Documents come from TFDS (`source='tfds'`, C4 by default) or, offline, from
the paper bodies of an aclsum split (`source='aclsum'`, one document per
paper; see `aclsum_papers`).
"""
import itertools
import logging

import gin
import numpy as np
import sentencepiece as spm

from terraformer.data import aclsum_papers
from terraformer.data import streaming
from terraformer.data import streams
from terraformer.data import tfds_text
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError

WORD_START = '\u2581'  # SentencePiece's word boundary marker.
# Where the documents come from: TFDS (C4) or the offline aclsum paper bodies.
SOURCES = ('tfds', 'aclsum')
_DOCS_PER_ENCODE = 64  # Documents tokenized together (in parallel).


def sentinel_ids(vocab_size, n_sentinels):
  """T5's extra ids: sentinel k is `vocab_size + n_sentinels - 1 - k`."""
  return vocab_size + n_sentinels - 1 - np.arange(n_sentinels, dtype=np.int32)


def word_start_table(vocab):
  """Boolean array over piece ids: True where a piece starts a word.

  Pieces starting with '▁' start words; so do control pieces (pad, EOS),
  which stand alone. Other pieces (incl. unknown and byte pieces) continue
  the current word.
  """
  sp = spm.SentencePieceProcessor(model_proto=vocab.model_bytes)
  return np.array([sp.is_control(i) or sp.id_to_piece(i).startswith(WORD_START)
                   for i in range(sp.get_piece_size())], bool)


def split_words(ids, starts_table, max_word_len):
  """Word-start flags of the pieces `ids` (the first piece starts a word).

  Words longer than `max_word_len` pieces are cut into words of at most that
  many pieces, so every word fits in one example.
  """
  starts = starts_table[ids]
  if len(starts):
    starts[0] = True
    first = np.flatnonzero(starts)
    position = np.arange(len(ids)) - first[np.cumsum(starts) - 1]
    starts |= position % max_word_len == 0
  return starts


class WordMasker:
  """Masks single words of a token stream and packs them into examples.

  `add(ids)` appends a document (piece ids, no EOS); `examples(final)` yields
  `(inputs, targets)` int32 arrays, unpadded, at most `input_len` and
  `target_len` long (EOS included), keeping the words that may still be
  packed with the next document unless `final`.
  """

  def __init__(self, starts_table, input_len, target_len, noise_density,
               sentinels, eos_id, rng):
    self._starts_table = starts_table
    self._in_budget = input_len - 1      # Room for the final EOS.
    self._target_budget = target_len - 1
    # A masked word costs 1 + its length in the targets.
    self._max_word_len = max(1, min(self._in_budget, self._target_budget - 1))
    self._noise_density = noise_density
    self._sentinels = sentinels
    self._eos = eos_id
    self._rng = rng
    self._ids, self._starts, self._masked, self._separator = [], [], [], []
    self.n_words = self.n_masked = 0  # Statistics, for tests and logs.

  def add(self, ids):
    """Appends one document, preceded by an EOS separator word."""
    ids = np.asarray(ids, np.int32)
    starts = split_words(ids, self._starts_table, self._max_word_len)
    n_words = int(starts.sum())
    masked = self._rng.random(n_words) < self._noise_density
    self._ids += [np.array([self._eos], np.int32), ids]
    self._starts += [np.ones(1, bool), starts]
    self._masked += [np.zeros(1, bool), masked]
    self._separator += [np.ones(1, bool), np.zeros(n_words, bool)]
    self.n_words += n_words
    self.n_masked += int(masked.sum())

  def examples(self, final):
    """Yields full examples; with `final`, also the last partial one."""
    if not self._ids:
      return
    ids, starts, masked, separator = (
        np.concatenate(x) for x in (self._ids, self._starts, self._masked,
                                    self._separator))
    first_piece = np.append(np.flatnonzero(starts), len(ids))  # Per word.
    lengths = np.diff(first_piece)
    in_cum = np.append(0, np.cumsum(np.where(masked, 1, lengths)))
    target_cum = np.append(0, np.cumsum(np.where(masked, 1 + lengths, 0)))
    n_words, start = len(lengths), 0
    while start < n_words:
      # The most words from `start` on that fit both budgets (at least one).
      end = min(
          np.searchsorted(in_cum, in_cum[start] + self._in_budget, 'right'),
          np.searchsorted(target_cum, target_cum[start] + self._target_budget,
                          'right')) - 1
      if end >= n_words and not final:
        break  # May still be filled up by the next document.
      # Separators at either end of an example are dropped.
      first, last = start + separator[start], end - separator[end - 1]
      if first < last:
        yield self._example(ids[first_piece[first]:first_piece[last]],
                            starts[first_piece[first]:first_piece[last]],
                            masked[first:last])
      start = end
    # Keep the tail (words not yet in an example) for the next document.
    tail = first_piece[start]
    self._ids, self._starts = [ids[tail:]], [starts[tail:]]
    self._masked, self._separator = [masked[start:]], [separator[start:]]
    if start == n_words:
      self._ids, self._starts, self._masked, self._separator = [], [], [], []

  def _example(self, ids, starts, word_masked):
    """(inputs, targets) of the words `ids` (pieces) with mask flags."""
    masked = word_masked[np.cumsum(starts) - 1]     # Per piece.
    first_masked = masked & starts
    k = np.cumsum(first_masked) - 1
    sentinel = self._sentinels[k % len(self._sentinels)]
    inputs = np.where(first_masked, sentinel, ids)[~masked | first_masked]
    # Targets: each masked word's pieces, preceded by its sentinel.
    target_ids, target_first = ids[masked], first_masked[masked]
    position = np.arange(len(target_ids)) + np.cumsum(target_first)
    targets = np.zeros(len(target_ids) + target_first.sum(), np.int32)
    targets[position] = target_ids
    targets[position[target_first] - 1] = sentinel[masked][target_first]
    eos = np.array([self._eos], np.int32)
    return (np.concatenate([inputs, eos]).astype(np.int32),
            np.concatenate([targets, eos]).astype(np.int32))


def _documents(one_pass, vocab, min_doc_tokens, max_doc_tokens, repeat,
               where):
  """Yields the token ids of the usable documents, pass after pass.

  A pass without any document of at least `min_doc_tokens` tokens is a
  TerraformerError (else an endless stream would never yield).
  """
  while True:
    n_used = n_short = 0
    texts = (t[0] for t in one_pass())
    while True:
      group = list(itertools.islice(texts, _DOCS_PER_ENCODE))
      if not group:
        break
      for ids in vocab.encode_batch(group):
        if len(ids) < min_doc_tokens:
          n_short += 1
          continue
        n_used += 1
        yield ids[:max_doc_tokens] if max_doc_tokens else ids
    if n_short:
      logging.info('%s: skipped %d documents shorter than %d tokens', where,
                   n_short, min_doc_tokens)
    if not n_used:
      raise TerraformerError(
          f'{where} has no document of at least {min_doc_tokens} tokens '
          f'({n_short} shorter)')
    if not repeat:
      return


def _check_fraction(name, value):
  if not 0.0 < value < 1.0:
    raise TerraformerError(f'{name} must be in (0, 1), got {value!r}')


def _aclsum_texts(split, papers_dir, shuffle, seed):
  """A one-pass reading function over the paper bodies of an aclsum split.

  Each pass yields `(body,)` tuples (as `tfds_text.texts` does); with
  `shuffle`, each pass has a new paper order.
  """
  bodies = [p['body'] for p in aclsum_papers.load_split(split, papers_dir)]
  rng = np.random.default_rng(seed)

  def one_pass():
    order = rng.permutation(len(bodies)) if shuffle else range(len(bodies))
    return ((bodies[i],) for i in order)

  return one_pass


def _open(split, source, dataset, data_dir, version, vocab_size, vocab_path,
          papers_dir, seed, shuffle, text_key):
  """Vocab, a one-pass reading function, whether to shuffle, and a name."""
  if source not in SOURCES:
    raise TerraformerError(
        f'Unknown c4_stream source {source!r}; expected one of {SOURCES}')
  vocab = vocab_lib.get_vocab(vocab_size, vocab_path, papers_dir)
  shuffle = split.startswith('train') if shuffle is None else shuffle
  if source == 'aclsum':
    one_pass = _aclsum_texts(split, papers_dir, shuffle, seed)
    return vocab, one_pass, shuffle, f'aclsum paper bodies {split!r}'
  one_pass = tfds_text.texts(dataset, split, (text_key,), data_dir=data_dir,
                             version=version, shuffle_files=shuffle, seed=seed,
                             per_process=True)
  return (vocab, one_pass, shuffle,
          f'{tfds_text.dataset_name(dataset, version)} {split!r}')


@gin.configurable(module='terraformer.data')
def c4_stream(split='train', source='tfds', input_len=1024, target_len=256,
              batch_size=8,
              noise_density=0.15, n_sentinels=100, pack=True,
              vocab_size=32000, vocab_path=None, papers_dir=None,
              dataset='c4/en', version=None, data_dir=None, text_key='text',
              min_doc_tokens=1, max_doc_tokens=None, shuffle_buffer=1024,
              seed=0, repeat=True, shuffle=None):
  """Returns a generator of C4 masked-word batches for encoder-decoders.

  See the module docstring for the objective. The model's input vocabulary
  must have `vocab_size + n_sentinels` entries.

  Args:
    split: TFDS split: 'train', 'validation', or a slice like 'train[:1%]';
      for source 'aclsum': 'train', 'validation' or 'test'.
    source: where the documents come from: 'tfds' (`dataset`, e.g. C4,
      through TFDS) or 'aclsum' (the body of each paper of the offline
      aclsum `split`, see `aclsum_papers`; offline stand-in for C4).
    input_len: tokens per input (masked text + EOS).
    target_len: tokens per target (sentinels and masked words + EOS).
    batch_size: examples per batch (global: in a multi-process job each
      process reads its own part of a TFDS split and yields its
      batch_size / processes rows of each batch).
    noise_density: probability of masking each word (T5: 0.15).
    n_sentinels: number of sentinel ids above the SentencePiece pieces.
    pack: pack several documents into one example (separated by EOS); if
      False, each example holds words of a single document.
    vocab_size: pieces of the SentencePiece model (must match it).
    vocab_path: a SentencePiece model (e.g. T5's); default: the project's,
      trained on the offline papers (`terraformer.data.get_vocab`).
    papers_dir: papers the default vocab is trained on (and, for source
      'aclsum', the papers read).
    dataset: TFDS dataset name (source 'tfds').
    version: TFDS version (e.g. '3.1.0'); None: TFDS's default.
    data_dir: folder with the prepared TFDS data; None: TFDS's default.
    text_key: the text feature.
    min_doc_tokens: skip documents with fewer tokens.
    max_doc_tokens: truncate documents to this many tokens (None: keep all).
    shuffle_buffer: examples held by the shuffle buffer.
    seed: seed of file order, masking and shuffling.
    repeat: loop over the split forever (True) or make one pass (False).
    shuffle: shuffle files and examples; default: for 'train' splits.

  Returns:
    A generator of `(inputs, targets, weights)`: inputs `(batch_size,
    input_len)` int32, targets and weights `(batch_size, target_len)`
    int32/float32, weights 1 on target tokens and 0 on padding.
  """
  streams._check_positive(  # pylint: disable=protected-access
      input_len=input_len, target_len=target_len, batch_size=batch_size,
      n_sentinels=n_sentinels, min_doc_tokens=min_doc_tokens)
  if input_len < 2 or target_len < 3:
    raise TerraformerError(
        f'c4_stream needs input_len >= 2 and target_len >= 3, got '
        f'{input_len} and {target_len}')
  _check_fraction('noise_density', noise_density)
  vocab, one_pass, shuffle, where = _open(
      split, source, dataset, data_dir, version, vocab_size, vocab_path,
      papers_dir, seed, shuffle, text_key)
  mask_rng, shuffle_rng = (np.random.default_rng(s) for s in
                           np.random.SeedSequence(seed).spawn(2))
  masker = WordMasker(word_start_table(vocab), input_len, target_len,
                      noise_density, sentinel_ids(vocab.vocab_size,
                                                  n_sentinels),
                      vocab.eos_id, mask_rng)

  def examples():
    for ids in _documents(one_pass, vocab, min_doc_tokens, max_doc_tokens,
                           repeat, where):
      masker.add(ids)
      yield from masker.examples(final=not pack)
    yield from masker.examples(final=True)

  def padded():
    for inputs, targets in examples():
      inputs, _ = streams._pad_to(inputs, input_len)  # pylint: disable=protected-access
      targets, weights = streams._pad_to(targets, target_len)  # pylint: disable=protected-access
      yield inputs, targets, weights

  return streaming.batched(
      streaming.shuffled(padded(), shuffle_buffer if shuffle else 0,
                         shuffle_rng),
      batch_size, per_process=source == 'tfds')


def _windows(documents, eos_id, length, pack):
  """Windows of `length` tokens of documents each followed by EOS: with
  `pack`, documents are concatenated and cut; else each is cut on its own
  (its last window shorter). The last window of the stream may be shorter."""
  pending = np.zeros(0, np.int32)
  for ids in documents:
    pending = np.concatenate([pending, ids, [eos_id]]).astype(np.int32)
    n_full = len(pending) // length
    for i in range(n_full):
      yield pending[i * length:(i + 1) * length]
    pending = pending[n_full * length:]
    if not pack and len(pending):
      yield pending
      pending = pending[:0]
  if len(pending):
    yield pending


@gin.configurable(module='terraformer.data')
def c4_lm_stream(split='train', source='tfds', seq_len=1024, batch_size=8,
                 pack=True,
                 vocab_size=32000, vocab_path=None, papers_dir=None,
                 dataset='c4/en', version=None, data_dir=None, text_key='text',
                 min_doc_tokens=1, max_doc_tokens=None, shuffle_buffer=1024,
                 seed=0, repeat=True, shuffle=None):
  """Returns a generator of C4 language-model batches for decoder-only models.

  Each document is tokenized and followed by EOS; with `pack`, documents are
  concatenated and cut into windows of `seq_len` tokens (as `lm_stream`
  does), else each document is cut into its own windows, the last one
  zero-padded. Arguments are those of `c4_stream`.

  Returns:
    A generator of `(inputs, targets, weights)`, each `(batch_size,
    seq_len)`, with `inputs == targets` (models shift right) and weights 1 on
    tokens, 0 on padding.
  """
  streams._check_positive(  # pylint: disable=protected-access
      seq_len=seq_len, batch_size=batch_size, min_doc_tokens=min_doc_tokens)
  vocab, one_pass, shuffle, where = _open(
      split, source, dataset, data_dir, version, vocab_size, vocab_path,
      papers_dir, seed, shuffle, text_key)
  rng = np.random.default_rng(seed)
  documents = _documents(one_pass, vocab, min_doc_tokens, max_doc_tokens,
                         repeat, where)

  def padded():
    for window in _windows(documents, vocab.eos_id, seq_len, pack):
      tokens, weights = streams._pad_to(window, seq_len)  # pylint: disable=protected-access
      yield tokens, tokens, weights

  return streaming.batched(
      streaming.shuffled(padded(), shuffle_buffer if shuffle else 0, rng),
      batch_size, per_process=source == 'tfds')


@gin.configurable(module='terraformer.data')
def c4_prefix_lm_stream(split='train', source='tfds', input_len=1024,
                        target_len=256, batch_size=8, pack=True,
                        vocab_size=32000, vocab_path=None, papers_dir=None,
                        dataset='c4/en', version=None, data_dir=None,
                        text_key='text', min_doc_tokens=1,
                        max_doc_tokens=None, shuffle_buffer=1024, seed=0,
                        repeat=True, shuffle=None):
  """Returns a generator of prefix-LM batches for encoder-decoders.

  T5's "prefix language modeling" objective (Raffel et al., §3.3.2): text is
  cut into windows of `input_len - 1 + target_len` tokens (documents each
  followed by EOS, packed as in `c4_lm_stream`); the encoder reads the first
  `input_len - 1` tokens and EOS, the decoder predicts the `target_len`
  tokens that follow. Not the paper's pretraining (it masks single words,
  `c4_stream`): a deliberate alternative, whose decoder learns to continue
  running text rather than to fill in masked words. Arguments are those of
  `c4_stream`; the model's vocabulary needs no sentinels.

  Returns:
    A generator of `(inputs, targets, weights)`: inputs `(batch_size,
    input_len)`, targets and weights `(batch_size, target_len)`; a window
    cut short (the end of the stream, or of a document without `pack`) is
    zero-padded, its weights 0 on the padding.
  """
  streams._check_positive(  # pylint: disable=protected-access
      input_len=input_len, target_len=target_len, batch_size=batch_size,
      min_doc_tokens=min_doc_tokens)
  if input_len < 2:
    raise TerraformerError(
        f'c4_prefix_lm_stream needs input_len >= 2, got {input_len}')
  vocab, one_pass, shuffle, where = _open(
      split, source, dataset, data_dir, version, vocab_size, vocab_path,
      papers_dir, seed, shuffle, text_key)
  rng = np.random.default_rng(seed)
  documents = _documents(one_pass, vocab, min_doc_tokens, max_doc_tokens,
                         repeat, where)
  prefix = input_len - 1

  def padded():
    for window in _windows(documents, vocab.eos_id, prefix + target_len,
                           pack):
      if len(window) <= prefix:
        continue  # No target token to predict.
      inputs = np.concatenate([window[:prefix], [vocab.eos_id]])
      inputs, _ = streams._pad_to(inputs.astype(np.int32), input_len)  # pylint: disable=protected-access
      targets, weights = streams._pad_to(window[prefix:], target_len)  # pylint: disable=protected-access
      yield inputs, targets, weights

  return streaming.batched(
      streaming.shuffled(padded(), shuffle_buffer if shuffle else 0, rng),
      batch_size, per_process=source == 'tfds')
