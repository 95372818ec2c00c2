"""Resume sweep, the cells of several devices and processes: N steps + N
steps == 2N straight, bit-exact, as the one-process cells of
tests/training/test_resume_sweep.py run it (tests/training/resume_cells.py),
on the sparse LM.

FSDP (weight_sharding='fsdp', 4 forced CPU devices) and Trax's Loop over 2
processes x 2 devices (terraformer-train, as tests/training/test_distributed.py
starts it) run in subprocesses (the device count is fixed when JAX starts).
The runs share the test session's persistent compilation cache
(tests/conftest.py): a resumed or straight run reads the programs the first
run compiled.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np

from terraformer import distributed
from trax.supervised import history as trax_history

import local_jobs
import resume_cells
from resume_cells import N

# Multi-device and multi-process cells: the sparse LM (random draws in its
# sparse FF and dropout), batch 4 (2 rows per process, 1 per device). Trax's
# Loop over 4 devices of one process has no cell of its own: the 2-process
# cell runs it over each process's 2 devices (pmap, an rng per device) and
# adds the multi-process restore.
SPARSE = 'tiny/lm_sparse.gin'
SPARSE_4 = resume_cells.CELLS[SPARSE] + ['lm_stream.batch_size = 4']
TIMEOUT_S = 900

_DEVICES_SCRIPT = textwrap.dedent("""
    import pathlib, sys
    sys.path.insert(0, {tests_dir!r})
    import jax
    import resume_cells
    from terraformer import runtime
    runtime.use_compilation_cache(runtime.compilation_cache_dir())
    resumed, _ = resume_cells.resume_equals_straight(
        {config!r}, {bindings!r}, pathlib.Path(sys.argv[1]))
    print('CELL fsdp', jax.local_device_count(), type(resumed).__name__,
          flush=True)
""")


def test_fsdp_over_4_devices_resumes_exactly(tmp_path):
  script = _DEVICES_SCRIPT.format(
      tests_dir=os.path.dirname(os.path.abspath(__file__)), config=SPARSE,
      bindings=SPARSE_4 + ["terraformer.train.weight_sharding = 'fsdp'"])
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(4),
             JAX_PLATFORMS='cpu')
  out = subprocess.run([sys.executable, '-c', script, str(tmp_path)],
                       env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S, cwd=resume_cells.ROOT)
  assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
  cells = [l.split()[1:] for l in out.stdout.splitlines()
           if l.startswith('CELL ')]
  assert cells == [['fsdp', '4', 'FsdpLoop']]


def _two_processes(output_dir, steps):
  """terraformer-train as 2 processes x 2 devices (Trax's Loop); the CLI
  keeps its programs in the session's compilation cache."""
  port = local_jobs.free_port()
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(2),
             JAX_PLATFORMS='cpu')
  args = [f'--config={b}' for b in SPARSE_4 + resume_cells.SCHEDULE]
  return [subprocess.Popen(
      [sys.executable, '-m', 'terraformer.cli.train',
       f'--config_file=gin/{SPARSE}', *args, f'--output_dir={output_dir}',
       f'--steps={steps}', f'--coordinator_address=127.0.0.1:{port}',
       '--num_processes=2', f'--process_id={i}', '--heartbeat_timeout_s=30'],
      env=env, cwd=resume_cells.ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]


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
      resume_cells.read_checkpoint(resumed),
      resume_cells.read_checkpoint(straight))
  assert step_a == step_b == 2 * N and sorted(a) == sorted(b)
  differ = [k for k in a if not np.array_equal(a[k], b[k])]
  assert not differ, f'{len(differ)} of {len(a)} arrays differ: {differ[:5]}'
  history = lambda meta: resume_cells.metrics(
      trax_history.History.from_dict(meta['history']))
  assert history(meta_a) == history(meta_b)
  lines = _eval_lines(out_resumed, 2 * N)
  assert len(lines) == 3 and lines == _eval_lines(out_straight, 2 * N)
