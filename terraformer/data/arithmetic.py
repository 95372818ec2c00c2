"""Synthetic copy and addition of long decimal numbers (§4.3, Table 4).

The paper trains on numbers of at most 128 digits and evaluates on 256-300
digits; every length here is a gin setting, and the settings are checked to
keep the evaluation lengths at least `MIN_OOD_FACTOR` times the longest
training number.

Vocabulary (13 symbols): pad 0, EOS 1, digits '0'..'9' are 2..11, '+' is 12.

Examples (encoder-decoder contract, EOS after inputs and targets):
  copy: inputs `x`,     targets `x`
  add:  inputs `x+y`,   targets `x+y` evaluated, e.g. '17+5' -> '22'.
The paper does not give its formatting; we follow Trax's `addition_inputs`
(from the paper's authors' library), which writes every number lower-endian
(least significant digit first), so a sum's digit depends only on digits at
the same or earlier positions: with `reverse_digits=True` (default), the
number 1234 is the token sequence 4 3 2 1. Copy uses the same convention.

A number of `d` digits has a non-zero leading digit (unless d == 1); the
digit counts of each number are uniform in the split's range, independently
for the two addends.
"""
import gin
import numpy as np

from terraformer.errors import TerraformerError

PAD_ID = 0
EOS_ID = 1
PLUS_ID = 12
VOCAB_SIZE = 13
TASKS = ('copy', 'add')
SPLITS = ('train', 'validation', 'ood')  # validation: training lengths.
MIN_OOD_FACTOR = 2  # Evaluation lengths are at least 2x the training ones.

_CHAR_TO_ID = {str(d): d + 2 for d in range(10)}
_CHAR_TO_ID['+'] = PLUS_ID
_ID_TO_CHAR = {i: c for c, i in _CHAR_TO_ID.items()}


def encode(text):
  """'12+3' -> [3, 4, 12, 5] (no EOS); raises on other characters."""
  try:
    return [_CHAR_TO_ID[c] for c in text]
  except KeyError as e:
    raise TerraformerError(
        f'cannot encode {e.args[0]!r}: only digits and "+"') from None


def decode(ids):
  """Token ids -> text, stopping at the first EOS; pad shown as '_'."""
  chars = []
  for i in np.asarray(ids).reshape(-1).tolist():
    if i == EOS_ID:
      break
    chars.append(_ID_TO_CHAR.get(i, '_'))
  return ''.join(chars)


def to_text(ids, reverse_digits=True):
  """Inverse of `to_tokens`: ids (up to EOS) -> numbers in natural order."""
  text = decode(ids)
  if reverse_digits:
    text = '+'.join(number[::-1] for number in text.split('+'))
  return text


def input_and_target_lengths(task, max_digits):
  """Token lengths (EOS included) of the longest input and target."""
  if task == 'copy':
    return max_digits + 1, max_digits + 1
  return 2 * max_digits + 2, max_digits + 2  # The sum may gain a digit.


def check_lengths(task, train_min_digits, train_max_digits, eval_min_digits,
                  eval_max_digits):
  """Raises TerraformerError unless the settings make an OOD benchmark."""
  if task not in TASKS:
    raise TerraformerError(f'task must be one of {TASKS}, got {task!r}')
  values = dict(train_min_digits=train_min_digits,
                train_max_digits=train_max_digits,
                eval_min_digits=eval_min_digits,
                eval_max_digits=eval_max_digits)
  for name, value in values.items():
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise TerraformerError(
          f'{name} must be a positive integer, got {value!r}')
  if train_min_digits > train_max_digits:
    raise TerraformerError(
        f'train_min_digits={train_min_digits} > '
        f'train_max_digits={train_max_digits}')
  if eval_min_digits > eval_max_digits:
    raise TerraformerError(
        f'eval_min_digits={eval_min_digits} > '
        f'eval_max_digits={eval_max_digits}')
  if eval_min_digits < MIN_OOD_FACTOR * train_max_digits:
    raise TerraformerError(
        f'evaluation lengths must be out of distribution: eval_min_digits='
        f'{eval_min_digits} must be at least {MIN_OOD_FACTOR} x '
        f'train_max_digits={train_max_digits} '
        f'(= {MIN_OOD_FACTOR * train_max_digits})')


def random_number(rng, n_digits):
  """A uniformly random decimal string of exactly `n_digits` digits."""
  digits = rng.integers(0, 10, size=n_digits)
  if n_digits > 1:
    digits[0] = rng.integers(1, 10)
  return ''.join(map(str, digits))


def make_example(task, rng, min_digits, max_digits):
  """Returns (input text, target text), most significant digit first."""
  x = random_number(rng, int(rng.integers(min_digits, max_digits + 1)))
  if task == 'copy':
    return x, x
  y = random_number(rng, int(rng.integers(min_digits, max_digits + 1)))
  return f'{x}+{y}', str(int(x) + int(y))


def to_tokens(text, reverse_digits):
  """Text -> ids + [EOS]; with `reverse_digits`, each number lower-endian."""
  if reverse_digits:
    text = '+'.join(number[::-1] for number in text.split('+'))
  return encode(text) + [EOS_ID]


def _pad(rows, length):
  out = np.zeros((len(rows), length), np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


@gin.configurable(module='terraformer.data')
def arithmetic_stream(task='copy', split='train', train_min_digits=1,
                      train_max_digits=128, eval_min_digits=256,
                      eval_max_digits=300, batch_size=32, reverse_digits=True,
                      seed=0, repeat=True, n_examples=None,
                      pad_to_multiple=1):
  """Returns a generator of `(inputs, targets, weights)` batches.

  Args:
    task: 'copy' (copy a number) or 'add' (add two numbers).
    split: 'train' and 'validation' draw numbers of `train_min_digits` to
      `train_max_digits` digits (different seeds); 'ood' draws
      `eval_min_digits` to `eval_max_digits`. All four are checked on every
      split: `eval_min_digits >= MIN_OOD_FACTOR * train_max_digits`.
    train_min_digits: fewest digits of a training number.
    train_max_digits: most digits of a training number.
    eval_min_digits: fewest digits of an out-of-distribution number.
    eval_max_digits: most digits of an out-of-distribution number.
    batch_size: examples per batch.
    reverse_digits: write numbers least significant digit first (Trax's
      `addition_inputs` convention).
    seed: random seed; each split draws from its own stream of it.
    repeat: endless stream (True) or `n_examples` examples then stop.
    n_examples: with `repeat=False`, how many examples (the last batch is
      padded with all-zero rows of zero weight).
    pad_to_multiple: round the padded lengths Lin and Lt up to a multiple of
      this (e.g. the LSH chunk length).

  Returns:
    A generator of int32 inputs `(batch_size, Lin)`, int32 targets and
    float32 weights `(batch_size, Lt)`, weights 1 on target digits and EOS.
    Lin and Lt are fixed per split: those of the longest possible example
    (rounded up to `pad_to_multiple`).
  """
  check_lengths(task, train_min_digits, train_max_digits, eval_min_digits,
                eval_max_digits)
  if split not in SPLITS:
    raise TerraformerError(f'split must be one of {SPLITS}, got {split!r}')
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or (
      batch_size <= 0):
    raise TerraformerError(
        f'batch_size must be a positive integer, got {batch_size!r}')
  if isinstance(pad_to_multiple, bool) or not isinstance(
      pad_to_multiple, int) or pad_to_multiple <= 0:
    raise TerraformerError(
        f'pad_to_multiple must be a positive integer, got {pad_to_multiple!r}')
  if not repeat and (not isinstance(n_examples, int) or n_examples <= 0):
    raise TerraformerError(
        f'repeat=False needs n_examples > 0, got {n_examples!r}')
  if split == 'ood':
    min_digits, max_digits = eval_min_digits, eval_max_digits
  else:
    min_digits, max_digits = train_min_digits, train_max_digits
  input_len, target_len = (
      -(-n // pad_to_multiple) * pad_to_multiple
      for n in input_and_target_lengths(task, max_digits))
  rng = np.random.default_rng([seed, SPLITS.index(split)])

  def batches():
    left = None if repeat else n_examples
    while left is None or left > 0:
      n = batch_size if left is None else min(batch_size, left)
      pairs = [make_example(task, rng, min_digits, max_digits)
               for _ in range(n)]
      inputs = [to_tokens(x, reverse_digits) for x, _ in pairs]
      targets = [to_tokens(y, reverse_digits) for _, y in pairs]
      missing = [[]] * (batch_size - n)
      targets_array = _pad(targets + missing, target_len)
      yield (_pad(inputs + missing, input_len), targets_array,
             (np.arange(target_len)[None] <
              np.array([len(t) for t in targets + missing])[:, None]
             ).astype(np.float32))
      if left is not None:
        left -= n

  return batches()
