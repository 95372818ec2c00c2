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
