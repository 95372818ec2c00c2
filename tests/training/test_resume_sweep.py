"""Resume sweep: N steps + N steps == 2N straight, bit-exact.

For one tiny training config per resume path (at the smallest sizes that
still exercise its layers, through gin bindings), `terraformer.train` runs 3 steps
into one directory and is called again for 6 (it resumes from the checkpoint
of step 3), against 6 steps straight in another directory. Evaluations
(every 3 steps, and at step 1) and checkpoints (every 2 steps, and at the
last step) fall on steps that do not divide evenly, so the resume step is
both a checkpoint and an eval step (the case that was inexact: Trax's Loop
saved before the eval drew its rngs). Every weight, state, optimizer-slot
array and the rng must be bit-identical, and so must the train losses and
eval metrics of steps 1, 3 and 6 (the next evaluation after the resume).

FSDP (weight_sharding='fsdp', 4 forced CPU devices) and Trax's Loop over 2
processes x 2 devices (terraformer-train, as tests/test_distributed.py starts
it) run the sparse LM the same way, in subprocesses (the device count is
fixed when JAX starts). The runs share the test session's persistent
compilation cache (tests/conftest.py): a resumed or straight run reads the
programs the first run compiled.

Where else exact resume is checked: tests/training/test_loop.py (Trax's Loop
on a counting stream, the restored weights), tests/training/test_soak.py
(kill -9 while training), tests/training/test_distributed.py (2 processes
killed and restarted as Slurm tasks against 1 process of 4 devices, and FSDP
over 2 processes against Trax's Loop; within 1e-5, not bit-exact).
"""
import json
import os
import subprocess
import sys
import textwrap

import gin
import numpy as np
import pytest

from terraformer import config as gin_config
from terraformer import distributed
from terraformer.checkpoint import store as checkpoints
from terraformer.cli import common
from terraformer.training import loop as training
from trax.supervised import history as trax_history

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


@pytest.mark.parametrize('config', sorted(CELLS))
def test_resume_equals_straight(config, tmp_path):
  resume_equals_straight(config, CELLS[config], tmp_path)


# Multi-device and multi-process cells: the sparse LM (random draws in its
# sparse FF and dropout), batch 4 (2 rows per process, 1 per device). Trax's
# Loop over 4 devices of one process has no cell of its own: the 2-process
# cell runs it over each process's 2 devices (pmap, an rng per device) and
# adds the multi-process restore.
SPARSE = 'tiny/lm_sparse.gin'
SPARSE_4 = CELLS[SPARSE] + ['lm_stream.batch_size = 4']
TIMEOUT_S = 900

_DEVICES_SCRIPT = textwrap.dedent("""
    import pathlib, sys
    sys.path.insert(0, {tests_dir!r})
    import jax
    import test_resume_sweep as t
    from terraformer import runtime
    runtime.use_compilation_cache(runtime.compilation_cache_dir())
    resumed, _ = t.resume_equals_straight(
        t.SPARSE, t.SPARSE_4 + ["terraformer.train.weight_sharding = 'fsdp'"],
        pathlib.Path(sys.argv[1]))
    print('CELL fsdp', jax.local_device_count(), type(resumed).__name__,
          flush=True)
""")


def test_fsdp_over_4_devices_resumes_exactly(tmp_path):
  script = _DEVICES_SCRIPT.format(
      tests_dir=os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(4),
             JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', script, str(tmp_path)],
                       env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S, cwd=ROOT)
  assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
  cells = [l.split()[1:] for l in out.stdout.splitlines()
           if l.startswith('CELL ')]
  assert cells == [['fsdp', '4', 'FsdpLoop']]


def read_checkpoint(output_dir):
  """(step, name -> array, meta) of the newest committed checkpoint."""
  step = checkpoints.committed_steps(str(output_dir))[0]
  with open(os.path.join(output_dir, 'checkpoints', str(step), 'meta',
                         'metadata')) as f:
    shapes = {k: (tuple(v[0]), np.dtype(v[1]))
              for k, v in json.load(f)['shapes'].items()}
  return checkpoints.CheckpointStore(str(output_dir)).restore(shapes)


def _two_processes(output_dir, steps):
  """terraformer-train as 2 processes x 2 devices (Trax's Loop); the CLI
  keeps its programs in the session's compilation cache."""
  from local_jobs import free_port  # pylint: disable=g-import-not-at-top
  port = free_port()
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(2),
             JAX_PLATFORMS='cpu')
  args = [f'--config={b}' for b in SPARSE_4 + SCHEDULE]
  return [subprocess.Popen(
      [sys.executable, '-m', 'terraformer.cli.train',
       f'--config_file=gin/{SPARSE}', *args, f'--output_dir={output_dir}',
       f'--steps={steps}', f'--coordinator_address=127.0.0.1:{port}',
       '--num_processes=2', f'--process_id={i}', '--heartbeat_timeout_s=30'],
      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True) for i in range(2)]


def _finish(processes):
  """stdout of process 0 of a job; every process must end with 0."""
  outputs = [p.communicate(timeout=TIMEOUT_S) for p in processes]
  for p, (_, err) in zip(processes, outputs):
    assert p.returncode == 0, err[-3000:]
  return outputs[0][0]


def _eval_lines(stdout, step):
  return [l for l in stdout.splitlines()
          if l.startswith(f'Step {step:6d}: eval ')]


def test_two_processes_resume_exactly(tmp_path):
  resumed, straight = tmp_path / 'resumed', tmp_path / 'straight'
  out_first = _finish(_two_processes(resumed, N))
  assert f'Training steps 1..{N}' in out_first
  out_straight = _finish(_two_processes(straight, 2 * N))
  out_resumed = _finish(_two_processes(resumed, 2 * N))
  assert f'Resuming from checkpoint at step {N}' in out_resumed
  assert '(2 processes, 4 devices in all)' in out_resumed
  (step_a, a, meta_a), (step_b, b, meta_b) = (
      read_checkpoint(resumed), read_checkpoint(straight))
  assert step_a == step_b == 2 * N and sorted(a) == sorted(b)
  differ = [k for k in a if not np.array_equal(a[k], b[k])]
  assert not differ, f'{len(differ)} of {len(a)} arrays differ: {differ[:5]}'
  history = lambda meta: metrics(trax_history.History.from_dict(
      meta['history']))
  assert history(meta_a) == history(meta_b)
  lines = _eval_lines(out_resumed, 2 * N)
  assert len(lines) == 3 and lines == _eval_lines(out_straight, 2 * N)
