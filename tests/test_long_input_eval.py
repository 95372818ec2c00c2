"""experiments/long_input_eval.py --by_key_position: each answer value counted
at its queried key's input position. Examples from the recall stream's own
maker (terraformer.data.long_range_recall.make_example), whose `info` says
where each fact's key went; the eval finds it from the tokens alone."""
import os
import sys

import gin
import numpy as np
import pytest

from terraformer.data import long_range_recall

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'experiments'))
import long_input_eval  # pylint: disable=wrong-import-position

VOCAB, INPUT_LEN, N_FACTS = 100, 32, 3


@pytest.fixture(name='bind')
def _bind():
  """bind(*extra): the 32-token recall setting's bindings, then `extra`."""
  def bind(*extra):
    gin.clear_config()
    gin.parse_config_files_and_bindings([], [
        f'long_range_recall_stream.n_facts = {N_FACTS}',
        "long_range_recall_stream.link = 'adjacent'", *extra],
        finalize_config=False)
  yield bind
  gin.clear_config()


def _examples(n):
  layout = long_range_recall.Layout(VOCAB, INPUT_LEN, N_FACTS, 8, 8, 8, 1,
                                    link='adjacent')
  rng = np.random.default_rng(0)
  filler = rng.integers(3, VOCAB, size=1000)
  made = [long_range_recall.make_example(rng, filler, layout, eos_id=1)
          for _ in range(n)]
  x = np.stack([m[0] for m in made])
  y = np.stack([m[1] for m in made])
  return x, y, [m[2] for m in made]


def test_each_value_is_counted_at_its_keys_position(bind):
  bind()
  x, y, infos = _examples(40)
  pred = y.copy()
  pred[::2, 0] = 0  # Every other example's first answer wrong.
  counts = {}
  long_input_eval._count_by_key_position(x, y, pred, counts)  # pylint: disable=protected-access
  expected = {}
  for i, info in enumerate(infos):
    for j, fact in enumerate(info['query_order']):
      position = int(info['key_pos'][fact])
      hits, count = expected.get(position, (0, 0))
      expected[position] = (hits + int(not (i % 2 == 0 and j == 0)),
                            count + 1)
  assert counts == expected
  assert sum(c for _, c in counts.values()) == 40 * N_FACTS
  assert sum(h for h, _ in counts.values()) == 40 * N_FACTS - 20
  assert set(counts) <= set(range(0, INPUT_LEN // 2, 2))  # Slots of 2.


@pytest.mark.parametrize('binding, says', [
    ("long_range_recall_stream.link = 'tag'", "link='adjacent'"),
    ('long_range_recall_stream.keyed_answer = True', 'values-only'),
])
def test_other_forms_of_the_task_are_refused(bind, binding, says):
  bind(binding)
  x, y, _ = _examples(2)
  with pytest.raises(SystemExit, match=says):
    long_input_eval._count_by_key_position(x, y, y, {})  # pylint: disable=protected-access
