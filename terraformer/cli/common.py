"""Shared CLI plumbing: flags and the error policy (gin: `terraformer.config`).

Flags follow Trax's trainer: `--config_file` (repeatable), `--config`
(repeatable gin bindings), `--output_dir`. User errors (bad config, missing
file, unwritable directory, `TerraformerError`) and the machine's (an
OSError: disk full, permissions) print ONE line,
`<prog>: error: <message>`, on stderr and exit with status 2; nothing is
written before the config, model and data have been checked.

Compiled programs are kept in JAX's persistent compilation cache
(`runtime.compilation_cache_dir`: $TERRAFORMER_COMPILATION_CACHE, else
~/.cache/terraformer/jax), so a rerun does not compile them again;
`--compilation_cache=false` (or TERRAFORMER_COMPILATION_CACHE=off) turns it
off.
"""
import os
import sys

from absl import flags

from terraformer import config
from terraformer import errors
from terraformer import runtime
from terraformer.cli import configurables

EXIT_USAGE = 2


def define_config_flags(flag_values):
  """Defines --config_file, --config, --verbosity and --compilation_cache
  on `flag_values`."""
  flags.DEFINE_multi_string(
      'config_file', None, 'Gin config file; repeat to use several.',
      flag_values=flag_values)
  flags.DEFINE_multi_string(
      'config', None,
      "Gin binding, e.g. --config='terraformer.train.steps = 10'; repeat to "
      'use several.', flag_values=flag_values)
  flags.DEFINE_enum(
      'verbosity', None, runtime.LEVELS,
      f'Log level; debug/info also show the libraries\' start-up notices '
      f'(TensorFlow, Gym, JAX). Default: ${runtime.LOG_LEVEL_ENV} or warning.',
      flag_values=flag_values)
  flags.DEFINE_boolean(
      'compilation_cache', True,
      'Keep compiled programs in JAX\'s persistent compilation cache, '
      f'${runtime.COMPILATION_CACHE_ENV} (a directory, or off) or '
      '~/.cache/terraformer/jax, so that a rerun loads them.',
      flag_values=flag_values)


def setup():
  """Registers all gin configurables, the import noise of Trax/TF hidden."""
  with runtime.quiet():
    configurables.register()


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


def check_writable_file(path, flag):
  """Raises TerraformerError unless `--flag=path` can be written (its folder
  exists and is writable, and it is not a folder); no-op without a path."""
  if not path:
    return
  folder = os.path.dirname(os.path.abspath(path)) or '.'
  if not os.path.isdir(folder):
    raise errors.TerraformerError(
        f'--{flag}={path}: folder {folder!r} does not exist')
  if not os.access(folder, os.W_OK):
    raise errors.TerraformerError(
        f'--{flag}={path}: folder {folder!r} is not writable')
  if os.path.isdir(path):
    raise errors.TerraformerError(f'--{flag}={path} is a directory')


def positive_ints(values, flag):
  """The list flag `--flag`'s values as positive integers, else one line."""
  try:
    ints = [int(v) for v in values]
  except ValueError:
    raise errors.TerraformerError(
        f'--{flag} must be integers, got {",".join(values)!r}') from None
  if not ints or min(ints) < 1:
    raise errors.TerraformerError(f'--{flag} must be positive integers')
  return ints


# ---------------------------------------------------------------------------
# Tables. A CLI's tables are made once, by its formatter: `{"columns": [...],
# "rows": [[cell, ...]]}` of strings, the cells as the docs show them. The CLI
# prints them and its --json holds them under "tables" (by name, beside its
# raw fields), where tools/experiment_tables.py reads them for the results
# files.

MISSING = '–'  # A cell without a value.


def table(columns, rows):
  """A table: its columns and rows (lists of strings)."""
  return {'columns': list(columns), 'rows': [list(row) for row in rows]}


def format_aligned(tab):
  """A table as text: first column left-aligned, the others right-aligned."""
  lines = [tab['columns']] + tab['rows']
  widths = [max(len(line[i]) for line in lines)
            for i in range(len(tab['columns']))]
  return '\n'.join('  '.join(c.ljust(w) if i == 0 else c.rjust(w)
                              for i, (c, w) in enumerate(zip(line, widths)))
                   .rstrip() for line in lines)


def with_tables(report, tables):
  """The --json of a CLI: its report (a dict of raw fields) with the tables
  it printed, by name, under "tables"."""
  return dict(report, tables=tables)


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
    if flag_values.verbosity:
      runtime.set_level(flag_values.verbosity)
    config.check_config_files(flag_values.config_file)
    if precheck:
      precheck(flag_values)
    cache_dir = (runtime.compilation_cache_dir()
                 if flag_values.compilation_cache else None)
    with runtime.compilation_cache(cache_dir):
      setup()
      config.parse_gin(flag_values.config_file, flag_values.config)
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
