"""terraformer.evaluation.extraction: the scorer ablation's metrics on
hand-built decodes and selections, and its table."""
import json

import numpy as np
import pytest

from terraformer import errors
from terraformer.evaluation import extraction

E = 1  # EOS


@pytest.mark.parametrize('predicted,gold,f1', [
    ([5, 6, 7], [5, 6, 7], 1.0),
    ([7, 6, 5], [5, 6, 7], 1.0),            # Any order.
    ([5, 6, 7], [5, 7, 8], 2 / 3),          # P = R = 2/3.
    ([5, 5], [5], 2 / 3),                   # Multisets: P 1/2, R 1.
    ([5], [5, 5, 6, 6], 0.4),               # P 1, R 1/4.
    ([], [5], 0.0),
    ([9], [5], 0.0),
    ([], [], 1.0)])
def test_token_f1(predicted, gold, f1):
  assert extraction.token_f1(predicted, gold) == pytest.approx(f1)


def test_selection_hits_count_the_salient_token_or_its_marker():
  salient = np.zeros(24, bool)
  salient[[4, 11, 20]] = True
  # 4: its marker (3) won; 11: itself; 20: neither (18 and 21 won).
  assert extraction.selection_hits([3, 11, 18, 21], salient) == (1, 2)
  assert extraction.selection_hits([4, 11, 20], salient) == (3, 3)
  assert extraction.selection_hits([0, 1], salient) == (0, 0)


def _batch():
  """Two rows of 8 tokens, one section: marker 9 declared at 0; salient
  tokens at 3, 6 (row 0: 5, 7) and 3, 5 (row 1: 6, 8)."""
  inputs = np.array([[9, 2, 9, 5, 4, 9, 7, 3],
                     [9, 4, 9, 6, 9, 8, 2, 3]], np.int32)
  targets = np.array([[5, 7, E], [6, 8, E]], np.int32)
  return inputs, targets, np.ones_like(targets, np.float32)


def test_score_of_hand_built_decodes_and_selections():
  calls = []

  def decode(inputs, target_len):
    calls.append(target_len)
    # Row 0 exact; row 1 writes 8, 6, 4 and no EOS: F1 of {8, 6, 4} and
    # {6, 8} = 2 * (2/3 * 1) / (2/3 + 1) = 0.8, not exact.
    return np.array([[5, 7, E], [8, 6, 4]], np.int32)

  def winners(inputs, targets):
    del inputs, targets
    # Row 0 keeps 3 and 5 (salient 3; 6's marker 5); row 1 keeps 0 and 1.
    return np.array([[3, 5], [0, 1]])

  result = extraction.score([_batch()], decode, winners, E)
  assert calls == [3]
  assert result == dict(examples=2, token_f1=pytest.approx(0.9),
                        exact_match=0.5, recall_salient=0.25,
                        recall_salient_or_marker=0.5)
  unpooled = extraction.score([_batch()], decode, lambda x, y: None, E)
  assert unpooled['recall_salient'] is None
  assert unpooled['recall_salient_or_marker'] is None
  # Exact needs the EOS: the right tokens cut off before it are not.
  cut = extraction.score([_batch()], lambda x, t: np.array([[5, 7], [6, 8]]),
                         lambda x, y: None, E)
  assert cut['exact_match'] == 0.0 and cut['token_f1'] == 1.0
  with pytest.raises(errors.TerraformerError, match='no examples'):
    extraction.score([], decode, winners, E)


def test_score_with_indexed_markers_finds_the_salient_positions_by_id():
  """Markers 20 (declared at 0), 21, 22: salient tokens at 3, 5 and 7.
  The one-marker rule would see only 3."""
  inputs = np.array([[20, 2, 20, 5, 21, 6, 22, 7]], np.int32)
  targets = np.array([[5, 6, 7, E]], np.int32)
  batch = (inputs, targets, np.ones_like(targets, np.float32))
  decode = lambda x, t: np.array([[5, 6, 7, E]], np.int32)
  winners = lambda x, y: np.array([[3, 5, 6]])  # 3, 5 and 7's marker.
  indexed = extraction.score([batch], decode, winners, E, markers_from=20)
  assert indexed['recall_salient'] == pytest.approx(2 / 3)
  assert indexed['recall_salient_or_marker'] == 1.0
  one_marker = extraction.score([batch], decode, winners, E)
  assert one_marker['recall_salient'] == 1.0  # Of 1 position it sees.


def _write_run(folder, scores):
  """scores: {(split, step): (token_f1, exact, recall)}."""
  folder.mkdir(parents=True)
  for (split, step), (f1, em, recall) in scores.items():
    (folder / f'eval_{split}_{step}.json').write_text(json.dumps(dict(
        step=step, token_f1=f1, exact_match=em, recall_salient=recall,
        recall_salient_or_marker=recall)))
  return str(folder)


def test_table_takes_each_runs_test_scores_at_its_best_validation_step(
    tmp_path):
  seed0 = _write_run(tmp_path / 's0', {
      ('validation', 1000): (0.5, 0.1, 0.6), ('test', 1000): (0.4, 0.0, 0.6),
      ('validation', 2000): (0.7, 0.2, 0.8), ('test', 2000): (0.6, 0.1, 0.8),
      ('validation', 3000): (0.7, 0.3, 0.9), ('test', 3000): (0.9, 0.9, 0.9)})
  seed1 = _write_run(tmp_path / 's1', {
      ('validation', 1000): (0.8, 0.4, None), ('test', 1000): (0.8, 0.3, None),
      ('validation', 2000): (0.6, 0.4, None), ('test', 2000): (0.7, 0.5, None)})
  # Equal validation F1 at 2000 and 3000: the earlier step.
  assert extraction.choose_on_validation(seed0)[0] == 2000
  report = {'models': {'linear_4x': [
      {'input_len': 512, 'memory': {'total': 3 * 2 ** 20}, 'step_ms': 812.4},
      {'input_len': 2048, 'memory': {'total': 9 * 2 ** 20}, 'step_ms': None}]}}
  table = extraction.scorers_table([
      ('linear 4x', 'linear_4x', 512, [seed0]),
      ('two seeds', None, 512, [seed0, seed1]),
      ('2048 tokens', 'linear_4x', 2048, [])], report)
  assert table['columns'] == extraction.COLUMNS
  assert table['rows'] == [
      ['linear 4x', '0.600', '0.100', '0.800', '0.800', '812', '3.0', '2000'],
      ['two seeds', '0.700 (0.600, 0.800)', '0.200 (0.100, 0.300)', '0.800',
       '0.800', '-', '-', '2000, 1000'],
      ['2048 tokens', '-', '-', '-', '-', '-', '9.0', '-']]
  with pytest.raises(errors.TerraformerError, match='no step scored'):
    extraction.choose_on_validation(str(tmp_path))
