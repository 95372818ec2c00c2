"""Fixtures: a tiny synthetic S2ORC corpus and isolated cache dirs."""
import pytest

import synthetic_papers


@pytest.fixture(scope='session')
def papers_dir(tmp_path_factory):
  return synthetic_papers.make_corpus(tmp_path_factory.mktemp('papers'))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
  """A fresh, empty TERRAFORMER_CACHE_DIR for one test."""
  path = tmp_path / 'cache'
  monkeypatch.setenv('TERRAFORMER_CACHE_DIR', str(path))
  return path


@pytest.fixture(scope='session')
def _shared_cache(tmp_path_factory):
  return tmp_path_factory.mktemp('shared_cache')


@pytest.fixture
def shared_cache_dir(_shared_cache, monkeypatch):
  """A cache dir shared across tests (the tiny vocab is trained once)."""
  monkeypatch.setenv('TERRAFORMER_CACHE_DIR', str(_shared_cache))
  return _shared_cache
