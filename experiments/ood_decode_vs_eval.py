"""Does decoding compute what evaluation computes? One trained Table 4 cell.

  PYTHONPATH=. .venv/bin/python experiments/ood_decode_vs_eval.py \
    --cell=copy_terraformer_sru_sinusoidal --output_dir=RUN_DIR [--seed=0] \
    [--examples=64] [--config=BINDING ...]

Loads the run's last checkpoint (from a copy of RUN_DIR: nothing is trained
or written there) and, on the first `--examples` numbers of each split,
prints the per-token accuracy of
  - the evaluation pass (eval mode, teacher-forced: all targets at once),
  - the decoding steps fed the same targets one by one (predict mode,
    teacher-forced): equal to the above when decoding is exact,
  - greedy decoding (predict mode, its own tokens; the harness's score),
and how often the two teacher-forced argmaxes agree. A gap between the first
two is a decoding defect (or, for LSH, the difference between hashing a whole
sequence into chunks and a token into its bucket), not an error of the model.
"""
import os
import shutil
import sys
import tempfile

from absl import app
from absl import flags
import gin
import numpy as np

from terraformer import config as config_lib
from terraformer.cli import common

FLAGS = flags.FLAGS
flags.DEFINE_string('cell', None, 'Cell name (gin/ood/<cell>.gin).')
flags.DEFINE_string('output_dir', None, 'The cell\'s run directory.')
flags.DEFINE_integer('seed', 0, 'The run\'s seed (terraformer-ood --seeds).')
flags.DEFINE_integer('examples', 64, 'Numbers scored per split.')
flags.DEFINE_multi_string('config', [], 'Extra gin bindings.')


def main(argv):
  del argv
  from trax import shapes  # pylint: disable=g-import-not-at-top
  from terraformer.data import arithmetic  # pylint: disable=g-import-not-at-top
  from terraformer.decoding import search  # pylint: disable=g-import-not-at-top
  from terraformer.evaluation import ood  # pylint: disable=g-import-not-at-top
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  common.setup()
  run_copy = os.path.join(tempfile.mkdtemp(), 'run')
  shutil.copytree(FLAGS.output_dir, run_copy)
  config_lib.parse_gin([ood.cell_config_file(FLAGS.cell, config_lib.GIN_DIR)[1]],
                       ood.seed_bindings(FLAGS.seed) + FLAGS.config)
  weights = training.train(run_copy).model.weights
  model_fn = gin.query_parameter('terraformer.train.model')
  model_fn = getattr(model_fn, 'scoped_configurable_fn', model_fn)
  n = FLAGS.examples
  for split in ('validation', 'ood'):
    inputs, targets, weights_mask = next(iter(arithmetic.arithmetic_stream(
        split=split, repeat=False, n_examples=n, batch_size=n)))
    real = np.asarray(weights_mask) > 0
    evaluation = model_fn(mode='eval')
    evaluation.init((shapes.signature(inputs), shapes.signature(targets)))
    evaluation.weights = weights
    logits = evaluation((inputs, targets))
    logits = np.asarray(logits[0] if isinstance(logits, (tuple, list))
                        else logits)
    decoder = ood.predict_model(model_fn, weights, (
        shapes.ShapeDtype(inputs.shape, np.int32),
        shapes.ShapeDtype((inputs.shape[0], 1), np.int32)))
    step = search._Runner(decoder, np.asarray(inputs), n, None)  # pylint: disable=protected-access
    prev, stepped = np.zeros(n, np.int32), []
    for t in range(targets.shape[1]):
      stepped.append(step(prev).argmax(-1))
      prev = np.asarray(targets[:, t], np.int32)
    stepped = np.stack(stepped, 1)
    greedy = search.decode(decoder, inputs, max_length=targets.shape[1],
                           method='greedy', eos_id=ood.EOS_ID,
                           pad_id=arithmetic.PAD_ID,
                           input_length=inputs.shape[1])
    score = ood.score_batch(greedy, targets, weights_mask)
    print(f'{FLAGS.cell} {split} ({n} numbers): teacher-forced evaluation '
          f'{(logits.argmax(-1) == targets)[real].mean():.4f} | teacher-forced '
          f'decoding {(stepped == targets)[real].mean():.4f} | argmax agreement '
          f'{(stepped == logits.argmax(-1))[real].mean():.4f} | greedy '
          f'{score.token_accuracy:.4f}', flush=True)
  return 0


if __name__ == '__main__':
  flags.mark_flags_as_required(['cell', 'output_dir'])
  sys.exit(app.run(main))
