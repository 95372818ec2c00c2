"""Tests for terraformer.data.salient_extraction."""
import itertools

import numpy as np
import pytest

from terraformer.data import aclsum_papers
from terraformer.data import salient_extraction as se
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError
import synthetic_papers

V = synthetic_papers.VOCAB_SIZE


def _stream(papers_dir, **kwargs):
  kwargs = dict(dict(input_len=64, n_salient=4, batch_size=4, vocab_size=V,
                     papers_dir=papers_dir), **kwargs)
  return se.salient_extraction_stream(**kwargs)


def _split_text(papers_dir, split):
  vocab = vocab_lib.get_vocab(V, None, papers_dir)
  docs = vocab.encode_batch(p['body']
                            for p in aclsum_papers.load_split(split,
                                                              papers_dir))
  return np.concatenate([np.asarray(d, np.int32) for d in docs])


def _read(x, section):
  """By hand from the definition: (marker, the tokens after each marker
  occurrence that is not a declaration, the text without the markers)."""
  marker = int(x[0])
  after, text = [], []
  for p, token in enumerate(x):
    if p % section == 0:
      assert token == marker  # Declared at every section's start.
      continue
    if token == marker:
      continue
    if x[p - 1] == marker and (p - 1) % section:
      after.append(int(token))
    text.append(int(token))
  return marker, after, text


def _contains(haystack, needle):
  n = len(needle)
  return any(np.array_equal(haystack[i:i + n], needle)
             for i in range(len(haystack) - n + 1))


@pytest.mark.parametrize('declare_every', [None, 16])
def test_target_is_the_tokens_after_the_markers_in_order(
    shared_cache_dir, papers_dir, declare_every):
  del shared_cache_dir
  n, m = 64, 4
  section = declare_every or n
  train_text = _split_text(papers_dir, 'train')
  for inputs, targets, weights in itertools.islice(
      _stream(papers_dir, declare_every=declare_every), 3):
    assert inputs.shape == (4, n) and targets.shape == (4, m + 1)
    assert inputs.dtype == targets.dtype == np.int32
    np.testing.assert_array_equal(weights, 1.0)
    salient = se.salient_positions(inputs, declare_every)
    for x, y, is_salient in zip(inputs, targets, salient):
      marker, after, text = _read(x, section)
      assert marker >= se.N_SPECIAL and marker not in text
      np.testing.assert_array_equal(y, after + [1])  # ... then EOS.
      assert len(after) == m
      # m markers besides the declarations, each before a salient token.
      assert (x == marker).sum() == m + n // section
      np.testing.assert_array_equal(x[is_salient], after)
      # Every section holds m / sections of them, none right after its
      # declaration; the rest is one window of the split's text, in order.
      per = np.add.reduceat(is_salient, np.arange(0, n, section))
      np.testing.assert_array_equal(per, m // (n // section))
      assert not is_salient[np.arange(0, n, section) + 1].any()
      assert _contains(train_text, np.array(text))


def test_fixed_marker_is_one_id_past_the_vocabulary(shared_cache_dir,
                                                   papers_dir):
  del shared_cache_dir
  n, m, section = 64, 4, 16
  for inputs, targets, _ in itertools.islice(
      _stream(papers_dir, declare_every=section, fixed_marker=True), 2):
    salient = se.salient_positions(inputs, section)
    for x, y, is_salient in zip(inputs, targets, salient):
      marker, after, text = _read(x, section)
      assert marker == V and max(text) < V
      assert (x == V).sum() == m + n // section
      np.testing.assert_array_equal(y, after + [1])
      np.testing.assert_array_equal(x[is_salient], after)


def test_salient_pieces_are_the_most_frequent_pieces(shared_cache_dir,
                                                     papers_dir):
  """With salient_pieces K the salient tokens are the first K pieces of
  the vocabulary, ids N_SPECIAL .. N_SPECIAL + K - 1; everything else
  holds: the target, the markers, the sections, one window of the split's
  text."""
  del shared_cache_dir
  n, m, section, k = 64, 4, 16, 8
  train_text = _split_text(papers_dir, 'train')
  for inputs, targets, _ in itertools.islice(
      _stream(papers_dir, declare_every=section, salient_pieces=k), 3):
    salient = se.salient_positions(inputs, section)
    for x, y, is_salient in zip(inputs, targets, salient):
      marker, after, text = _read(x, section)
      assert marker not in text
      np.testing.assert_array_equal(y, after + [1])
      np.testing.assert_array_equal(x[is_salient], after)
      assert all(se.N_SPECIAL <= t < se.N_SPECIAL + k for t in after)
      assert (x == marker).sum() == m + n // section
      assert _contains(train_text, np.array(text))


def test_salient_pieces_errors(shared_cache_dir, papers_dir):
  del shared_cache_dir
  for bad in (0, V, True, 2.0):
    with pytest.raises(TerraformerError, match='salient_pieces must be'):
      next(_stream(papers_dir, salient_pieces=bad))
  # 4 salient tokens in each 16-token section, all of them the first piece:
  # no window has that.
  with pytest.raises(TerraformerError, match='first 1 pieces'):
    next(_stream(papers_dir, n_salient=16, declare_every=16,
                 salient_pieces=1))


def test_recorded_positions_and_the_rule_agree(shared_cache_dir, papers_dir):
  del shared_cache_dir
  layout, stream = se.examples(input_len=48, n_salient=6, vocab_size=V,
                               papers_dir=papers_dir, declare_every=16)
  assert (layout.section, layout.per_section, layout.text_len) == (16, 2, 13)
  for x, y, info in itertools.islice(stream, 5):
    np.testing.assert_array_equal(np.flatnonzero(se.salient_positions(x, 16)),
                                  info['salient_pos'])
    np.testing.assert_array_equal(x[info['marker_pos']], info['marker'])
    np.testing.assert_array_equal(y[:-1], x[info['salient_pos']])


def test_deterministic_by_seed_and_split(shared_cache_dir, papers_dir):
  del shared_cache_dir
  take = lambda **kw: list(itertools.islice(_stream(papers_dir, **kw), 2))
  a, b = take(seed=3), take(seed=3)
  for x, y in zip(a, b):
    for u, v in zip(x, y):
      np.testing.assert_array_equal(u, v)
  assert not np.array_equal(a[0][0], take(seed=4)[0][0])
  assert not np.array_equal(a[0][0], take(seed=3, split='validation')[0][0])


@pytest.mark.parametrize('split', ['validation', 'test'])
def test_held_out_splits_read_other_papers(shared_cache_dir, papers_dir,
                                           split):
  del shared_cache_dir
  ids = {s: {p['id'] for p in aclsum_papers.load_split(s, papers_dir)}
         for s in ('train', split)}
  assert ids['train'] and ids[split] and not ids['train'] & ids[split]
  own, train = _split_text(papers_dir, split), _split_text(papers_dir, 'train')
  for inputs, _, _ in itertools.islice(
      _stream(papers_dir, split=split, input_len=32, n_salient=2), 2):
    for x in inputs:
      _, _, text = _read(x, 32)
      assert _contains(own, np.array(text))
      assert not _contains(train, np.array(text))


@pytest.mark.parametrize('kwargs,match', [
    (dict(declare_every=24), 'divides input_len'),
    (dict(declare_every=16, n_salient=6), 'multiple of the 4 sections'),
    (dict(input_len=8, n_salient=6), 'too short'),
    (dict(n_salient=0), 'n_salient'),
    (dict(split='dev'), 'split'),
    (dict(batch_size=0), 'batch_size')])
def test_bad_settings_are_one_line_errors(shared_cache_dir, papers_dir, kwargs,
                                          match):
  del shared_cache_dir
  with pytest.raises(TerraformerError, match=match):
    next(_stream(papers_dir, **kwargs))


def test_indexed_markers_one_id_past_the_vocabulary_per_index(
    shared_cache_dir, papers_dir):
  """The i-th salient token follows the id V + i; each section declares the
  marker of its first salient token; the target is the tokens after the
  markers V, V + 1, ... in order; salient_positions finds them from the
  tokens with markers_from=V."""
  del shared_cache_dir
  n, m, section = 64, 8, 16  # 2 salient tokens a section.
  for inputs, targets, _ in itertools.islice(
      _stream(papers_dir, n_salient=m, declare_every=section,
              indexed_markers=True), 2):
    salient = se.salient_positions(inputs, section, markers_from=V)
    for x, y, is_salient in zip(inputs, targets, salient):
      np.testing.assert_array_equal(x[::section], V + np.arange(0, m, 2))
      assert sum(t < V for t in x) == n - m - n // section
      # Marker V + i: after the declarations, once, before salient token i.
      after = []
      for i in range(m):
        (at,) = [p for p in np.flatnonzero(x == V + i) if p % section]
        after.append(int(x[at + 1]))
        assert x[at + 1] < V
      np.testing.assert_array_equal(y, after + [1])  # ... then EOS.
      np.testing.assert_array_equal(x[is_salient], after)
      # The one-marker rule finds only each section's first salient token.
      np.testing.assert_array_equal(
          x[se.salient_positions(x, section)], after[::2])


def test_indexed_and_fixed_markers_are_exclusive(shared_cache_dir,
                                                 papers_dir):
  del shared_cache_dir
  with pytest.raises(TerraformerError, match='set one'):
    next(_stream(papers_dir, fixed_marker=True, indexed_markers=True))


def test_length_stages_come_first_then_the_stream_without_them(
    shared_cache_dir, papers_dir):
  """Each stage yields its batches at its length, each a valid example of
  that length; after the stages come the batches of the stream without
  stages, unchanged."""
  del shared_cache_dir
  staged = _stream(papers_dir, input_len=64, indexed_markers=True,
                   length_stages=((16, 2), (32, 1)))
  shapes = []
  for inputs, targets, _ in itertools.islice(staged, 3):
    shapes.append(inputs.shape)
    salient = se.salient_positions(inputs, markers_from=V)
    for x, y, is_salient in zip(inputs, targets, salient):
      np.testing.assert_array_equal(x[is_salient], y[:-1])
  assert shapes == [(4, 16), (4, 16), (4, 32)]
  plain = _stream(papers_dir, input_len=64, indexed_markers=True)
  for (x, y, _), (u, v, _) in zip(itertools.islice(staged, 2),
                                  itertools.islice(plain, 2)):
    np.testing.assert_array_equal(x, u)
    np.testing.assert_array_equal(y, v)


def test_a_stage_can_set_its_own_number_of_salient_tokens(
    shared_cache_dir, papers_dir):
  """A stage (input_len, batches, n_salient) yields targets of its own
  n_salient + 1 tokens (indexed markers up to vocab_size + n_salient - 1),
  then the stream's n_salient."""
  del shared_cache_dir
  staged = _stream(papers_dir, input_len=64, n_salient=8,
                   indexed_markers=True,
                   length_stages=((16, 1, 2), (32, 1)))
  seen = []
  for inputs, targets, weights in itertools.islice(staged, 3):
    assert weights.shape == targets.shape
    salient = se.salient_positions(inputs, markers_from=V)
    assert inputs.max() == V + targets.shape[1] - 2
    for x, y, is_salient in zip(inputs, targets, salient):
      np.testing.assert_array_equal(x[is_salient], y[:-1])
    seen.append((inputs.shape[1], targets.shape[1]))
  assert seen == [(16, 3), (32, 9), (64, 9)]


@pytest.mark.parametrize('stages', [((16,),), ((16, 0),), 16, ((16.0, 2),),
                                    ((16, 2, 0),), ((16, 2, 4, 1),)])
def test_bad_length_stages_are_one_line_errors(shared_cache_dir, papers_dir,
                                               stages):
  del shared_cache_dir
  with pytest.raises(TerraformerError, match='length_stages'):
    _stream(papers_dir, length_stages=stages)
