"""The process around the library: quiet imports, Trax's fixes, progress lines.

`import terraformer` calls `install()`, which:

- hides what TensorFlow/XLA (C++: oneDNN and CUDA-stub notices, absl's "All
  log messages before absl::InitializeLog()") and Gym (its deprecation
  banner) write on stderr while `trax`, `tensorflow` or `gym` is imported,
  and JAX's "jax.process_count has been renamed" warning that Trax's Loop
  triggers; an error raised during such an import shows all that was hidden;
- applies `terraformer.trax_bridge.compat` (Trax 1.4.1 on the pinned JAX)
  right after Trax is imported: the one place the fixes are installed;
- gives XLA's CPU client 4 threads per device in a process of forced host
  devices on fewer cores (`distributed.widen_cpu_client_pool`: else a
  collective can hang).

The log level comes from the environment variable TERRAFORMER_LOG_LEVEL
(`debug`, `info`, `warning` (default), `error`) or the CLIs' `--verbosity`
flag (`set_level`): at `info` and `debug` the library noise is shown again.

`compilation_cache` turns on JAX's persistent compilation cache (the CLIs,
the test suite): a rerun loads the programs an earlier run compiled
(a training step: tens of seconds to minutes on a CPU) from disk.
"""
import contextlib
import importlib.abc
import os
import sys
import tempfile
import warnings

from terraformer import distributed
from terraformer.trax_bridge import compat

LOG_LEVEL_ENV = 'TERRAFORMER_LOG_LEVEL'
LEVELS = ('debug', 'info', 'warning', 'error')
# Top-level packages whose import prints notices on stderr.
NOISY_IMPORTS = ('trax', 'tensorflow', 'gym')
_JAX_RENAMED = r'jax\.\w+ has been renamed to jax\.\w+'

_level = [os.environ.get(LOG_LEVEL_ENV, 'warning').lower()]

COMPILATION_CACHE_ENV = 'TERRAFORMER_COMPILATION_CACHE'
# Programs compiled faster than this are not written: reading one back costs
# about as much. The first training step of a tiny model takes seconds.
# $TERRAFORMER_COMPILATION_CACHE_MIN_SECS, if set, replaces it (the test
# suite writes the ~50 ms programs of weight initialization too: the many
# processes it starts on the same tiny models read them back in less).
CACHE_MIN_COMPILE_SECS = 0.5
CACHE_MIN_COMPILE_SECS_ENV = 'TERRAFORMER_COMPILATION_CACHE_MIN_SECS'
_CACHE_SETTINGS = ('jax_enable_compilation_cache', 'jax_compilation_cache_dir',
                   'jax_persistent_cache_min_compile_time_secs',
                   'jax_persistent_cache_min_entry_size_bytes')


def level():
  """The log level: one of LEVELS."""
  return _level[0] if _level[0] in LEVELS else 'warning'


def set_level(name):
  """Sets the log level (CLI `--verbosity`); ValueError for an unknown one."""
  name = (name or 'warning').lower()
  if name not in LEVELS:
    raise ValueError(f'log level {name!r} is not one of {", ".join(LEVELS)}')
  _level[0] = name
  _filter_warnings()


def verbose():
  """Whether library noise is shown (`info` or `debug`)."""
  return level() in ('debug', 'info')


@contextlib.contextmanager
def quiet():
  """Hides what is written to stderr (fd 2) inside, unless an error occurs
  or the log level is `info`/`debug`. C++ libraries write to fd 2 directly,
  so `sys.stderr` alone would not do."""
  if verbose():
    yield
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as hidden:
    os.dup2(hidden.fileno(), 2)
    try:
      yield
    except BaseException:
      sys.stderr.flush()
      os.dup2(saved, 2)
      hidden.seek(0)
      os.write(2, hidden.read())
      raise
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)


class _QuietImportHook(importlib.abc.MetaPathFinder):
  """Imports NOISY_IMPORTS inside `quiet()`; applies compat after Trax."""

  def find_spec(self, name, path, target=None):
    if name not in NOISY_IMPORTS:
      return None

    def exec_quietly(exec_module, module):
      with quiet():
        exec_module(module)
        if name == 'trax':
          compat.apply()

    return compat.spec_loading_with(name, path, target, exec_quietly)


def compilation_cache_dir(environ=None):
  """The directory of JAX's persistent compilation cache, None when off.

  $TERRAFORMER_COMPILATION_CACHE names it (`off`: no cache); unset, it is
  $XDG_CACHE_HOME/terraformer/jax (default ~/.cache/terraformer/jax), the
  user's own: JAX runs what it finds there, so it must not be a directory
  that others can write (JAX's persistent compilation cache guide).
  """
  environ = os.environ if environ is None else environ
  value = environ.get(COMPILATION_CACHE_ENV, '').strip()
  if value.lower() == 'off':
    return None
  if not value:
    base = (environ.get('XDG_CACHE_HOME') or
            os.path.join(os.path.expanduser('~'), '.cache'))
    value = os.path.join(base, 'terraformer', 'jax')
  return os.path.abspath(os.path.expanduser(value))


def use_compilation_cache(directory):
  """Points JAX's persistent compilation cache at `directory` (None: off);
  returns the previous settings for `restore_compilation_cache`.

  Every program that takes CACHE_MIN_COMPILE_SECS (or
  $TERRAFORMER_COMPILATION_CACHE_MIN_SECS) or more to compile is written,
  whatever its size (JAX: `jax_persistent_cache_min_*`). A
  directory that cannot be created turns the cache off with a notice on
  stderr (the run itself does not need it).
  """
  import jax  # pylint: disable=g-import-not-at-top
  saved = [getattr(jax.config, name) for name in _CACHE_SETTINGS]
  if directory is not None:
    try:
      os.makedirs(directory, exist_ok=True)
    except OSError as e:
      print(f'terraformer: compilation cache off: cannot create {directory}: '
            f'{e.strerror}', file=sys.stderr)
      directory = None
  min_secs = os.environ.get(CACHE_MIN_COMPILE_SECS_ENV, '').strip()
  min_secs = float(min_secs) if min_secs else CACHE_MIN_COMPILE_SECS
  values = ((True, directory, min_secs, -1) if directory
            else (False, None, saved[2], saved[3]))
  _set_compilation_cache(values)
  return saved


def restore_compilation_cache(saved):
  """Puts back the settings that `use_compilation_cache` returned."""
  _set_compilation_cache(saved)


def _set_compilation_cache(values):
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache as cache  # pylint: disable=g-import-not-at-top
  for name, value in zip(_CACHE_SETTINGS, values):
    jax.config.update(name, value)
  cache.reset_cache()  # JAX opens its cache once: open it again, as set.


@contextlib.contextmanager
def compilation_cache(directory):
  """JAX's persistent compilation cache in `directory` (None: off) inside."""
  saved = use_compilation_cache(directory)
  try:
    yield
  finally:
    restore_compilation_cache(saved)


def _filter_warnings():
  action = 'default' if verbose() else 'ignore'
  warnings.filterwarnings(action, message=_JAX_RENAMED)


def install():
  """Quiet imports, Trax's fixes (idempotent); `import terraformer` runs it.
  Also widens XLA's CPU thread pool for forced host devices (before JAX
  starts its CPU client: `distributed.widen_cpu_client_pool`)."""
  compat.speed_up_trax_import()  # Before anything imports Trax (compat fix 0).
  _filter_warnings()
  distributed.widen_cpu_client_pool()
  if 'trax' in sys.modules:  # Imported before terraformer: fix it now.
    compat.apply()
  if not any(isinstance(f, _QuietImportHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _QuietImportHook())
