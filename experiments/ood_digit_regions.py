"""Which digits of a sum does a trained Table 4 addition cell get right?

  PYTHONPATH=. .venv/bin/python experiments/ood_digit_regions.py \
    --cell=add_transformer --output_dir=RUN_DIR [--examples=256] \
    [--config=BINDING ...]

Greedy-decodes (as the harness, `terraformer.evaluation.ood.evaluate_cell`)
the first `--examples` in-distribution validation numbers with the run's last
checkpoint and prints one JSON line: the accuracy of the target digits sorted
by what they need (numbers least significant digit first):
  - both addends: positions below the shorter addend's length;
  - one addend: positions between the two lengths (the longer addend's digit
    plus a carry);
  - carry digit: the final digit of a sum longer than both addends;
  - eos: the end of the number.
A digit is right when the decoded token at its position equals it. Nothing is
written to RUN_DIR.
"""
import collections
import json

from absl import app
from absl import flags
import gin

from terraformer import config as config_lib
from terraformer.cli import common

FLAGS = flags.FLAGS
flags.DEFINE_string('cell', None, 'Cell name (gin/ood/<cell>.gin).')
flags.DEFINE_string('output_dir', None, 'The cell\'s run directory.')
flags.DEFINE_integer('examples', 256, 'Validation numbers decoded.')
flags.DEFINE_multi_string('config', [], 'Extra gin bindings (as trained).')

REGIONS = ('both addends', 'one addend', 'carry digit', 'eos')


def region(i, len_a, len_b, len_sum):
  """What target position i of a len_sum-digit sum of the addends needs."""
  if i == len_sum:
    return 'eos'
  if i < min(len_a, len_b):
    return 'both addends'
  return 'one addend' if i < max(len_a, len_b) else 'carry digit'


def main(argv):
  del argv
  common.setup()
  from terraformer.data import arithmetic  # pylint: disable=g-import-not-at-top
  from terraformer.evaluation import ood  # pylint: disable=g-import-not-at-top
  from terraformer.loading import model as loading_model  # pylint: disable=g-import-not-at-top
  _, path = ood.cell_config_file(FLAGS.cell, config_lib.GIN_DIR)
  config_lib.parse_gin([path], FLAGS.config)
  model_fn = gin.query_parameter('terraformer.train.model')
  model_fn = getattr(model_fn, 'scoped_configurable_fn', model_fn)
  plus = arithmetic.encode('+')[0]
  counts = collections.Counter()
  steps = []

  def make_model(signature):
    model, step = loading_model.load_model(model_fn, FLAGS.output_dir,
                                           'predict', signature)
    steps.append(step)
    return model

  for inputs, targets, _, predictions in ood.greedy_decodes(
      make_model, 'validation', n_examples=FLAGS.examples):
    for x, t, p in zip(inputs.tolist(), targets.tolist(), predictions):
      len_a = x.index(plus)
      len_b = x.index(arithmetic.EOS_ID) - len_a - 1
      len_sum = t.index(arithmetic.EOS_ID)
      for i in range(len_sum + 1):
        name = region(i, len_a, len_b, len_sum)
        counts[name, 'n'] += 1
        counts[name, 'right'] += int(i < len(p) and p[i] == t[i])
  result = {'output_dir': FLAGS.output_dir, 'step': int(steps[0])}
  for name in REGIONS:
    n = counts[name, 'n']
    result[name] = round(counts[name, 'right'] / n, 3) if n else None
  result['digits'] = {name: counts[name, 'n'] for name in REGIONS}
  print(json.dumps(result))


if __name__ == '__main__':
  flags.mark_flags_as_required(['cell', 'output_dir'])
  app.run(main)
