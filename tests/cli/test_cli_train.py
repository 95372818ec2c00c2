"""terraformer-train: the error policy, and a short run that checkpoints."""
import errno
import os
import socket
import subprocess
import sys

import pytest

import tiny_lm
from terraformer.checkpoint import store as checkpoints
from terraformer.cli import train as train_cli

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(capsys, *args):
  code = train_cli.main(['terraformer-train', *args])
  out, err = capsys.readouterr()
  return code, out, err


def _assert_one_line_error(err, *parts):
  lines = err.splitlines()
  assert len(lines) == 1, err
  assert lines[0].startswith('terraformer-train: error: ')
  for part in parts:
    assert part in lines[0]
  assert 'Traceback' not in err


@pytest.mark.parametrize('binding, message', [
    ('nonexistent.param = 1', "No configurable matching 'nonexistent'"),
    ('terraformer.train.no_such_arg = 1', 'no_such_arg'),
    ('terraformer.train.steps = ', 'Unable to parse'),
    ('terraformer.train.model = @NoSuchModel', 'NoSuchModel'),
])
def test_bad_binding(tmp_path, capsys, binding, message):
  out_dir = tmp_path / 'out'
  code, _, err = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path),
                      '--config=' + binding, '--output_dir=' + str(out_dir))
  assert code == 2
  _assert_one_line_error(err, 'bad gin config', message)
  assert not out_dir.exists()


def test_missing_config_file(tmp_path, capsys):
  out_dir = tmp_path / 'out'
  code, _, err = _run(capsys, '--config_file=nope.gin',
                      '--output_dir=' + str(out_dir))
  assert code == 2
  _assert_one_line_error(err, "config file 'nope.gin' not found")
  assert not out_dir.exists()


def test_unwritable_output_dir(tmp_path, capsys):
  a_file = tmp_path / 'a_file'
  a_file.write_text('not a directory')
  code, _, err = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path),
                      '--output_dir=' + str(a_file / 'out'))
  assert code == 2
  _assert_one_line_error(err, 'not writable', 'is not a directory')
  assert a_file.read_text() == 'not a directory'


def test_user_error_from_data(tmp_path, capsys):
  out_dir = tmp_path / 'out'
  code, _, err = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path),
                      '--config=train/counting_stream.empty = True',
                      '--output_dir=' + str(out_dir))
  assert code == 2
  _assert_one_line_error(err, 'corpus is empty')
  assert not out_dir.exists()


def test_missing_required_binding_and_flags(tmp_path, capsys):
  out_dir = tmp_path / 'out'
  code, _, err = _run(capsys, '--config=terraformer.train.steps = 2',
                      '--output_dir=' + str(out_dir))
  assert code == 2
  _assert_one_line_error(err, 'terraformer.train.model')
  assert not out_dir.exists()
  code, _, err = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path),
                      '--output_dir=' + str(out_dir), '--stepz=3')
  assert code == 2
  _assert_one_line_error(err, 'stepz')
  code, _, err = _run(capsys, '--config_file=' + tiny_lm.write_config(tmp_path))
  assert code == 2
  _assert_one_line_error(err, 'output_dir')
  assert not out_dir.exists()


def test_train_two_steps_then_resume(tmp_path, capsys):
  config = tiny_lm.write_config(tmp_path)
  out_dir = tmp_path / 'out'
  code, out, _ = _run(capsys, '--config_file=' + config,
                      '--output_dir=' + str(out_dir), '--steps=2')
  assert code == 0
  assert (out_dir / 'model.pkl.gz').exists()
  assert (out_dir / 'config.gin').exists()
  progress = [l for l in out.splitlines() if l.startswith('step ')]
  assert [l.split()[1] for l in progress] == ['1/2', '2/2']
  assert 'eval log_perplexity' in progress[-1]
  assert 'Done: step 2' in out
  code, out, _ = _run(capsys, '--config_file=' + config,
                      '--output_dir=' + str(out_dir), '--steps=3')
  assert code == 0
  assert 'Resuming from checkpoint at step 2' in out
  assert [l.split()[1] for l in out.splitlines() if l.startswith('step ')
         ] == ['3/3']


def test_second_trainer_on_a_held_output_dir_is_refused(tmp_path, capsys):
  """While a trainer holds --output_dir, another one stops at start: one
  line naming the holder, exit 2, nothing written."""
  out_dir = tmp_path / 'out'
  holder = subprocess.Popen(
      [sys.executable, '-c', 'import sys; from terraformer.training import '
       'run_lock; run_lock.RunLock(sys.argv[1]).acquire(); print("held", '
       'flush=True); sys.stdin.read()', str(out_dir)],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == 'held\n'
    files = lambda: sorted((p.name, p.read_bytes(), p.stat().st_mtime_ns)
                           for p in out_dir.rglob('*'))
    before = files()
    code, out, err = _run(capsys, '--config_file=' + tiny_lm.write_config(
        tmp_path), '--output_dir=' + str(out_dir), '--steps=2')
    assert code == 2
    _assert_one_line_error(
        err, f'output_dir {out_dir} is in use by another trainer: pid '
        f'{holder.pid} on host {socket.gethostname()} (started ')
    assert out == ''
    assert files() == before
  finally:
    holder.stdin.close()
    holder.wait(timeout=60)


def test_damaged_newest_checkpoint_disk_full_and_nan(tmp_path, capsys,
                                                     monkeypatch):
  config = tiny_lm.write_config(tmp_path)
  out_dir = tmp_path / 'out'
  run = lambda *args: _run(capsys, '--config_file=' + config,
                           '--output_dir=' + str(out_dir),
                           '--config=terraformer.train.checkpoint_every = 1',
                           *args)
  assert run('--steps=2')[0] == 0
  assert checkpoints.committed_steps(str(out_dir)) == [2, 1]
  # A damaged newest checkpoint is reported and the previous one resumed.
  newest = out_dir / 'checkpoints' / '2'
  for path in newest.glob('arrays/d/*'):
    path.write_bytes(path.read_bytes()[:10])
  code, out, err = run('--steps=3')
  assert code == 0, err
  assert 'Resuming from checkpoint at step 1 ' in out
  assert [l for l in err.splitlines() if 'damaged' in l] == [
      l for l in err.splitlines() if l.startswith('Checkpoint step 2 in ')]
  assert 'Traceback' not in err
  assert checkpoints.committed_steps(str(out_dir)) == [3, 2]
  # Disk full while saving step 4: one line, no partial files, 3 kept.
  def no_space(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
  monkeypatch.setattr(checkpoints, 'fsync_tree', no_space)
  code, _, err = run('--steps=4')
  assert code == 2
  _assert_one_line_error(err, 'cannot save the checkpoint of step 4',
                         '(disk full); partial files removed, last good '
                         'checkpoint: step 3')
  assert sorted(os.listdir(out_dir / 'checkpoints')) == ['2', '3']
  monkeypatch.undo()
  # A NaN loss stops training: one line with the step, nothing saved for it.
  code, _, err = run('--steps=6', '--config=multifactor.constant = 1e10')
  assert code == 2
  _assert_one_line_error(err, 'non-finite', 'at step 5: training stopped, '
                         'nothing saved for this step; last checkpoint: '
                         'step 4')
  assert checkpoints.committed_steps(str(out_dir)) == [4, 3]


def test_console_script_end_to_end(tmp_path):
  """The installed entry point, in a fresh process: train, then a bad run."""
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-train')
  env = dict(os.environ, PYTHONPATH=HERE)
  config = tiny_lm.write_config(tmp_path)
  out_dir = tmp_path / 'out'
  done = subprocess.run(
      [exe, '--config_file=' + config, '--output_dir=' + str(out_dir),
       '--steps=2'], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert (out_dir / 'model.pkl.gz').exists()
  bad = subprocess.run(
      [sys.executable, '-m', 'terraformer.cli.train', '--config_file=' + config,
       '--config=nonexistent.param = 1', '--output_dir=' + str(tmp_path / 'x')],
      env=env, capture_output=True, text=True, timeout=300)
  assert bad.returncode == 2
  # Exactly one line: Trax's import noise (TF, XLA, Gym) is hidden too.
  assert bad.stderr.splitlines() == [
      "terraformer-train: error: bad gin config: No configurable matching "
      "'nonexistent'.; In bindings string line 1; nonexistent.param = 1"]
  assert not (tmp_path / 'x').exists()
