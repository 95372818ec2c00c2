"""terraformer-train over several processes (terraformer/distributed.py,
terraformer/supervisor.py, both training loops).

The jobs run the CLI on the tiny soak config (gin/tiny/soak.gin, dropout 0)
as 2 processes x 2 forced CPU devices on localhost (JAX's collectives over
gloo), against one process of as many devices straight through. Every wait
is bounded. ShardedTrainer over devices and processes:
tests/training/test_sharded_trainer.py.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from terraformer import distributed
from terraformer import errors

from local_jobs import finish
from local_jobs import free_port
from local_jobs import TIMEOUT_S


TRAIN_ARGS = ['--config_file=gin/tiny/soak.gin',
              '--config=terraformer.train.random_seed=1',
              '--config=terraformer.train.checkpoint_every=2']
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STEPS = 12  # Of a job: a kill after checkpoint 4 lands before its end.


def _train(out_dir, steps, devices, *args, env=None):
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(devices),
             **(env or {}))
  return subprocess.Popen(
      [sys.executable, '-m', 'terraformer.cli.train', *TRAIN_ARGS,
       f'--output_dir={out_dir}', f'--steps={steps}', *args],
      env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)


def _train_two_processes(out_dir, steps):
  port = free_port()
  return [_train(out_dir, steps, 2, f'--coordinator_address=127.0.0.1:{port}',
                 '--num_processes=2', f'--process_id={i}',
                 '--heartbeat_timeout_s=10') for i in range(2)]


def _slurm_job_id():
  """A Slurm job id whose JAX coordinator port (61440 + id % 4096) is free."""
  start = int.from_bytes(os.urandom(2), 'little') % 4096
  for offset in range(4096):
    job = (start + offset) % 4096
    with socket.socket() as s:
      try:
        s.bind(('127.0.0.1', 61440 + job))
        return str(job)
      except OSError:
        continue
  raise RuntimeError('no free port in 61440..65535')


def _train_as_slurm_tasks(out_dir, steps):
  """2 processes as `srun --ntasks=2` on one node starts them: JAX reads the
  job from the SLURM_* variables (`terraformer-train --distributed`)."""
  job = _slurm_job_id()
  return [_train(out_dir, steps, 2, '--distributed', env={
      'SLURM_JOB_ID': job, 'SLURM_STEP_NODELIST': 'localhost',
      'SLURM_NTASKS': '2', 'SLURM_PROCID': str(i), 'SLURM_LOCALID': str(i),
      'SLURM_STEP_NUM_NODES': '1'}) for i in range(2)]


def _final(out_dir, stdout):
  from terraformer.checkpoint import format as checkpoint_format  # pylint: disable=g-import-not-at-top
  weights = checkpoint_format.read_trax_checkpoint(
      os.path.join(out_dir, 'model.pkl.gz'))['flat_weights']
  last = [l for l in stdout.splitlines() if l.startswith('step ')][-1]
  log_ppl = float(last.split('eval log_perplexity ')[1].split()[0])
  return [np.asarray(w) for w in weights], log_ppl


@pytest.fixture(scope='module')
def one_process(tmp_path_factory):
  """terraformer-train as 1 process x 4 devices, STEPS steps straight
  through (Trax's Loop): (output dir, stdout). The 2-process jobs end equal
  to it: Trax's Loop killed and resumed, and the FSDP loop."""
  out_dir = tmp_path_factory.mktemp('one_process') / 'run'
  code, out, err = finish(_train(out_dir, STEPS, 4))
  assert code == 0, err[-3000:]
  return out_dir, out


def test_distributed_flag_without_a_cluster_is_one_line(tmp_path):
  code, out, err = finish(_train(tmp_path / 'o', 2, 1, '--distributed'))
  assert code == 2
  assert err.strip().splitlines()[-1].startswith(
      'terraformer-train: error: JAX detected no cluster'), err[-2000:]
  assert not os.path.exists(tmp_path / 'o') and 'Traceback' not in err


def test_train_cli_two_processes_killed_and_resumed_equals_one_process(
    tmp_path, one_process):
  """Process 1 is killed after checkpoint 4: process 0 stops (bounded). Both
  are restarted (as Slurm tasks, `--distributed`): the job resumes from the
  last checkpoint and ends equal to one uninterrupted process of as many
  devices (weights within 1e-5, the same global eval metric)."""
  steps, out_dir = STEPS, tmp_path / 'two'
  first = _train_two_processes(out_dir, steps)
  marker = out_dir / 'checkpoints' / '4' / 'COMMITTED'
  deadline = time.time() + TIMEOUT_S
  while not marker.exists() and time.time() < deadline and all(
      p.poll() is None for p in first):
    time.sleep(0.05)
  first[1].kill()
  killed_at = time.time()
  code, _, err = finish(first[0])
  # It stops, never hangs (killed after TIMEOUT_S: not exit 2), with one line
  # (exit 2): when its next collective fails, or when JAX ends it after
  # --heartbeat_timeout_s (its fatal log).
  assert code == 2, err[-3000:]
  assert _death_lines(err) == [err.strip().splitlines()[-1]], err[-3000:]
  assert re.match(r'terraformer-train: error: process 0 of 2: process 1 '
                  r'died \(.*\) after step \d+;', _death_lines(err)[0])
  print(f'process 0 after the kill of process 1: exit {code} after '
        f'{time.time() - killed_at:.1f} s')
  first[1].communicate()
  assert marker.exists()
  second = _train_as_slurm_tasks(out_dir, steps)
  results = [finish(p) for p in second]
  for code, _, err in results:
    assert code == 0, err[-3000:]
  out0, out1 = results[0][1], results[1][1]
  resumed = [l for l in out0.splitlines() if l.startswith('Resuming')]
  assert resumed and 'at step ' in resumed[0], out0[-2000:]
  assert int(resumed[0].split('at step ')[1].split()[0]) < steps
  assert 'Training steps' in out0 and '(2 processes, 4 devices in all)' in out0
  # Process 1 prints no progress of its own; Trax's per-step lines show the
  # same global metrics on both processes.
  assert not [l for l in out1.splitlines()
              if l.startswith(('step ', 'Resuming', 'Done'))]
  last_eval = [[l for l in out.splitlines() if 'eval  log_perplexity' in l][-1]
               for out in (out0, out1)]
  assert last_eval[0] == last_eval[1] and f'Step {steps:6d}' in last_eval[0]
  assert not os.path.exists(out_dir / 'checkpoints.damaged')

  (w2, ppl2), (w1, ppl1) = _final(out_dir, out0), _final(*one_process)
  assert len(w2) == len(w1)
  difference = max(float(np.max(np.abs(a - b))) for a, b in zip(w2, w1))
  print(f'{resumed[0]}; max |weight difference| {difference:.2e}; final eval '
        f'log_perplexity {ppl2} (2 x 2) vs {ppl1} (1 x 4)')
  assert difference < 1e-5
  assert ppl2 == pytest.approx(ppl1, abs=2e-4)


PEER_DEATH = re.compile(
    r'^terraformer-train: error: process (\d) of 2: (.*) died (.*)after '
    r'step (\d+); run the same command again on every process: it resumes '
    r'from the last checkpoint$')


def _death_lines(err):
  """The one-line reports of a peer's death in `err`; asserts that JAX's
  fatal log and native error lines were kept out."""
  assert 'Check failure' not in err and 'Terminating process' not in err
  assert not re.search(r'^[EF]\d{4} ', err, re.M), err[-3000:]
  return [l for l in err.splitlines() if PEER_DEATH.match(l)]


def test_the_coordinators_death_is_one_line_on_its_peer(tmp_path):
  """Process 0 (the coordinator, JAX's coordination service) is killed
  after a checkpoint: process 1 ends after the heartbeat timeout, exit 2,
  with one line naming it, the step and how to restart; not JAX's fatal
  log and SIGABRT."""
  out_dir = tmp_path / 'run'
  job = _train_two_processes(out_dir, 200)
  marker = out_dir / 'checkpoints' / '2' / 'COMMITTED'
  deadline = time.time() + 2 * TIMEOUT_S  # Start-up: minutes on a busy CPU.
  while not marker.exists() and time.time() < deadline and all(
      p.poll() is None for p in job):
    time.sleep(0.05)
  assert marker.exists(), finish(job[1])[2][-3000:]
  job[0].kill()  # `terraformer-train`: its child, process 0, dies with it.
  killed_at = time.time()
  code, _, err = finish(job[1])
  job[0].communicate()
  seconds = time.time() - killed_at
  assert code == 2, err[-3000:]  # A hang is killed after TIMEOUT_S: not 2.
  lines = _death_lines(err)
  assert lines == [err.strip().splitlines()[-1]], err[-3000:]
  me, who, _, step = PEER_DEATH.match(lines[0]).groups()
  assert me == '1' and who == 'process 0 (the coordinator)'
  assert int(step) >= 2
  print(f'{lines[0]} ({seconds:.1f} s after the kill)')


def test_weight_sharding_values_and_unsupported_options_are_one_line():
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  check = training._check_weight_sharding  # pylint: disable=protected-access
  assert check('fsdp', False, (), None) and not check(
      'replicated', True, (), 'x')
  with pytest.raises(errors.TerraformerError, match="'replicated' or 'fsdp'"):
    check('zero3', False, (), None)
  with pytest.raises(errors.TerraformerError, match='init_checkpoint is not'):
    check('fsdp', False, (), '/tmp/x')


def _fsdp_run(out_dir, steps, devices, *args):
  return _train(out_dir, steps, devices,
                "--config=terraformer.train.weight_sharding='fsdp'", *args)


def _events(out_dir, mode):
  return [f for f in os.listdir(out_dir / mode) if 'tfevents' in f]


def test_train_cli_fsdp_over_2_processes_equals_trax_loop_and_resumes(
    tmp_path, one_process):
  """`weight_sharding='fsdp'`: 2 processes x 2 devices, every weight and
  slot split over the 4 devices, STEPS / 2 steps then a restart to STEPS
  (resumed from the sharded checkpoint each process wrote its shards of) ==
  Trax's Loop in one process over as many devices, STEPS steps straight
  (weights within 1e-5, same eval metric); then (a copy of) that Loop run
  resumes under FSDP (same checkpoint names)."""
  (one_dir, one_out), fsdp_dir = one_process, tmp_path / 'fsdp'
  for steps in (STEPS // 2, STEPS):
    port = free_port()
    runs = [_fsdp_run(fsdp_dir, steps, 2,
                      f'--coordinator_address=127.0.0.1:{port}',
                      '--num_processes=2', f'--process_id={i}',
                      '--heartbeat_timeout_s=10') for i in range(2)]
    results = [finish(p) for p in runs]
    for code, _, err in results:
      assert code == 0, err[-3000:]
  out0 = results[0][1]
  assert f'Resuming from checkpoint at step {STEPS // 2}' in out0, out0[-2000:]
  assert 'with FSDP over 4 device(s), 2 processes' in out0
  arrays = fsdp_dir / 'checkpoints' / str(STEPS) / 'arrays'
  assert {'ocdbt.process_0', 'ocdbt.process_1'} <= set(os.listdir(arrays))
  assert _events(fsdp_dir, 'train') and _events(fsdp_dir, 'eval')
  (w_fsdp, ppl_fsdp), (w_loop, ppl_loop) = (
      _final(fsdp_dir, out0), _final(one_dir, one_out))
  difference = max(float(np.max(np.abs(a - b)))
                   for a, b in zip(w_fsdp, w_loop))
  print(f'FSDP 2 x 2 ({STEPS // 2} + {STEPS // 2} steps) vs Trax Loop 1 x 4: '
        f'max |weight difference| {difference:.2e}; eval log_perplexity '
        f'{ppl_fsdp} vs {ppl_loop}')
  assert len(w_fsdp) == len(w_loop) and difference < 1e-5
  assert ppl_fsdp == pytest.approx(ppl_loop, abs=2e-4)
  loop_dir = tmp_path / 'loop'
  shutil.copytree(one_dir, loop_dir)
  code, out, err = finish(_fsdp_run(
      loop_dir, STEPS + 2, 2,
      '--config=terraformer.train.fsdp_gather_weights=True'))
  assert code == 0, err[-3000:]
  assert f'Resuming from checkpoint at step {STEPS}' in out


def test_process_batches_are_fed_as_they_are_plain_ones_split(monkeypatch):
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  from terraformer.data import streaming  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(distributed, 'is_multiprocess', lambda: True)
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(jax, 'process_index', lambda: 1)
  rows = np.arange(8).reshape(4, 2)
  stream = training._this_process_rows(  # pylint: disable=protected-access
      lambda: iter([(rows,), streaming.ProcessBatch((rows,))]))
  plain, local = list(stream())
  np.testing.assert_array_equal(plain[0], rows[2:])  # Process 1's half.
  np.testing.assert_array_equal(local[0], rows)  # Already its rows.


_FAKE_CHILD = '''
import os, sys
from terraformer import supervisor
supervisor.report('process', 1, 2)
supervisor.report('step', 7)
print('a line of Python on stderr', file=sys.stderr, flush=True)
if sys.argv[1] == 'coordinator_died':
  sys.stderr.write(
      'W1125 10:08:53.750780   20441 preemption_sync_manager.cc:147] Failed '
      'to retrieve preemption notice from coordination service\\n'
      ':UNKNOWN:Error received from peer  {grpc_status:14}\\n'
      'E1125 09:58:34.091075   15260 coordination_service_agent.cc:289] '
      'Polled an error from coordination service\\n'
      'F1125 09:58:34.091159   15260 client.h:80] Terminating process because '
      'the JAX distributed service detected fatal errors. absl::Status: '
      'UNAVAILABLE: Failed to send RPC to coordination service. Either the '
      'leader task was preempted/died\\n*** Check failure stack trace: ***\\n'
      '    @     0x7fba8f040634  absl::LogMessage::SendToLog()\\n')
  sys.stderr.flush()
  os.abort()
print('W1125 10:00:00.000000 1 x.cc:1] a native warning', file=sys.stderr)
sys.exit(int(sys.argv[1]))
'''


@pytest.mark.parametrize('case', ['coordinator_died', '0', '3'])
def test_supervise_turns_a_peers_death_into_one_line(tmp_path, capfd, case):
  """`supervisor.supervise` (multi-process terraformer-train): a child that
  ends in JAX's fatal log of a dead coordinator gives one line and exit 2;
  otherwise the child's stderr passes whole and its exit code is kept."""
  from terraformer import supervisor  # pylint: disable=g-import-not-at-top
  (tmp_path / 'fake_child.py').write_text(_FAKE_CHILD)
  path = os.environ.get('PYTHONPATH', '')
  os.environ['PYTHONPATH'] = os.pathsep.join(
      [str(tmp_path), ROOT] + ([path] if path else []))
  try:
    code = supervisor.supervise('terraformer-train', 'fake_child',
                                ['terraformer-train', case])
  finally:
    os.environ['PYTHONPATH'] = path
  err = capfd.readouterr().err
  lines = [l for l in err.splitlines() if l]
  assert lines[0] == 'a line of Python on stderr'
  if case == 'coordinator_died':
    assert code == 2
    assert lines[1:] == [
        'terraformer-train: error: process 1 of 2: process 0 (the '
        'coordinator) died after step 7; run the same command again on every '
        'process: it resumes from the last checkpoint']
  else:
    assert code == int(case)
    assert lines[1:] == ['W1125 10:00:00.000000 1 x.cc:1] a native warning']
