"""Resume sweep: N steps + N steps == 2N straight, bit-exact.

For each tiny training config in gin/ (at the smallest sizes that still
exercise its layers, through gin bindings), `terraformer.train` runs 3 steps
into one directory and is called again for 6 (it resumes from the checkpoint
of step 3), against 6 steps straight in another directory. Evaluations
(every 3 steps, and at step 1) and checkpoints (every 2 steps, and at the
last step) fall on steps that do not divide evenly, so the resume step is
both a checkpoint and an eval step (the case that was inexact: Trax's Loop
saved before the eval drew its rngs). Every weight, state, optimizer-slot
array and the rng must be bit-identical, and so must the train losses and
eval metrics of steps 1, 3 and 6 (the next evaluation after the resume).

FSDP (weight_sharding='fsdp', 4 forced CPU devices), Trax's Loop replicated
over the same 4 devices, and 2 processes x 2 devices (terraformer-train, as
tests/test_distributed.py starts it) run the sparse LM the same way, in
subprocesses (the device count is fixed when JAX starts). The runs of this
file share JAX's persistent compilation cache: a resumed or straight run
reads the programs the first run compiled.
"""
import json
import os
import subprocess
import sys
import textwrap

import gin
import jax
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
_ENCDEC = ['ScalingTransformer.d_model = 16', 'ScalingTransformer.d_ff = 32',
           'ScalingTransformer.n_encoder_layers = 1',
           'ScalingTransformer.n_decoder_layers = 1',
           'ScalingTransformer.n_heads = 2', 'ScalingTransformer.d_lowrank = 4',
           'ScalingTransformer.dropout = 0.1', 'seq2seq_stream.input_len = 32',
           'seq2seq_stream.target_len = 16', 'seq2seq_stream.batch_size = 2']
_TERRAFORMER = ['Terraformer.d_model = 16', 'Terraformer.d_ff = 32',
                'Terraformer.n_encoder_layers = 1',
                'Terraformer.n_decoder_layers = 1', 'Terraformer.n_heads = 2',
                'Terraformer.d_lowrank = 4', 'Terraformer.d_sru = 8',
                'Terraformer.dropout = 0.1']

# config file -> bindings that shrink it (dropout 0.1 everywhere: every cell
# draws from the loop's rng at every step, as a sparse layer's noise does).
CELLS = {
    'tiny/lm_dense.gin': _LM,
    'tiny/lm_sparse_ff.gin': _LM,
    'tiny/lm_sparse_qkv.gin': _LM,
    'tiny/lm_sparse_ff_qkv.gin': _LM,
    'tiny/lm_sparse.gin': _LM,
    'tiny/lm_cst.gin': _LM,
    'tiny/soak.gin': ['lm_stream.batch_size = 2'],
    'tiny/encdec_sparse.gin': _ENCDEC,
    'tiny/pyramidion.gin': _ENCDEC + [
        'seq2seq_stream.input_len = 64', 'ScalingTransformer.block_len = 16',
        'ScalingTransformer.encoder_pooling = {0: 16}'],
    'tiny/pyramidion_unpooled.gin': _ENCDEC + [
        'seq2seq_stream.input_len = 64', 'ScalingTransformer.block_len = 16'],
    'tiny/terraformer.gin': _TERRAFORMER + [
        'INPUT_LEN = 32', 'TARGET_LEN = 16', 'Terraformer.lsh_chunk_len = 16',
        'Terraformer.predict_mem_len = 48', 'Terraformer.predict_drop_len = 16',
        'seq2seq_stream.batch_size = 2'],
    'ood/copy_terraformer_sru.gin': _TERRAFORMER + [
        'arithmetic_stream.train_max_digits = 3',
        'arithmetic_stream.eval_min_digits = 6',
        'arithmetic_stream.eval_max_digits = 7',
        'arithmetic_stream.batch_size = 2'],
}


_CACHE_FLAGS = ('jax_compilation_cache_dir',
                'jax_persistent_cache_min_compile_time_secs',
                'jax_persistent_cache_min_entry_size_bytes')


def use_compilation_cache(directory):
  """Turns JAX's persistent compilation cache on (`directory`) or off
  (None); returns the previous flag values. The resumed and the straight
  run compile the programs of the first run again (a new Loop jits new
  functions): with the cache they read them back."""
  from jax._src import compilation_cache as cache  # pylint: disable=g-import-not-at-top
  saved = [getattr(jax.config, name) for name in _CACHE_FLAGS]
  values = (directory, 0.0, 0) if directory else (None, 1.0, 0)
  for name, value in zip(_CACHE_FLAGS, values):
    jax.config.update(name, value)
  cache.reset_cache()
  return saved


@pytest.fixture(scope='module', autouse=True)
def compilation_cache(tmp_path_factory):
  """The persistent compilation cache, for this module's runs only."""
  from jax._src import compilation_cache as cache  # pylint: disable=g-import-not-at-top
  saved = use_compilation_cache(str(tmp_path_factory.mktemp('jax_cache')))
  yield
  for name, value in zip(_CACHE_FLAGS, saved):
    jax.config.update(name, value)
  cache.reset_cache()


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


@pytest.mark.slow
@pytest.mark.parametrize('config', sorted(CELLS))
def test_resume_equals_straight(config, tmp_path):
  resume_equals_straight(config, CELLS[config], tmp_path)


# Multi-device and multi-process cells: the sparse LM (random draws in its
# sparse FF and dropout), batch 4 (2 rows per process, 1 per device).
SPARSE = 'tiny/lm_sparse.gin'
SPARSE_4 = CELLS[SPARSE] + ['lm_stream.batch_size = 4']
TIMEOUT_S = 900

_DEVICES_SCRIPT = textwrap.dedent("""
    import pathlib, sys
    sys.path.insert(0, {tests_dir!r})
    import jax
    import test_resume_sweep as t
    t.use_compilation_cache({cache!r})
    out = pathlib.Path(sys.argv[1])
    fsdp = ["terraformer.train.weight_sharding = 'fsdp'"]
    for name, extra in [('fsdp', fsdp), ('replicated', [])]:
      resumed, _ = t.resume_equals_straight(
          t.SPARSE, t.SPARSE_4 + extra, out / name)
      print('CELL', name, jax.local_device_count(), type(resumed).__name__,
            flush=True)
""")


@pytest.mark.slow
def test_fsdp_and_replicated_over_4_devices_resume_exactly(tmp_path):
  script = _DEVICES_SCRIPT.format(
      tests_dir=os.path.dirname(os.path.abspath(__file__)),
      cache=str(tmp_path / 'jax_cache'))
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(4),
             JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', script, str(tmp_path)],
                       env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S, cwd=ROOT)
  assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
  cells = [l.split()[1:] for l in out.stdout.splitlines()
           if l.startswith('CELL ')]
  assert cells == [['fsdp', '4', 'FsdpLoop'],
                   ['replicated', '4', '_CheckpointedLoop']]


def read_checkpoint(output_dir):
  """(step, name -> array, meta) of the newest committed checkpoint."""
  step = checkpoints.committed_steps(str(output_dir))[0]
  with open(os.path.join(output_dir, 'checkpoints', str(step), 'meta',
                         'metadata')) as f:
    shapes = {k: (tuple(v[0]), np.dtype(v[1]))
              for k, v in json.load(f)['shapes'].items()}
  return checkpoints.CheckpointStore(str(output_dir)).restore(shapes)


def _two_processes(output_dir, steps, cache):
  """terraformer-train as 2 processes x 2 devices (Trax's Loop)."""
  from test_distributed import _free_port  # pylint: disable=g-import-not-at-top
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(2),
             JAX_PLATFORMS='cpu', JAX_COMPILATION_CACHE_DIR=str(cache),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
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


@pytest.mark.slow
def test_two_processes_resume_exactly(tmp_path):
  resumed, straight = tmp_path / 'resumed', tmp_path / 'straight'
  cache = tmp_path / 'jax_cache'
  out_first = _finish(_two_processes(resumed, N, cache))
  assert f'Training steps 1..{N}' in out_first
  out_straight = _finish(_two_processes(straight, 2 * N, cache))
  out_resumed = _finish(_two_processes(resumed, 2 * N, cache))
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
