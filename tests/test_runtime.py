"""terraformer.runtime and the package's face: quiet imports, a log-level
switch, Trax's fixes on import, one-line errors for unknown module paths."""
import os
import subprocess
import sys

import pytest

from terraformer import config
from terraformer import errors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_an_unknown_module_in_a_gin_file_is_one_line(tmp_path):
  gin_file = tmp_path / 'old.gin'
  gin_file.write_text('import terraformer.param_count\n')
  with pytest.raises(errors.TerraformerError) as error:
    config.parse_gin([str(gin_file)], [])
  assert '\n' not in str(error.value)
  assert "No module named 'terraformer.param_count'" in str(error.value)


_IMPORT = ('import terraformer.models; '
           'from terraformer.trax_bridge import compat; '
           'print(sorted(compat.PATCHES) == compat.applied())')


def _import_models(level=None):
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop('TERRAFORMER_LOG_LEVEL', None)
  if level:
    env['TERRAFORMER_LOG_LEVEL'] = level
  return subprocess.run([sys.executable, '-c', _IMPORT], env=env,
                        capture_output=True, text=True, timeout=600,
                        check=True)


def test_import_is_quiet_unless_asked_and_applies_the_fixes():
  quiet = _import_models()
  assert quiet.stdout == 'True\n'  # Every compat fix installed on import.
  assert quiet.stderr == ''
  loud = _import_models('info')
  assert loud.stdout == 'True\n'
  assert loud.stderr.strip()  # The libraries' notices are shown again.


def test_log_level_switch(monkeypatch, capsys):
  from terraformer import runtime  # pylint: disable=g-import-not-at-top
  from terraformer.cli import export  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(runtime, '_level', ['warning'])
  assert not runtime.verbose()
  runtime.set_level('INFO')
  assert runtime.level() == 'info' and runtime.verbose()
  with pytest.raises(ValueError, match='not one of'):
    runtime.set_level('loud')
  # The CLIs' --verbosity: an unknown level is a one-line usage error.
  assert export.main(['terraformer-export', '--verbosity=loud']) == 2
  err = capsys.readouterr().err
  assert err.startswith('terraformer-export: error: ') and err.count('\n') == 1


_POOL = ('import os, sys\n'
         'if sys.argv[1] == "terraformer": import terraformer\n'
         'import jax\n'
         'jax.devices()\n'
         'names = []\n'
         'for t in os.listdir("/proc/self/task"):\n'
         '  try:  # A thread may end meanwhile.\n'
         '    names.append(open(f"/proc/self/task/{t}/comm").read().strip())\n'
         '  except FileNotFoundError:\n'
         '    pass\n'
         'print(len(jax.devices()), names.count("tf_XLAEigen"),\n'
         '      os.environ.get("PJRT_NPROC"))\n')


def _cpu_client_pool(first_import, devices):
  """(devices, threads of XLA's CPU compute pool, PJRT_NPROC) of a fresh
  process that imports `first_import` before JAX starts its CPU client."""
  env = dict(os.environ, PYTHONPATH=ROOT,
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  env.pop('PJRT_NPROC', None)
  env.pop('NPROC', None)
  out = subprocess.run([sys.executable, '-c', _POOL, first_import], env=env,
                       capture_output=True, text=True, timeout=600,
                       check=True).stdout.split()
  return int(out[0]), int(out[1]), out[2]


def test_import_widens_xlas_cpu_pool_for_forced_host_devices():
  """XLA sizes its CPU pools max(cores, devices): with 4 forced devices on
  fewer cores, a collective's parts can leave no thread for the last part
  (a hang). `import terraformer` asks for 4 threads per device there, and
  leaves a one-device process's pool as XLA sizes it."""
  cores = len(os.sched_getaffinity(0))
  devices, threads, _ = _cpu_client_pool('jax', 4)
  assert (devices, threads) == (4, max(cores, 4))  # XLA's own size.
  devices, threads, nproc = _cpu_client_pool('terraformer', 4)
  if cores < 16:
    assert (devices, threads, nproc) == (4, 16, '16')
  else:  # Enough cores: XLA's own pool.
    assert (devices, threads, nproc) == (4, cores, 'None')
  devices, threads, nproc = _cpu_client_pool('terraformer', 1)
  assert (devices, threads, nproc) == (1, cores, 'None')


def test_a_process_of_a_multi_process_job_gets_the_wider_pool(monkeypatch):
  from terraformer import distributed  # pylint: disable=g-import-not-at-top
  for name in ('PJRT_NPROC', 'NPROC', 'XLA_FLAGS'):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(os, 'sched_getaffinity', lambda _: {0, 1})
  distributed.widen_cpu_client_pool()  # One device, one process: as XLA has it.
  assert 'PJRT_NPROC' not in os.environ
  distributed.widen_cpu_client_pool(across_processes=True)
  assert os.environ['PJRT_NPROC'] == '4'
  monkeypatch.setenv('PJRT_NPROC', '3')  # An explicit size is kept.
  distributed.widen_cpu_client_pool(across_processes=True)
  assert os.environ['PJRT_NPROC'] == '3'
