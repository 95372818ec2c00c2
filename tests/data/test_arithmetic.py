"""terraformer.data.arithmetic: copy/addition streams for Table 4."""
import itertools

import gin
import numpy as np
import pytest

from terraformer.data import arithmetic
from terraformer.errors import TerraformerError

LENGTHS = dict(train_min_digits=1, train_max_digits=6, eval_min_digits=12,
               eval_max_digits=15)


def _stream(**kwargs):
  return arithmetic.arithmetic_stream(**dict(dict(LENGTHS, batch_size=8),
                                             **kwargs))


def _examples(batches):
  """(input text, target text, digit counts) of each real row, natural order."""
  for inputs, targets, weights in batches:
    for x, y, w in zip(inputs, targets, weights):
      if w.any():
        yield (arithmetic.to_text(x), arithmetic.to_text(y), x, y, w)


def test_vocabulary_round_trip():
  assert arithmetic.encode('0123456789+') == list(range(2, 12)) + [12]
  assert arithmetic.VOCAB_SIZE == 13
  assert arithmetic.decode([4, 3, 12, 2, 1, 7, 7]) == '21+0'
  assert arithmetic.to_tokens('12+345', reverse_digits=True) == (
      arithmetic.encode('21+543') + [arithmetic.EOS_ID])
  assert arithmetic.to_text(arithmetic.to_tokens('12+345', True)) == '12+345'
  with pytest.raises(TerraformerError, match='only digits'):
    arithmetic.encode('1-2')


@pytest.mark.parametrize('split', ['train', 'validation', 'ood'])
def test_add_targets_are_the_true_sums(split):
  lo, hi = ((12, 15) if split == 'ood' else (1, 6))
  examples = list(_examples(itertools.islice(
      _stream(task='add', split=split), 20)))
  assert len(examples) == 160
  counts = set()
  for text, target, x, y, w in examples:
    a, b = text.split('+')
    assert int(target) == int(a) + int(b)
    assert target == str(int(a) + int(b))  # No leading zeros.
    for number in (a, b):
      assert lo <= len(number) <= hi
      assert len(number) == 1 or number[0] != '0'
      counts.add(len(number))
    # Lower-endian tokens: the first target token is the units digit.
    assert arithmetic.decode(y[:1]) == target[-1]
    # Weights: 1 on the digits and the EOS, 0 on padding.
    n_target = len(target) + 1
    np.testing.assert_array_equal(w, np.arange(len(w)) < n_target)
    assert y[n_target - 1] == arithmetic.EOS_ID and not y[n_target:].any()
    n_input = len(text) + 1
    assert x[n_input - 1] == arithmetic.EOS_ID and not x[n_input:].any()
  assert counts == set(range(lo, hi + 1))  # The whole range is drawn.


def test_copy_targets_equal_inputs_and_shapes_are_fixed():
  for split, n_digits in (('train', 6), ('ood', 15)):
    batches = list(itertools.islice(_stream(task='copy', split=split), 10))
    for inputs, targets, weights in batches:
      assert inputs.shape == targets.shape == weights.shape == (8, n_digits + 1)
      assert inputs.dtype == targets.dtype == np.int32
      assert weights.dtype == np.float32
      np.testing.assert_array_equal(inputs, targets)
      np.testing.assert_array_equal(weights, targets > 0)


def test_add_shapes_fit_the_longest_example():
  inputs, targets, weights = next(_stream(task='add', split='ood'))
  assert inputs.shape == (8, 2 * 15 + 2)  # x + y EOS
  assert targets.shape == weights.shape == (8, 15 + 2)  # carry digit, EOS


def test_pad_to_multiple():
  inputs, targets, weights = next(_stream(task='add', split='ood',
                                          pad_to_multiple=8))
  assert inputs.shape == (8, 32) and targets.shape == weights.shape == (8, 24)
  assert weights.sum(axis=1).max() <= 17


def test_natural_order_option():
  inputs, targets, _ = next(_stream(task='add', reverse_digits=False))
  for x, y in zip(inputs, targets):
    a, b = arithmetic.decode(x).split('+')
    assert arithmetic.decode(y) == str(int(a) + int(b))


def test_splits_and_seeds():
  first = lambda **kw: next(_stream(task='copy', **kw))[0]
  np.testing.assert_array_equal(first(seed=3), first(seed=3))
  assert not np.array_equal(first(seed=3), first(seed=4))
  assert not np.array_equal(first(split='train'), first(split='validation'))


def test_finite_pass_pads_last_batch():
  batches = list(_stream(task='add', split='ood', repeat=False, n_examples=19))
  assert len(batches) == 3
  weights = np.concatenate([b[2] for b in batches])
  assert weights.any(axis=1).sum() == 19
  assert not batches[-1][0][3:].any() and not batches[-1][2][3:].any()


@pytest.mark.parametrize('kwargs, message', [
    (dict(eval_min_digits=11), 'at least 2 x train_max_digits=6'),
    (dict(train_max_digits=8), 'out of distribution'),
    (dict(train_min_digits=7), 'train_min_digits=7 > train_max_digits=6'),
    (dict(eval_max_digits=11), 'eval_min_digits=12 > eval_max_digits=11'),
    (dict(train_min_digits=0), 'train_min_digits must be a positive'),
    (dict(eval_max_digits=2.5), 'eval_max_digits must be a positive'),
    (dict(task='multiply'), 'task must be one of'),
    (dict(split='test'), 'split must be one of'),
    (dict(batch_size=0), 'batch_size'),
    (dict(pad_to_multiple=0), 'pad_to_multiple'),
    (dict(repeat=False), 'n_examples'),
])
def test_bad_settings_are_rejected_on_every_split(kwargs, message):
  for split in ('train', 'ood'):
    args = dict(dict(split=split), **kwargs)
    with pytest.raises(TerraformerError, match=message):
      _stream(**args)


def test_gin_configurable():
  gin.clear_config()
  try:
    gin.parse_config("""
        import terraformer.data
        arithmetic_stream.task = 'add'
        arithmetic_stream.train_max_digits = 3
        arithmetic_stream.eval_min_digits = 6
        arithmetic_stream.eval_max_digits = 7
        arithmetic_stream.batch_size = 2
        ood/arithmetic_stream.split = 'ood'
    """)
    with gin.config_scope('ood'):
      inputs, targets, _ = next(arithmetic.arithmetic_stream())
    assert inputs.shape == (2, 16) and targets.shape == (2, 9)
  finally:
    gin.clear_config()
