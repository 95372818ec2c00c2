"""Processes of the multi-process tests, on localhost: a free port for the
coordinator, a wait bounded in time."""
import socket
import subprocess

TIMEOUT_S = 420  # A process still running after this long hangs.


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def finish(process, timeout_s=TIMEOUT_S):
  """(exit code, stdout, stderr) of `process`, killed after `timeout_s`."""
  try:
    out, err = process.communicate(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    process.kill()
    out, err = process.communicate()
  return process.returncode, out, err
