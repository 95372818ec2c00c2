"""terraformer.evaluation.ood: Table 4 metrics on hand-built predictions, evaluation."""
import functools

import gin
import numpy as np
import pytest

from terraformer import errors
from terraformer.evaluation import ood
from terraformer.data import arithmetic

E = arithmetic.EOS_ID


def _row(*tokens, length=8):
  out = np.zeros(length, np.int32)
  out[:len(tokens)] = tokens
  return out


@pytest.mark.parametrize('prediction, expected', [
    # (prediction tokens, (correct tokens, counted tokens, exact))
    ((5, 6, 7, E), (3, 3, 1)),              # Exact.
    ((5, 9, 7, E), (2, 3, 0)),              # One wrong digit.
    ((5, 6, E), (2, 3, 0)),                 # Early EOS: a missing token.
    ((E,), (0, 3, 0)),                      # Nothing.
    ((5, 6, 7, 8, 9, E), (3, 5, 0)),        # Two extra tokens.
    ((5, 6, 7, 8, 9, 10, 11, 2), (3, 8, 0)),  # Never stops: all extra.
    ((5, 6, 7), (3, 3, 0)),                 # Cut off before EOS: not exact.
    ((6, 7, E), (0, 3, 0)),                 # Shifted: position-wise misses.
    ((5, 6, 7, E, 3, 3), (3, 3, 1)),        # After EOS is ignored.
    ((0, 6, 7, E), (2, 3, 0)),              # Pad before EOS is a token.
])
def test_score_example(prediction, expected):
  score = ood.score_example(np.array(prediction), _row(5, 6, 7, E))
  assert tuple(score) == expected + (1,)


def test_score_batch_pools_tokens_and_skips_padding_rows():
  targets = np.stack([_row(5, 6, 7, E), _row(8, E), _row()])
  weights = (targets > 0).astype(np.float32)
  predictions = np.stack([_row(5, 6, 7, E), _row(8, 9, 9, E), _row(3, 3)])
  score = ood.score_batch(predictions, targets, weights)
  assert score == ood.Score(correct_tokens=4, total_tokens=6,
                            correct_sequences=1, n_sequences=2)
  assert score.token_accuracy == pytest.approx(4 / 6)
  assert score.sequence_accuracy == 0.5
  pooled = score + ood.score_batch(predictions[:1], targets[:1])
  assert pooled.token_accuracy == pytest.approx(7 / 9)
  assert pooled.sequence_accuracy == pytest.approx(2 / 3)
  assert ood.EMPTY_SCORE.token_accuracy == 0.0


def test_score_errors():
  with pytest.raises(errors.TerraformerError, match='no EOS'):
    ood.score_example(_row(5), _row(5, 6))
  with pytest.raises(errors.TerraformerError, match='2 predictions for 1'):
    ood.score_batch(np.zeros((2, 3)), np.ones((1, 3)))


class _Oracle:
  """Stands in for a predict-mode model: it knows the answers."""


def test_evaluate_cell_scores_greedy_decodes(monkeypatch):
  """evaluate_cell feeds each split's inputs to `decoding.decode` and scores
  what it returns against that split's targets (no teacher forcing)."""
  from terraformer.decoding import search as decoding
  stream = functools.partial(
      arithmetic.arithmetic_stream, task='add', train_max_digits=3,
      eval_min_digits=6, eval_max_digits=8)
  calls = []

  def fake_decode(model, inputs, max_length, **kwargs):
    calls.append((inputs.shape, max_length, kwargs['method']))
    out = np.zeros((len(inputs), max_length), np.int32)
    for i, row in enumerate(inputs):
      if not row.any():
        continue  # A padding row.
      text = arithmetic.to_text(row)
      a, b = text.split('+')
      answer = arithmetic.to_tokens(str(int(a) + int(b)), True)
      if len(a) == 7:  # Wrong last digit on some OOD rows.
        answer[-2] = 2 if answer[-2] != 2 else 3
      out[i, :len(answer)] = answer
    return out

  monkeypatch.setattr(decoding, 'decode', fake_decode)
  monkeypatch.setattr(ood, 'predict_model', lambda *args: _Oracle())
  scores = ood.evaluate_cell(None, None, stream=stream, n_examples=10,
                             batch_size=4)
  assert calls[0] == ((4, 8), 5, 'greedy')  # Validation: 3-digit numbers.
  assert calls[-1] == ((4, 18), 10, 'greedy')  # OOD: 8-digit numbers.
  assert len(calls) == 6
  assert scores['validation'].n_sequences == 10
  assert scores['validation'].sequence_accuracy == 1.0
  assert scores['validation'].token_accuracy == 1.0
  ood_score = scores['ood']
  batches = stream(split='ood', repeat=False, n_examples=10, batch_size=4)
  texts = [arithmetic.to_text(x) for b in batches for x in b[0] if x.any()]
  n_wrong = sum(len(t.split('+')[0]) == 7 for t in texts)
  assert 0 < n_wrong < 10
  assert ood_score.n_sequences == 10
  assert ood_score.correct_sequences == 10 - n_wrong
  assert ood_score.total_tokens - ood_score.correct_tokens == n_wrong


def test_format_table():
  def result(task, model, token, seq, seed=0, in_dist=1.0):
    scores = {'ood': {'token_accuracy': token, 'sequence_accuracy': seq},
              'validation': {'token_accuracy': in_dist,
                             'sequence_accuracy': 1.0}}
    return {'cell': f'{task}_{model}', 'task': task, 'model': model,
            'parameters': 1234, 'steps': 10, 'train_seconds': 1.0,
            'eval_seconds': 2.0, 'scores': scores,
            'settings': {'train_digits': [1, 4], 'eval_digits': [8, 9],
                         'seed': seed}}
  table = ood.format_table([
      result('copy', 'transformer', 0.798, 0.0),
      result('add', 'transformer', 0.364, 0.0, in_dist=0.5),
      result('copy', 'terraformer_sru', 0.999, 0.939),
      result('copy', 'terraformer_sru', 0.899, 0.741, seed=1, in_dist=0.9)])
  lines = table.splitlines()
  assert lines[0] == ('| Model | copy | copy (seq) | add | add (seq) | '
                      'copy in-dist. | add in-dist. |')
  assert lines[2] == ('| Transformer | 79.8% | 0.0% | 36.4% | 0.0% | '
                      '100.0% | 50.0% |')
  # Two seeds: their mean, then each seed's value.
  assert lines[3] == ('| Terraformer (low-rank SRU) | 94.9% (99.9, 89.9) | '
                      '84.0% (93.9, 74.1) |  |  | 95.0% (100.0, 90.0) |  |')
  assert '| copy_transformer | 0 | 1,234 | 10 | 1-4 | 8-9 | 100.0% |' in table
  assert '| copy_terraformer_sru | 1 | 1,234 | 10 | 1-4 | 8-9 | 90.0% |' in (
      table)


def test_cell_config_file(tmp_path):
  name, path = ood.cell_config_file('copy_transformer', 'gin')
  assert name == 'copy_transformer' and path.endswith('copy_transformer.gin')
  custom = tmp_path / 'add_tiny.gin'
  custom.write_text('')
  assert ood.cell_config_file(str(custom), 'gin')[0] == 'add_tiny'
  with pytest.raises(errors.TerraformerError, match='no gin file'):
    ood.cell_config_file('copy_nothing', 'gin')
