"""The cells of the resume sweep, and how one is run and compared (the
tests: test_resume_sweep.py in one process, test_resume_sweep_devices.py
over 4 devices and 2 processes)."""
import json
import os

import gin
import numpy as np

from terraformer import config as gin_config
from terraformer.checkpoint import store as checkpoints
from terraformer.cli import common
from terraformer.training import loop as training

common.setup()  # The compat fixes; every gin configurable registered.

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
N = 3  # Steps before the resume, and after it.
SCHEDULE = ['terraformer.train.eval_every = 3',
            'terraformer.train.eval_batches = 1',
            'terraformer.train.checkpoint_every = 2',
            'terraformer.train.random_seed = 0']

_LM = ['SEQ_LEN = 32', 'ScalingTransformerLM.d_model = 16',
       'ScalingTransformerLM.d_ff = 32', 'ScalingTransformerLM.n_layers = 1',
       'ScalingTransformerLM.n_heads = 2', 'ScalingTransformerLM.d_lowrank = 4',
       'ScalingTransformerLM.dropout = 0.1', 'lm_stream.batch_size = 2']
_TERRAFORMER = ['Terraformer.d_model = 16', 'Terraformer.d_ff = 32',
                'Terraformer.n_encoder_layers = 1',
                'Terraformer.n_decoder_layers = 1', 'Terraformer.n_heads = 2',
                'Terraformer.d_lowrank = 4', 'Terraformer.d_sru = 8',
                'Terraformer.dropout = 0.1']

# config file -> bindings that shrink it (dropout 0.1 everywhere: every cell
# draws from the loop's rng at every step, as a sparse layer's noise does).
# A resume depends on the layers only through the state and random draws
# they keep, and on the stream it skips the used batches of: one cell each.
# - lm_sparse: lm_stream; sparse FF (noise drawn at every step), sparse QKV
#   (a state), sparse loss. lm_dense, lm_sparse_ff, lm_sparse_qkv,
#   lm_sparse_ff_qkv and soak (lm_dense at other sizes;
#   tests/training/test_soak.py resumes it after kill -9) hold a subset of
#   these layers, on the same loop and stream.
# - lm_cst: composite slice attention's own dropout draws.
# - terraformer: seq2seq_stream; LSH attention (random rotations drawn at
#   every step), reversible layers (their backward pass draws the forward's
#   rngs again), the low-rank SRU, and the sparse FF, QKV and loss.
#   encdec_sparse (the same stream and sparse layers in the encoder-decoder)
#   and pyramidion(_unpooled) (that encoder-decoder with blockwise attention
#   and pooling, which keep no state and draw nothing while training) add
#   no state or draw of their own.
# - ood/copy_terraformer_sru: arithmetic_stream, here with full attention and
#   plain residuals (LSH and reversible layers are the terraformer cell's;
#   they compile for minutes on a loaded CPU).
CELLS = {
    'tiny/lm_sparse.gin': _LM,
    'tiny/lm_cst.gin': _LM,
    'tiny/terraformer.gin': _TERRAFORMER + [
        'INPUT_LEN = 32', 'TARGET_LEN = 16', 'Terraformer.lsh_chunk_len = 16',
        'Terraformer.predict_mem_len = 48', 'Terraformer.predict_drop_len = 16',
        'seq2seq_stream.batch_size = 2'],
    'ood/copy_terraformer_sru.gin': _TERRAFORMER + [
        'arithmetic_stream.train_max_digits = 3',
        'arithmetic_stream.eval_min_digits = 6',
        'arithmetic_stream.eval_max_digits = 7',
        'arithmetic_stream.batch_size = 2',
        "Terraformer.encoder_attention_type = 'full'",
        "Terraformer.decoder_attention_type = 'full'",
        'Terraformer.reversible = False'],
}


def _parse(config, bindings):
  gin_config.parse_gin([os.path.join(ROOT, 'gin', config)],
                       list(bindings) + SCHEDULE)


def _train(config, bindings, output_dir, steps):
  _parse(config, bindings)
  try:
    return training.train(str(output_dir), steps=steps)
  finally:
    gin.clear_config()


def train_state(loop):
  """name -> numpy array of everything a resume restores, of a finished
  `terraformer.train` (Trax's Loop or the FSDP loop)."""
  if hasattr(loop, 'trainer'):  # FsdpLoop.
    return loop._arrays(np.asarray)  # pylint: disable=protected-access
  return loop._train_state()  # pylint: disable=protected-access


def metrics(history):
  """(mode, metric) -> [(step, value)] of a Trax History's `metrics/*`
  (train loss, eval metrics; not `training/steps per second`)."""
  return {(mode, metric): [(int(s), float(v))
                           for s, v in history.get(mode, metric)]
          for mode in history.modes for metric in history.metrics_for_mode(mode)
          if metric.startswith('metrics/')}


def assert_same_state(resumed, straight):
  a, b = train_state(resumed), train_state(straight)
  assert sorted(a) == sorted(b)
  differ = [k for k in a if not np.array_equal(a[k], b[k])]
  worst = max((float(np.max(np.abs(np.asarray(a[k], np.float64) -
                                   np.asarray(b[k], np.float64))))
               for k in differ if k != 'rng'), default=0.0)
  # The experiment reliability_resume records this line.
  print(f'{len(differ)} of {len(a)} arrays differ (max |difference| '
        f'{worst:.3g})')
  assert not differ, (f'{len(differ)} of {len(a)} arrays differ (max '
                      f'{worst:.3g}): {differ[:5]}')
  # Every train loss and eval metric, of steps 1, 3 and 6 (the next eval).
  history = metrics(straight.history)
  assert [s for s, _ in history['eval', 'metrics/log_perplexity']] == [
      1, N, 2 * N]
  assert metrics(resumed.history) == history


def resume_equals_straight(config, bindings, tmp_path):
  first = _train(config, bindings, tmp_path / 'resumed', N)
  assert first.step == N
  resumed = _train(config, bindings, tmp_path / 'resumed', 2 * N)
  straight = _train(config, bindings, tmp_path / 'straight', 2 * N)
  assert resumed.step == straight.step == 2 * N
  assert_same_state(resumed, straight)
  return resumed, straight


def read_checkpoint(output_dir):
  """(step, name -> array, meta) of the newest committed checkpoint."""
  step = checkpoints.committed_steps(str(output_dir))[0]
  with open(os.path.join(output_dir, 'checkpoints', str(step), 'meta',
                         'metadata')) as f:
    shapes = {k: (tuple(v[0]), np.dtype(v[1]))
              for k, v in json.load(f)['shapes'].items()}
  return checkpoints.CheckpointStore(str(output_dir)).restore(shapes)
