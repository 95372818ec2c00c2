"""JAX's persistent compilation cache in the CLIs (terraformer.runtime).

`terraformer-train` on a tiny LM writes its compiled training step into the
cache directory; `--compilation_cache=false` writes
nothing (TERRAFORMER_COMPILATION_CACHE=off gives the same directory, None). Every program is written
here (threshold 0 s), so the check does not depend on the machine's speed.
"""
import os

import pytest

from terraformer import runtime
from terraformer.cli import train

import tiny_lm


def _train(tmp_path, cache, *flags):
  """terraformer-train, 1 step, in this process; returns the cache's files."""
  out_dir = tmp_path / 'out'
  config = tiny_lm.write_config(tmp_path)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(runtime, 'CACHE_MIN_COMPILE_SECS', 0.0)
    patch.delenv(runtime.CACHE_MIN_COMPILE_SECS_ENV, raising=False)
    patch.setenv(runtime.COMPILATION_CACHE_ENV, str(cache))
    code = train.main(['terraformer-train', f'--config_file={config}',
                       f'--output_dir={out_dir}', '--steps=1', *flags])
  assert code == 0 and (out_dir / 'model.pkl.gz').exists()
  return sorted(os.listdir(cache)) if cache.exists() else []


def test_train_writes_its_compiled_step_to_the_cache(tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  before = jax.config.jax_compilation_cache_dir
  files = _train(tmp_path, tmp_path / 'cache')
  # Trax's training step (Loop -> Trainer: `single_device_update_fn`).
  assert [f for f in files if f.startswith('jit_single_device_update_fn-')
          and f.endswith('-cache')], files
  assert jax.config.jax_compilation_cache_dir == before  # Set back after.


def test_the_off_flag_writes_nothing(tmp_path):
  assert _train(tmp_path, tmp_path / 'cache',
                '--compilation_cache=false') == []


def test_cache_directory_from_the_environment(tmp_path):
  # `off` gives the directory None, which the CLIs run with as the flag's off.
  assert runtime.compilation_cache_dir(
      {runtime.COMPILATION_CACHE_ENV: 'OFF'}) is None
  assert runtime.compilation_cache_dir(
      {runtime.COMPILATION_CACHE_ENV: str(tmp_path / 'c')}) == str(
          tmp_path / 'c')
  assert runtime.compilation_cache_dir(
      {'XDG_CACHE_HOME': str(tmp_path)}) == str(tmp_path / 'terraformer' /
                                                 'jax')
  home = os.path.expanduser('~')
  assert runtime.compilation_cache_dir({}) == os.path.join(
      home, '.cache', 'terraformer', 'jax')


def test_an_unusable_cache_directory_is_a_notice_not_an_error(tmp_path,
                                                               capsys):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with runtime.compilation_cache(str(blocker / 'cache')):
    import jax  # pylint: disable=g-import-not-at-top
    assert not jax.config.jax_enable_compilation_cache
  err = capsys.readouterr().err
  assert err.startswith('terraformer: compilation cache off: cannot create ')
