"""Peak resident memory of one child process, for memory tests.

`resource.getrusage(RUSAGE_SELF/RUSAGE_CHILDREN).ru_maxrss` is a peak over
the whole life of the test process or over all its children so far, so an
earlier, larger allocation hides a new one (or fails a later test). `os.wait4`
returns the resource usage of the one child it reaps: that child's own peak.
"""
import os
import subprocess
import sys
import tempfile
import threading


def run(args, timeout, **popen_kwargs):
  """Runs `args`; returns (returncode, stdout, stderr, peak RSS in KiB).

  The child is killed after `timeout` seconds (returncode -9 then).
  """
  with tempfile.TemporaryFile('w+') as out, \
       tempfile.TemporaryFile('w+') as err:
    child = subprocess.Popen(args, stdout=out, stderr=err, text=True,
                             **popen_kwargs)
    killer = threading.Timer(timeout, child.kill)
    killer.start()
    try:
      _, status, usage = os.wait4(child.pid, 0)
    finally:
      killer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return child.returncode, out.read(), err.read(), usage.ru_maxrss


def run_python(code, timeout, **popen_kwargs):
  """Runs `python -c code` with this interpreter; returns run()'s tuple."""
  return run([sys.executable, '-c', code], timeout, **popen_kwargs)
