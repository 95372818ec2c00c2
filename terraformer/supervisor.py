"""A peer's death in one line: `terraformer-train` as a parent and a child.

JAX's coordination service ends a process whose peer or coordinator dies
with abort() from C++: a multi-line fatal log and exit 134 (SIGABRT). The
hook it has for that, `missed_heartbeat_callback` of jaxlib's
`get_distributed_runtime_client`, cannot be a Python function in jaxlib
0.10.2 (calling it with the absl::Status ends in std::bad_cast and
std::terminate: tried). So a multi-process `terraformer-train` runs as a thin
parent (`supervise`: the standard library only, no JAX) and a child that does
the work and reports its process index and steps on a pipe (`report`); the
parent passes the child's output through and turns its death by a peer's
into one line and exit 2.
"""
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

_STATUS_FD = 'TERRAFORMER_STATUS_FD'  # The child's end of the status pipe.
_STATUS = [None]  # The child's status pipe (a file), once opened.
# JAX's fatal log of a dead peer or coordinator (xla client.h; the service).
_JAX_FATAL = 'JAX distributed service detected fatal errors'
_COORDINATOR_GONE = 'Failed to send RPC to coordination service'
_UNHEALTHY = re.compile(r'tasks are unhealthy \(stopped sending heartbeats\)'
                        r':\s*([\d,\s]+)')
_NATIVE_LOG = re.compile(r'^[WEF]\d{4} |^terminate called')
_HOLD_S = 30.0  # Seconds a native warning is held, waiting for a death.


def report(kind, *values):
  """Tells a `supervise` parent (if any) how this process stands."""
  if _STATUS[0] is None and _STATUS_FD in os.environ:
    try:
      _STATUS[0] = os.fdopen(int(os.environ[_STATUS_FD]), 'w', buffering=1)
    except (OSError, ValueError):
      os.environ.pop(_STATUS_FD)
  if _STATUS[0] is not None:
    try:
      _STATUS[0].write(' '.join(str(v) for v in (kind,) + values) + '\n')
    except OSError:
      pass


def _die_with_parent(parent):
  """Linux: this process gets SIGKILL when its parent (`supervise`) dies,
  so that killing the command kills the work."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG.
  except (OSError, AttributeError):
    return
  if os.getppid() != parent:  # The parent died before prctl.
    os._exit(1)  # pylint: disable=protected-access


def supervise(prog, module, argv):
  """Runs `python -m module argv[1:]` as a child and returns its exit code,
  with a peer's death as one line on stderr and exit 2; returns None (go
  on) in the child itself.

  The line: `<prog>: error: process I of N: <which process died> after step
  S; run the same command again on every process: it resumes from the last
  checkpoint`. SIGTERM is passed to the child, SIGINT ignored (the child,
  in the same process group, gets the terminal's Ctrl-C itself); if this
  parent is killed, the child is too.
  """
  if _STATUS_FD in os.environ:  # The child.
    _die_with_parent(int(os.environ.get('TERRAFORMER_PARENT', '0')))
    return None
  read_end, write_end = os.pipe()
  env = dict(os.environ, TERRAFORMER_STATUS_FD=str(write_end),
             TERRAFORMER_PARENT=str(os.getpid()))
  child = subprocess.Popen([sys.executable, '-m', module, *argv[1:]], env=env,
                           pass_fds=(write_end,), stderr=subprocess.PIPE)
  os.close(write_end)
  status = {}
  previous = {
      signal.SIGTERM: signal.signal(
          signal.SIGTERM, lambda sig, _: child.send_signal(sig)),
      signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
  try:
    readers = [threading.Thread(target=_read_status, args=(read_end, status)),
               threading.Thread(target=_pass_stderr,
                                args=(child.stderr, prog, status))]
    for reader in readers:
      reader.start()
    code = child.wait()
    for reader in readers:
      reader.join()
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  if status.get('peer_failed') or status.get('fatal'):
    print(peer_death_line(prog, status), file=sys.stderr, flush=True)
    return 2
  sys.stderr.write(''.join(status.get('held', [])))  # No peer died.
  sys.stderr.flush()
  return code if code >= 0 else 128 - code


def _read_status(fd, status):
  with os.fdopen(fd) as f:
    for line in f:
      if line.split():
        kind, *values = line.split()
        status[kind] = values or True


def _pass_stderr(stream, prog, status):
  """Copies the child's stderr to ours, but holds what follows a native
  (C++) warning or error line or the child's `<prog>: error:` line: JAX's
  log of a dead peer starts with such lines and ends in its fatal log. If
  no death follows within `_HOLD_S` seconds, or the child ends otherwise,
  the held lines are passed on; if one does, `supervise` replaces them by
  one line."""
  held, since = [], None  # Lines held, and since when.
  fd = stream.fileno()
  buffer = b''
  while True:
    ready = select.select([fd], [], [], 0.5)[0]
    chunk = os.read(fd, 65536) if ready else None
    if chunk == b'':
      break
    lines = []
    if chunk:
      buffer += chunk
      *lines, buffer = buffer.split(b'\n')
    for line in lines:
      text = line.decode(errors='replace') + '\n'
      if _JAX_FATAL in text:
        status['fatal'] = True
      if since is None and (_NATIVE_LOG.match(text)
                            or text.startswith(f'{prog}: error:')):
        since = time.monotonic()
      if since is None:
        sys.stderr.write(text)
      else:
        held.append(text)
    if (since is not None and not status.get('fatal')
        and time.monotonic() - since > _HOLD_S):
      sys.stderr.write(''.join(held))  # No death came of it.
      held, since = [], None
    sys.stderr.flush()
  if buffer:
    held.append(buffer.decode(errors='replace'))
  status['held'] = held


def peer_death_line(prog, status):
  """The one line of a process whose peer or coordinator died."""
  me, count = (status.get('process') or ['?', '?'])[:2]
  step = (status.get('step') or ['0'])[0]
  log = ''.join(status.get('held', []))
  unhealthy = _UNHEALTHY.search(log)
  if _COORDINATOR_GONE in log:
    what = 'process 0 (the coordinator) died'
  elif unhealthy:
    dead = ', '.join(unhealthy.group(1).split())
    what = (f'process {dead} died (no heartbeat)' if ',' not in dead
            else f'processes {dead} died (no heartbeat)')
  elif count == '2' and me in ('0', '1'):
    what = (f'process {1 - int(me)}'
            f'{" (the coordinator)" if me == "1" else ""} died (a '
            'collective with it failed)')
  else:
    what = 'another process died (a collective with it failed)'
  return (f'{prog}: error: process {me} of {count}: {what} after step '
          f'{step}; run the same command again on every process: it '
          'resumes from the last checkpoint')
