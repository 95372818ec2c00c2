"""Tests for terraformer.data.long_range_recall."""
import itertools
import os

import gin
import numpy as np
import pytest

from terraformer.data import long_range_recall as lrr
from terraformer.errors import TerraformerError
import synthetic_papers

V = synthetic_papers.VOCAB_SIZE
SYMBOLS = dict(n_keys=8, n_tags=8, n_values=8)
GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'gin')


def _stream(papers_dir, **kwargs):
  kwargs = dict(dict(input_len=64, n_facts=3, batch_size=4, vocab_size=V,
                     papers_dir=papers_dir, **SYMBOLS), **kwargs)
  return lrr.long_range_recall_stream(**kwargs)


def _solve(inputs, n_facts):
  """Reads the answer off one input alone: parses facts and queries.

  Symbol ids (>= V) are: query mark V, keys V+1.., tags, values (SYMBOLS).
  Returns (target without EOS, {key: key position}, {key: value position}).
  """
  keys = set(range(V + 1, V + 1 + SYMBOLS['n_keys']))
  tags = set(range(V + 1 + SYMBOLS['n_keys'],
                   V + 1 + SYMBOLS['n_keys'] + SYMBOLS['n_tags']))
  query_at = int(np.flatnonzero(inputs == V)[0])
  queries = inputs[query_at + 1:query_at + 1 + n_facts]
  tag_of_key, key_pos, value_of_tag, value_pos = {}, {}, {}, {}
  for i in range(query_at):
    token = int(inputs[i])
    if token in keys:
      tag_of_key[token], key_pos[token] = int(inputs[i + 1]), i
    elif token in tags and int(inputs[i + 1]) not in tags and (
        i == 0 or int(inputs[i - 1]) not in keys):
      value_of_tag[token], value_pos[token] = int(inputs[i + 1]), i + 1
  answer = [value_of_tag[tag_of_key[int(k)]] for k in queries]
  return (np.array(answer), key_pos,
          {k: value_pos[t] for k, t in tag_of_key.items()}, queries)


def test_deterministic_by_seed_and_split(shared_cache_dir, papers_dir):
  del shared_cache_dir
  take = lambda **kw: list(itertools.islice(_stream(papers_dir, **kw), 3))
  a, b = take(seed=3), take(seed=3)
  for x, y in zip(a, b):
    for u, v in zip(x, y):
      np.testing.assert_array_equal(u, v)
  assert not np.array_equal(a[0][0], take(seed=4)[0][0])
  assert not np.array_equal(a[0][0], take(seed=3, split='validation')[0][0])


def test_answer_is_in_the_input_across_halves(shared_cache_dir, papers_dir):
  del shared_cache_dir
  n, length = 3, 64
  reordered = 0
  for inputs, targets, weights in itertools.islice(
      _stream(papers_dir, n_facts=n, input_len=length), 5):
    assert inputs.shape == (4, length) and targets.shape == (4, n + 1)
    assert inputs.dtype == targets.dtype == np.int32
    np.testing.assert_array_equal(weights, 1.0)
    for x, y in zip(inputs, targets):
      answer, key_pos, value_pos, queries = _solve(x, n)
      np.testing.assert_array_equal(y[:-1], answer)
      assert y[-1] == x[-1] == 1  # EOS
      assert len(key_pos) == n
      for key in key_pos:  # Key in the first half, its value in the second.
        assert key_pos[key] < length // 2 <= value_pos[key]
      order_in_input = sorted(key_pos, key=key_pos.get)
      reordered += list(queries) != order_in_input
      # Filler is text: every other token is a vocabulary piece.
      assert (x < V).sum() == length - (n * 2 + n * 2 + n + 1)
  assert reordered == 20  # Never queried in the order of appearance.


def test_adjacent_facts_sit_in_the_first_half(shared_cache_dir, papers_dir):
  """link='adjacent': `K_j V_j` side by side in the first half, filler only
  in the second half, and the queried keys' values as the target."""
  del shared_cache_dir
  n, length = 3, 64
  keys = range(V + 1, V + 1 + SYMBOLS['n_keys'])
  for inputs, targets, _ in itertools.islice(
      _stream(papers_dir, n_facts=n, input_len=length, link='adjacent'), 5):
    for x, y in zip(inputs, targets):
      query_at = int(np.flatnonzero(x == V)[0])
      assert query_at == length - n - 2
      value_of = {int(x[i]): int(x[i + 1]) for i in range(query_at)
                  if x[i] in keys}
      assert len(value_of) == n
      assert all(i < length // 2 for i in range(query_at) if x[i] >= V)
      assert (x[length // 2:query_at] < V).all()  # Region B: filler.
      queries = x[query_at + 1:query_at + 1 + n]
      np.testing.assert_array_equal(y[:-1], [value_of[int(k)] for k in queries])
      assert (x < V).sum() == length - (2 * n + 1 + n)  # Facts, Q, keys.


def test_fused_facts_are_one_token_each_in_the_first_half(shared_cache_dir,
                                                         papers_dir):
  """link='fused': fact (key i, value j) is the one id V + 1 + 3*8 + 8*i + j
  (after the query mark, keys, tags and values) in the first half; the target
  is the queried keys' values."""
  del shared_cache_dir
  n, length = 3, 64
  fused_base = V + 1 + 3 * 8
  seen = set()
  for inputs, targets, _ in itertools.islice(
      _stream(papers_dir, n_facts=n, input_len=length, link='fused'), 5):
    for x, y in zip(inputs, targets):
      query_at = int(np.flatnonzero(x == V)[0])
      assert query_at == length - n - 2
      facts = [int(t) - fused_base for t in x[:query_at] if t >= V]
      assert len(facts) == n and min(facts) >= 0
      assert all(i < length // 2 for i in range(query_at) if x[i] >= V)
      value_of = {V + 1 + f // 8: V + 1 + 2 * 8 + f % 8 for f in facts}
      queries = x[query_at + 1:query_at + 1 + n]
      assert sorted(queries) == sorted(value_of)  # Every fact is queried.
      np.testing.assert_array_equal(y[:-1], [value_of[int(k)] for k in queries])
      assert (x < V).sum() == length - (n + 1 + n)  # Facts, Q, keys.
      seen.update(facts)
  assert len(seen) > 20  # Many (key, value) ids, not a few.
  assert lrr.model_vocab_size(V, 8, 8, 8, 'fused') == fused_base + 64
  with pytest.raises(TerraformerError, match='value_len'):
    _stream(papers_dir, link='fused', value_len=2)


@pytest.mark.parametrize('link', ['tag', 'adjacent', 'fused'])
def test_keyed_answer_repeats_each_queried_key_with_weight_0(
    shared_cache_dir, papers_dir, link):
  del shared_cache_dir
  n = 3
  plain = next(_stream(papers_dir, n_facts=n, seed=2, link=link))
  keyed = next(_stream(papers_dir, n_facts=n, seed=2, link=link,
                       keyed_answer=True))
  np.testing.assert_array_equal(keyed[0], plain[0])  # Same inputs.
  query_at = int(np.flatnonzero(plain[0][0] == V)[0])
  queries = plain[0][:, query_at + 1:query_at + 1 + n]
  np.testing.assert_array_equal(keyed[1][:, 0:-1:2], queries)
  np.testing.assert_array_equal(keyed[1][:, 1::2], plain[1][:, :-1])  # Values.
  np.testing.assert_array_equal(keyed[1][:, -1], plain[1][:, -1])  # EOS.
  np.testing.assert_array_equal(keyed[2][0], [0, 1, 0, 1, 0, 1, 1])
  scored = next(_stream(papers_dir, n_facts=n, seed=2, link=link,
                        keyed_answer=True, key_weight=0.5))
  np.testing.assert_array_equal(scored[1], keyed[1])
  np.testing.assert_array_equal(scored[2][0], [.5, 1, .5, 1, .5, 1, 1])
  tokens, _, weights = next(lrr.long_range_recall_lm_stream(
      seq_len=71, n_facts=n, batch_size=4, vocab_size=V, papers_dir=papers_dir,
      seed=2, link=link, keyed_answer=True, **SYMBOLS))
  np.testing.assert_array_equal(tokens[:, :64], plain[0])
  np.testing.assert_array_equal(tokens[:, 64:], keyed[1])
  np.testing.assert_array_equal(weights[:, 64:], keyed[2])
  np.testing.assert_array_equal(weights[:, :64], 0.0)


def test_lm_stream_is_input_then_target(shared_cache_dir, papers_dir):
  del shared_cache_dir
  n, seq_len = 3, 68
  tokens, targets, weights = next(lrr.long_range_recall_lm_stream(
      seq_len=seq_len, n_facts=n, batch_size=2, vocab_size=V,
      papers_dir=papers_dir, **SYMBOLS))
  np.testing.assert_array_equal(tokens, targets)
  assert tokens.shape == weights.shape == (2, seq_len)
  np.testing.assert_array_equal(weights[:, :-(n + 1)], 0.0)
  np.testing.assert_array_equal(weights[:, -(n + 1):], 1.0)
  for row in tokens:
    inputs = row[:-(n + 1)]
    answer = _solve(inputs, n)[0]
    np.testing.assert_array_equal(row[-(n + 1):-1], answer)


@pytest.mark.parametrize('kwargs, message', [
    (dict(n_facts=1), 'n_facts'),
    (dict(n_facts=9), 'n_keys'),
    (dict(input_len=16), 'too short'),
    (dict(split='dev'), 'split'),
    (dict(batch_size=0), 'batch_size'),
    (dict(link='key'), 'link'),
    (dict(key_weight=1.0), 'key_weight'),
    (dict(keyed_answer=True, key_weight=-1.0), 'key_weight'),
])
def test_bad_settings_are_one_clear_error(shared_cache_dir, papers_dir,
                                          kwargs, message):
  del shared_cache_dir
  with pytest.raises(TerraformerError, match=message):
    _stream(papers_dir, **kwargs)


def test_gin_model_vocab_matches_the_stream():
  from terraformer import config  # pylint: disable=g-import-not-at-top
  from terraformer.cli import common  # pylint: disable=g-import-not-at-top
  common.setup()
  config.parse_gin([os.path.join(GIN_DIR, 'long_input', 'full.gin')], [])
  try:
    def q(name):
      value = gin.query_parameter(name)
      while isinstance(value, gin.config.ConfigurableReference):  # A macro.
        value = value.scoped_configurable_fn()
      return value
    need = lrr.model_vocab_size(
        q('long_range_recall_stream.vocab_size'),
        q('long_range_recall_stream.n_keys'),
        q('long_range_recall_stream.n_tags'),
        q('long_range_recall_stream.n_values'))
    assert q('ScalingTransformer.input_vocab_size') == need
  finally:
    gin.clear_config()


def test_pyramidion_pairing_trains_a_few_steps(shared_cache_dir, papers_dir,
                                               tmp_path):
  """gin/long_input/pyramidion.gin trains on the stream (synthetic corpus)."""
  del shared_cache_dir
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  from terraformer import config  # pylint: disable=g-import-not-at-top
  from terraformer.cli import common  # pylint: disable=g-import-not-at-top
  common.setup()
  need = lrr.model_vocab_size(V, **SYMBOLS)
  config.parse_gin(
      [os.path.join(GIN_DIR, 'long_input', 'pyramidion.gin')],
      [f'VOCAB_SIZE = {V}', f'MODEL_VOCAB = {need}', 'INPUT_LEN = 256',
       'N_FACTS = 3', f"long_range_recall_stream.papers_dir = '{papers_dir}'",
       'long_range_recall_stream.batch_size = 2',
       *[f'long_range_recall_stream.{k} = {v}' for k, v in SYMBOLS.items()],
       'terraformer.train.steps = 2', 'terraformer.train.eval_every = 2',
       'terraformer.train.eval_batches = 1',
       'terraformer.train.checkpoint_every = 2'])
  try:
    training.train(str(tmp_path / 'run'))
  finally:
    gin.clear_config()
  assert os.path.exists(tmp_path / 'run' / 'model.pkl.gz')


def test_targets_pad_with_zero_weight(shared_cache_dir, papers_dir):
  del shared_cache_dir
  plain = next(_stream(papers_dir, seed=5))
  padded = next(_stream(papers_dir, seed=5, target_pad_to=8))
  np.testing.assert_array_equal(plain[0], padded[0])
  np.testing.assert_array_equal(padded[1][:, :4], plain[1])
  np.testing.assert_array_equal(padded[1][:, 4:], 0)
  np.testing.assert_array_equal(padded[2][:, :4], 1.0)
  np.testing.assert_array_equal(padded[2][:, 4:], 0.0)
  with pytest.raises(TerraformerError, match='target_pad_to'):
    _stream(papers_dir, target_pad_to=3)
