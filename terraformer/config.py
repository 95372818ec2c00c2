"""Configuration: gin files parsed, and the model they configure.

Every experiment constant lives in a gin file (`gin/`); this module is the
one place that reads them: `parse_gin` (with the repository's gin/ folder on
the include path, errors as one `TerraformerError` line),
`register_configurables` (imports Trax's modules whose `@gin.configurable`s
the files bind) and `model_from_config` (the model function bound to
`terraformer.train.model`). CLIs, the OOD harness and the benchmarks build
their models through it.

Our own configurables (layers, models, data, the trainer, ...) live in rooms
this module may not import (its floor or above, CONTRIBUTING.md): the
programs that read gin files register them (`terraformer.cli.configurables`).
"""
import importlib
import logging
import os

import gin

from terraformer import errors

# Trax's modules whose import registers the gin configurables of Trax that
# the files bind (its models, optimizers, learning-rate schedules), as
# `trax/trainer.py` imports them before parsing.
TRAX_CONFIGURABLE_MODULES = (
    'trax.models', 'trax.optimizers', 'trax.supervised.lr_schedules')

# The gin/ folder: `include 'scaling_800m/base.gin'` resolves against it (and
# against each config file's folder and that folder's parent). In a checkout
# it is the repository's gin/; an installed wheel carries it as the package
# folder terraformer/gin_configs (setup.py), since the folder beside an
# installed package is site-packages/gin, gin-config's own.
_PACKAGED_GIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 'gin_configs')
GIN_DIR = (_PACKAGED_GIN_DIR if os.path.isdir(_PACKAGED_GIN_DIR) else
           os.path.join(os.path.dirname(os.path.dirname(
               os.path.abspath(__file__))), 'gin'))


def register_configurables():
  """Imports Trax's modules that register gin configurables."""
  for name in TRAX_CONFIGURABLE_MODULES:
    importlib.import_module(name)


def _one_line(error):
  """`error` as one line: gin's extra lines (location) joined with '; '."""
  text = error.args[0] if isinstance(error, KeyError) and error.args else error
  lines = [line.strip() for line in str(text).splitlines()]
  lines = [l for l in lines if l and set(l) != {'^'}]
  return '; '.join(lines) or type(error).__name__


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
  search = [GIN_DIR] if os.path.isdir(GIN_DIR) else []
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


def model_reference():
  """The gin reference bound to `terraformer.train.model` (@Terraformer...)."""
  try:
    return gin.query_parameter('terraformer.train.model')
  except ValueError:
    raise errors.TerraformerError(
        'no model configured: bind terraformer.train.model') from None


def model_from_config():
  """The model function bound to `terraformer.train.model`."""
  ref = model_reference()
  return getattr(ref, 'scoped_configurable_fn', ref)
