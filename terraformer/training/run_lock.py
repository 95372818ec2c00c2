"""One writer per run directory: the lock a trainer holds on its output_dir.

Two trainers started on one `output_dir` (two terminals, or a scheduler that
requeues a job whose first copy still runs) would both write checkpoints and
events into it. A trainer therefore holds an OS file lock
(`fcntl.flock(LOCK_EX)`) on `<output_dir>/run.lock` for as long as it runs;
the file says who holds it (host, pid, start time), for the message.

- A second trainer finds the lock taken and stops before writing anything:
  `RunDirInUse`, one line naming the holder's host and pid (the CLIs exit 2).
  It only opens the existing file and reads it.
- The kernel drops the lock when its holder dies, however it dies; so the
  lock of a dead run is free, and there is no staleness to judge from pids
  or clocks. A lock file still holding its holder's line was left by a run
  that did not end normally: the next trainer takes it over, with one line
  naming the dead holder.
- A trainer that ends (normally or by an exception) removes the file, then
  drops the lock. The one that waits on the removed file sees that the path
  no longer names the file it locked, and tries again (the usual flock-file
  protocol), so two trainers never each hold "the" lock.
- Multi-process runs: process 0 alone holds it (it alone owns output_dir;
  the others only write their checkpoint shards), see `terraformer.train`.

Across hosts the lock is only as good as the file system's flock: local
disks, NFSv4 and Lustre (mounted with `-o flock`) share it between hosts. On
a file system without flock (`ENOLCK`, `EOPNOTSUPP`) training goes on
unlocked after one line saying so.
"""
import errno
import fcntl
import json
import os
import socket
import time

from terraformer import errors

LOCK_FILE = 'run.lock'
# flock errors of a file system that does not support it (not "taken").
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


class RunDirInUse(errors.TerraformerError):
  """Another live trainer holds the output directory."""


def _describe(holder):
  """'pid N on host H (started T)' of a lock file's content, as far as it
  can be read."""
  try:
    who = json.loads(holder)
    return (f'pid {who["pid"]} on host {who["host"]} (started '
            f'{who["started"]})')
  except (ValueError, TypeError, KeyError):
    return 'a process that has not written its host and pid yet'


def _read(fd):
  os.lseek(fd, 0, os.SEEK_SET)
  return os.read(fd, 4096).decode('utf-8', 'replace').strip()


class RunLock:
  """The lock of one output directory; a context manager (`acquire` on
  entry, `release` on exit, exceptions included).

  `made_dir`: whether `acquire` made the directory (the run starts fresh:
  nothing of value is in it).
  """

  def __init__(self, output_dir):
    self.output_dir = output_dir
    self.path = os.path.join(output_dir, LOCK_FILE)
    self.made_dir = False
    self._fd = None

  def acquire(self):
    """Takes the lock or raises `RunDirInUse` (writing nothing)."""
    self.made_dir = not os.path.isdir(self.output_dir)
    os.makedirs(self.output_dir, exist_ok=True)
    while True:
      # Opening an existing file (read-write: NFS locks need it) changes
      # nothing in it: a refused trainer writes nothing.
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunDirInUse(
            f'output_dir {self.output_dir} is in use by another trainer: '
            f'{_describe(holder)}; wait for it to end or use another '
            'output_dir') from None
      except OSError as e:
        os.close(fd)
        if e.errno not in _UNSUPPORTED:
          raise
        print(f'Cannot lock {self.path} ({os.strerror(e.errno)}): this file '
              'system has no flock, so a second trainer on this output_dir '
              'would not be refused', flush=True)
        return self
      if self._names(fd):
        break
      os.close(fd)  # Its holder removed it as we waited: lock the new one.
    self._fd = fd
    left = _read(fd)
    if left:
      print(f'Taking over {self.path}: its holder, {_describe(left)}, ended '
            'without releasing it', flush=True)
    self._write(json.dumps({'host': socket.gethostname(), 'pid': os.getpid(),
                            'started': time.strftime('%Y-%m-%d %H:%M:%S')}))
    return self

  def _names(self, fd):
    """Whether `self.path` still names the file open as `fd`."""
    try:
      named = os.stat(self.path)
    except FileNotFoundError:
      return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)

  def _write(self, line):
    os.ftruncate(self._fd, 0)
    os.pwrite(self._fd, (line + '\n').encode(), 0)

  def release(self):
    """Removes the lock file (if it is still this lock's) and unlocks."""
    if self._fd is None:
      return
    fd, self._fd = self._fd, None
    try:
      if self._names(fd):
        os.remove(self.path)
    finally:
      os.close(fd)  # Drops the flock.

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc_info):
    self.release()
