"""One writer per run directory: `run_lock.RunLock` and `terraformer.train`'s
use of it (the CLI's refusal: tests/cli/test_cli_train.py)."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from terraformer import errors
from terraformer.training import run_lock

# A trainer's lock in another process: held until a line on stdin, or death.
HOLDER = """
import sys
from terraformer.training import run_lock
lock = run_lock.RunLock(sys.argv[1]).acquire()
print('held', flush=True)
sys.stdin.readline()
lock.release()
print('released', flush=True)
"""


def start_holder(output_dir):
  """A process holding `output_dir`'s lock (it says 'held' first)."""
  holder = subprocess.Popen([sys.executable, '-c', HOLDER, str(output_dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
  assert holder.stdout.readline() == 'held\n'
  return holder


def stop_holder(holder):
  """Lets `start_holder`'s process release the lock and end."""
  holder.stdin.write('\n')
  holder.stdin.flush()
  assert holder.stdout.readline() == 'released\n'
  assert holder.wait(timeout=60) == 0


def _snapshot(folder):
  """name -> (bytes, mtime) of every file under `folder`."""
  files = {}
  for root, _, names in os.walk(folder):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        files[os.path.relpath(path, folder)] = (f.read(),
                                                os.stat(path).st_mtime_ns)
  return files


def test_second_trainer_refused_while_the_holder_lives(tmp_path):
  out = tmp_path / 'run'
  holder = start_holder(out)
  try:
    before = _snapshot(out)
    with pytest.raises(run_lock.RunDirInUse) as refusal:
      run_lock.RunLock(str(out)).acquire()
    message = str(refusal.value)
    assert len(message.splitlines()) == 1
    assert f'output_dir {out} is in use by another trainer: pid {holder.pid} ' \
           f'on host {socket.gethostname()} (started ' in message
    assert isinstance(refusal.value, errors.TerraformerError)  # CLIs: exit 2.
    assert _snapshot(out) == before  # The refused one wrote nothing.
    assert list(before) == [run_lock.LOCK_FILE]
  finally:
    stop_holder(holder)
  # Released at the holder's end: the file is gone, the next one takes it.
  assert not (out / run_lock.LOCK_FILE).exists()
  with run_lock.RunLock(str(out)):
    assert json.loads((out / run_lock.LOCK_FILE).read_text())['pid'] == (
        os.getpid())


def test_lock_of_a_killed_trainer_is_taken_over_with_one_line(tmp_path,
                                                               capsys):
  out = tmp_path / 'run'
  holder = start_holder(out)
  holder.send_signal(signal.SIGKILL)  # No release: the file stays.
  holder.wait(timeout=60)
  holder.stdout.close()
  holder.stdin.close()
  left = json.loads((out / run_lock.LOCK_FILE).read_text())
  assert left['pid'] == holder.pid
  lock = run_lock.RunLock(str(out)).acquire()
  try:
    assert capsys.readouterr().out.splitlines() == [
        f'Taking over {out / run_lock.LOCK_FILE}: its holder, pid '
        f'{holder.pid} on host {left["host"]} (started {left["started"]}), '
        'ended without releasing it']
    assert json.loads((out / run_lock.LOCK_FILE).read_text())['pid'] == (
        os.getpid())
    with pytest.raises(run_lock.RunDirInUse, match=f'pid {os.getpid()} '):
      run_lock.RunLock(str(out)).acquire()  # Held, in this process too.
  finally:
    lock.release()


def test_released_at_exit_and_on_an_exception(tmp_path, capsys):
  out = tmp_path / 'run'
  with run_lock.RunLock(str(out)) as lock:
    assert lock.made_dir
  assert os.listdir(out) == []
  with pytest.raises(ValueError):
    with run_lock.RunLock(str(out)) as lock:
      assert not lock.made_dir
      raise ValueError('a failed step')
  assert os.listdir(out) == []
  with run_lock.RunLock(str(out)):
    pass
  assert capsys.readouterr().out == ''  # Nothing was left to take over.


def test_a_lock_file_removed_while_waiting_is_not_held(tmp_path,
                                                       monkeypatch):
  """The holder removes the file and unlocks while the next trainer has it
  open: that one must lock the path's new file, not the removed one."""
  out = tmp_path / 'run'
  first = run_lock.RunLock(str(out)).acquire()
  opened = []
  real_open = os.open

  def open_then_first_ends(path, *args):
    fd = real_open(path, *args)
    opened.append(os.fstat(fd).st_ino)
    if len(opened) == 1:
      first.release()  # Removes the file this fd names, then unlocks it.
    return fd
  monkeypatch.setattr(run_lock.os, 'open', open_then_first_ends)
  second = run_lock.RunLock(str(out)).acquire()
  monkeypatch.undo()
  try:
    assert len(opened) == 2  # Opened again after finding the file removed.
    assert os.stat(out / run_lock.LOCK_FILE).st_ino == opened[1]
    with pytest.raises(run_lock.RunDirInUse):
      run_lock.RunLock(str(out)).acquire()
  finally:
    second.release()


def test_train_refuses_before_building_anything(tmp_path):
  from terraformer.training import loop  # pylint: disable=g-import-not-at-top
  out = tmp_path / 'run'
  built = []
  holder = start_holder(out)
  try:
    with pytest.raises(run_lock.RunDirInUse, match=f'pid {holder.pid} '):
      loop.train(str(out), model=built.append,
                 train_stream=lambda: built.append('train_stream'),
                 eval_stream=lambda: built.append('eval_stream'), steps=1)
    assert not built
  finally:
    stop_holder(holder)


def test_train_holds_the_lock_on_process_0_only(tmp_path, monkeypatch):
  """Processes other than 0 take no lock and write nothing; they stop with
  process 0's refusal."""
  from terraformer import distributed  # pylint: disable=g-import-not-at-top
  from terraformer.training import loop  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(loop.jax, 'process_index', lambda: 1)
  monkeypatch.setattr(distributed, 'is_multiprocess', lambda: True)
  from_process_0 = []
  monkeypatch.setattr(distributed, 'broadcast_json',
                      lambda value: from_process_0[0])
  out = tmp_path / 'run'
  from_process_0.append(None)  # Process 0 holds it.
  with loop._output_dir_held(str(out)) as made_dir:  # pylint: disable=protected-access
    assert not made_dir
  assert not out.exists()
  from_process_0[0] = 'output_dir D is in use by another trainer: pid 7'
  with pytest.raises(errors.TerraformerError,
                     match='^process 0: output_dir D is in use by another'):
    with loop._output_dir_held(str(out)):  # pylint: disable=protected-access
      pass
  assert not out.exists()
