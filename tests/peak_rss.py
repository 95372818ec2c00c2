"""Peak resident memory of one child process, for memory tests.

`resource.getrusage(RUSAGE_SELF/RUSAGE_CHILDREN).ru_maxrss` is a peak over
the whole life of the test process or over all its children so far, so an
earlier, larger allocation hides a new one. `os.wait4` on a direct child is
not enough either: Linux carries the high-water RSS of the forked image across
`exec` (`exec_mmap` keeps the old mm's peak in `signal->maxrss`), so a child
forked from a pytest process that has grown to 6 GiB reports at least 6 GiB.

So the command runs under a small launcher (`python -S`, ~10 MB once exec'd):
the launcher forks the real command from its own small image, reaps it with
`os.wait4` and writes that process's own `ru_maxrss` to a file.
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading

_LAUNCHER = r'''
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
with open(sys.argv[1], 'w') as f:
  f.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) % 256)
'''


def run(args, timeout, **popen_kwargs):
  """Runs `args`; returns (returncode, stdout, stderr, peak RSS in KiB).

  The command (and its launcher) is killed after `timeout` seconds; the
  returncode is then -9 and the peak RSS None.
  """
  with tempfile.TemporaryFile('w+') as out, \
       tempfile.TemporaryFile('w+') as err, \
       tempfile.TemporaryDirectory() as tmp:
    rss_file = os.path.join(tmp, 'maxrss_kib')
    launcher = subprocess.Popen(
        [sys.executable, '-S', '-c', _LAUNCHER, rss_file, *args],
        stdout=out, stderr=err, text=True, start_new_session=True,
        **popen_kwargs)
    timed_out = threading.Event()

    def kill_group():
      timed_out.set()
      os.killpg(launcher.pid, signal.SIGKILL)

    killer = threading.Timer(timeout, kill_group)
    killer.start()
    try:
      code = launcher.wait()
    finally:
      killer.cancel()
    out.seek(0)
    err.seek(0)
    if timed_out.is_set():
      return -9, out.read(), err.read(), None
    with open(rss_file) as f:
      peak_kib = int(f.read())
    if code > 128:  # the launcher's exit code of a command killed by signal N
      code -= 256
    return code, out.read(), err.read(), peak_kib


def run_python(code, timeout, **popen_kwargs):
  """Runs `python -c code` with this interpreter; returns run()'s tuple."""
  return run([sys.executable, '-c', code], timeout, **popen_kwargs)
