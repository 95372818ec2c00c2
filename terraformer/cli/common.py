"""Shared CLI plumbing: flags, gin parsing and the error policy.

Flags follow Trax's trainer: `--config_file` (repeatable), `--config`
(repeatable gin bindings), `--output_dir`. User errors (bad config, missing
file, unwritable directory, `TerraformerError`) and the machine's (an
OSError: disk full, permissions) print ONE line,
`<prog>: error: <message>`, on stderr and exit with status 2; nothing is
written before the config, model and data have been checked.
"""
import contextlib
import importlib
import logging
import os
import sys
import tempfile

from absl import flags
import gin

from terraformer import errors

EXIT_USAGE = 2

# Modules whose import registers gin configurables (Trax's first, as in
# `trax/trainer.py`, then ours).
_CONFIGURABLE_MODULES = (
    'trax.models', 'trax.optimizers', 'trax.supervised.lr_schedules',
    'terraformer.layers', 'terraformer.models', 'terraformer.data',
    'terraformer.training', 'terraformer.param_count',
    'terraformer.evaluation',  # text_vocab, bound in the gin files.
)

# The repository's gin/ folder: `include 'scaling_800m/base.gin'` resolves
# against it (and against each config file's folder and that folder's parent).
_GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), 'gin')


def define_config_flags(flag_values):
  """Defines --config_file and --config on `flag_values`."""
  flags.DEFINE_multi_string(
      'config_file', None, 'Gin config file; repeat to use several.',
      flag_values=flag_values)
  flags.DEFINE_multi_string(
      'config', None,
      "Gin binding, e.g. --config='terraformer.train.steps = 10'; repeat to "
      'use several.', flag_values=flag_values)


def _one_line(error):
  """`error` as one line: gin's extra lines (location) joined with '; '."""
  text = error.args[0] if isinstance(error, KeyError) and error.args else error
  lines = [line.strip() for line in str(text).splitlines()]
  lines = [l for l in lines if l and set(l) != {'^'}]
  return '; '.join(lines) or type(error).__name__


@contextlib.contextmanager
def _quiet_stderr():
  """Hides what is written to stderr (fd 2) inside, unless an error occurs.

  Importing Trax makes TF/XLA (C++) and Gym print notices on stderr; they would
  bury the one-line error messages.
  """
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


def setup():
  """Applies the compat fixes and registers all gin configurables."""
  with _quiet_stderr():
    from terraformer import compat  # pylint: disable=g-import-not-at-top
    compat.apply()
    for name in _CONFIGURABLE_MODULES:
      importlib.import_module(name)


def check_config_files(config_files):
  """Raises TerraformerError unless each config file exists."""
  for path in config_files or []:
    if not os.path.isfile(path):
      raise errors.TerraformerError(f'config file {path!r} not found')


def parse_gin(config_files, bindings):
  """Parses gin files and bindings; raises TerraformerError on any problem."""
  config_files, bindings = list(config_files or []), list(bindings or [])
  check_config_files(config_files)
  gin.clear_config()
  search = [_GIN_DIR] if os.path.isdir(_GIN_DIR) else []
  for path in config_files:
    folder = os.path.dirname(os.path.abspath(path))
    search += [folder, os.path.dirname(folder)]
  for folder in dict.fromkeys(search):  # Unique, in order.
    gin.add_config_file_search_path(folder)
  # Gin logs 'Path not found' for each search path it tries on an include,
  # even when a later one has the file: drop those records.
  not_found = lambda record: record.msg != 'Path not found: %s'
  logging.getLogger().addFilter(not_found)
  try:
    # Not finalized (locked): `main(argv)` may run again in one process.
    gin.parse_config_files_and_bindings(config_files, bindings,
                                        finalize_config=False)
  except (ValueError, KeyError, TypeError, SyntaxError, OSError,
          ImportError) as e:
    raise errors.TerraformerError(f'bad gin config: {_one_line(e)}') from None
  finally:
    logging.getLogger().removeFilter(not_found)


def require_bindings(configurable, names):
  """Raises TerraformerError unless each `configurable.name` is bound."""
  missing = []
  for name in names:
    try:
      gin.query_parameter(f'{configurable}.{name}')
    except ValueError:
      missing.append(f'{configurable}.{name}')
  if missing:
    raise errors.TerraformerError(
        'missing gin binding(s): ' + ', '.join(missing))


def check_output_dir(path):
  """Raises TerraformerError unless `path` is, or can become, a writable dir."""
  if not path:
    raise errors.TerraformerError('--output_dir is required')
  path = os.path.abspath(os.path.expanduser(path))
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise errors.TerraformerError(
        f'output_dir {path!r} is not writable: {existing!r} is not a '
        'directory')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise errors.TerraformerError(
        f'output_dir {path!r} is not writable: no write permission on '
        f'{existing!r}')
  return path


def run(prog, argv, define_flags, body, precheck=None):
  """Runs `body(flag_values)` under the CLI error policy; returns exit code.

  Args:
    prog: program name for messages, e.g. 'terraformer-train'.
    argv: command line, argv[0] being the program (sys.argv if None).
    define_flags: function defining this CLI's flags on a FlagValues.
    body: function(flag_values) doing the work, after gin is parsed.
    precheck: optional function(flag_values) run before the (slow) imports.
  """
  argv = sys.argv if argv is None else argv
  flag_values = flags.FlagValues()
  define_config_flags(flag_values)
  define_flags(flag_values)
  if any(a in ('-h', '--help', '-help', '--helpfull') for a in argv[1:]):
    print(f'usage: {prog} [flags]\n{flag_values.get_help()}')
    return 0
  try:
    extra = flag_values(list(argv))[1:]
    if extra:
      raise errors.TerraformerError(
          f'unexpected argument(s): {" ".join(extra)}')
    check_config_files(flag_values.config_file)
    if precheck:
      precheck(flag_values)
    setup()
    parse_gin(flag_values.config_file, flag_values.config)
    return body(flag_values) or 0
  except flags.Error as e:
    print(f'{prog}: error: {errors.first_line(e)}', file=sys.stderr)
  except errors.TerraformerError as e:
    print(f'{prog}: error: {errors.first_line(e)}', file=sys.stderr)
  except OSError as e:  # The machine's state (disk full, permissions).
    where = f': {e.filename}' if e.filename else ''
    print(f'{prog}: error: {e.strerror or errors.first_line(e)}{where}',
          file=sys.stderr)
  except Exception as e:  # pylint: disable=broad-except
    # Trax re-raises errors of a layer's init or forward as a LayerError
    # whose text holds the original one: a TerraformerError there (e.g. a
    # pooling ratio that is not a power of 2) is still the user's error.
    message = wrapped_user_error(e)
    if message is None:
      raise
    print(f'{prog}: error: {message}', file=sys.stderr)
  return EXIT_USAGE


def wrapped_user_error(error):
  """The message of a TerraformerError inside Trax's LayerError, or None."""
  marker = 'terraformer.errors.TerraformerError: '
  for line in str(error).splitlines():
    if marker in line:
      return line.split(marker, 1)[1].strip()
  return None
