"""Tests for terraformer.data.vocab."""
import os
import shutil

import pytest
import sentencepiece as spm

from terraformer.data import aclsum_papers
from terraformer.data import vocab as vocab_lib
from terraformer.errors import TerraformerError
import synthetic_papers

V = synthetic_papers.VOCAB_SIZE


def _forbid_training(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError('vocab was retrained')
  monkeypatch.setattr(vocab_lib, '_train', fail)


def test_trains_with_t5_special_ids_and_requested_size(cache_dir, papers_dir):
  vocab = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  assert vocab.vocab_size == V
  sp = spm.SentencePieceProcessor(model_file=vocab.path)
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert sp.get_piece_size() == V
  assert (vocab.pad_id, vocab.eos_id) == (0, 1)


def test_cache_file_is_in_cache_dir_and_names_size_and_corpus(
    cache_dir, papers_dir):
  vocab = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  corpus = aclsum_papers.corpus_name(
      aclsum_papers.load_papers(papers_dir), papers_dir)
  assert os.path.dirname(vocab.path) == str(cache_dir)
  name = os.path.basename(vocab.path)
  assert str(V) in name and corpus in name
  assert os.listdir(cache_dir) == [name]  # No temp files left behind.


def test_round_trip(shared_cache_dir, papers_dir):
  vocab = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  text = aclsum_papers.load_split('test', papers_dir)[0]['abstract']
  ids = vocab.encode(text)
  assert ids and all(isinstance(i, int) and 0 <= i < V for i in ids)
  assert vocab.eos_id not in ids
  assert vocab.decode(ids) == text
  assert vocab.encode_batch([text, text]) == [ids, ids]


def test_cached_vocab_is_reused_not_retrained(
    cache_dir, papers_dir, monkeypatch):
  first = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  mtime = os.stat(first.path).st_mtime_ns
  _forbid_training(monkeypatch)
  second = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  assert second.path == first.path
  assert os.stat(second.path).st_mtime_ns == mtime
  assert second.model_bytes == first.model_bytes


def test_other_size_or_corpus_gets_its_own_cache_file(
    cache_dir, papers_dir, tmp_path):
  a = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  b = vocab_lib.get_vocab(V + 20, papers_dir=papers_dir)
  other = synthetic_papers.make_corpus(tmp_path / 'other', seed=1)
  c = vocab_lib.get_vocab(V, papers_dir=other)
  assert len({a.path, b.path, c.path}) == 3
  assert (b.vocab_size, c.vocab_size) == (V + 20, V)


def test_interrupted_write_leaves_no_cache(cache_dir, papers_dir, monkeypatch):
  def interrupted(src, dst):
    raise KeyboardInterrupt
  with monkeypatch.context() as m:
    m.setattr(os, 'replace', interrupted)
    with pytest.raises(KeyboardInterrupt):
      vocab_lib.get_vocab(V, papers_dir=papers_dir)
  assert not os.listdir(cache_dir)
  # The next call trains again and succeeds.
  assert vocab_lib.get_vocab(V, papers_dir=papers_dir).vocab_size == V


def test_user_vocab_path_is_used_without_training(
    shared_cache_dir, papers_dir, tmp_path, monkeypatch):
  trained = vocab_lib.get_vocab(V, papers_dir=papers_dir)
  user_path = str(tmp_path / 'user.model')
  shutil.copy(trained.path, user_path)
  _forbid_training(monkeypatch)
  user = vocab_lib.get_vocab(V, vocab_path=user_path)
  assert user.path == user_path
  assert user.encode('kalo mine') == trained.encode('kalo mine')


def test_missing_user_vocab_raises(cache_dir, tmp_path):
  with pytest.raises(TerraformerError, match='not found.*missing.model'):
    vocab_lib.get_vocab(V, vocab_path=str(tmp_path / 'missing.model'))


def test_invalid_user_vocab_raises(cache_dir, tmp_path):
  path = tmp_path / 'broken.model'
  path.write_bytes(b'not a sentencepiece model')
  with pytest.raises(TerraformerError, match='broken.model'):
    vocab_lib.get_vocab(V, vocab_path=str(path))


def test_vocab_size_mismatch_raises(shared_cache_dir, papers_dir, monkeypatch):
  path = vocab_lib.get_vocab(V, papers_dir=papers_dir).path
  with pytest.raises(TerraformerError, match=f'vocab_size={V}'):
    vocab_lib.get_vocab(V + 1, vocab_path=path)


def test_too_large_vocab_for_corpus_raises(cache_dir, papers_dir):
  with pytest.raises(TerraformerError, match='SentencePiece training'):
    vocab_lib.get_vocab(50_000, papers_dir=papers_dir)
  assert not cache_dir.exists() or not os.listdir(cache_dir)


def test_cache_dir_defaults_to_home(monkeypatch, tmp_path):
  monkeypatch.delenv('TERRAFORMER_CACHE_DIR', raising=False)
  monkeypatch.setenv('HOME', str(tmp_path))
  assert vocab_lib.cache_dir() == str(tmp_path / '.cache' / 'terraformer')
