"""terraformer-import-trax: a Trax 1.4.1 checkpoint -> a checkpoint of ours.

  terraformer-import-trax --trax_checkpoint=PATH --config_file=OUR.gin
      [--config=BINDING ...] --output_dir=DIR

PATH is a Trax `training.Loop` checkpoint (`model.pkl.gz`, with
`model.weights.npy.gz` beside it, or their directory) of Trax's
`ConfigurableTransformerLM` / `ConfigurableTransformer` /
`ConfigurableTerraformer`; OUR.gin configures the matching model of ours
(`terraformer.train.model = @ScalingTransformerLM`, `@ScalingTransformer` or
`@Terraformer`, same hyperparameters; see the model modules' docstrings for
the options that map). Every
weight is mapped by name and shape (`terraformer.trax_bridge.checkpoint_import`); the first one
that does not fit is one error line, and nothing is written. DIR then holds
`model.pkl.gz` + `model.weights.npy.gz`, which terraformer-decode,
terraformer-eval (`--output_dir=DIR`) and `terraformer.train.init_checkpoint`
read. An existing checkpoint in DIR is not overwritten.
"""
import os
import sys

from absl import flags

from terraformer import config
from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-import-trax'


def _define_flags(flag_values):
  flags.DEFINE_string('trax_checkpoint', None,
                      'Trax model.pkl.gz (or its directory).',
                      flag_values=flag_values)
  flags.DEFINE_string('output_dir', None,
                      'Directory for the imported checkpoint.',
                      flag_values=flag_values)


def trax_checkpoint_file(path):
  """The `model.pkl.gz` of `path` (file or directory); checks its files."""
  if not path:
    raise errors.TerraformerError('--trax_checkpoint is required')
  from terraformer.checkpoint import format as checkpoint_format  # pylint: disable=g-import-not-at-top
  return checkpoint_format.checkpoint_file(path, what='Trax checkpoint')


def _precheck(flag_values):
  trax_checkpoint_file(flag_values.trax_checkpoint)
  if not flag_values.config_file:
    raise errors.TerraformerError('--config_file is required')
  out = common.check_output_dir(flag_values.output_dir)
  if os.path.exists(os.path.join(out, 'model.pkl.gz')):
    raise errors.TerraformerError(
        f'{out} already holds a checkpoint (model.pkl.gz); choose another '
        '--output_dir')


def _import(flag_values):
  from terraformer.trax_bridge import checkpoint_import as trax_import  # pylint: disable=g-import-not-at-top
  path = trax_checkpoint_file(flag_values.trax_checkpoint)
  model_fn = config.model_from_config()
  name = getattr(model_fn, '__name__', str(model_fn))
  counterpart = trax_import.TRAX_COUNTERPARTS.get(name)
  if counterpart is None:
    raise errors.TerraformerError(
        f'terraformer.train.model = @{name} has no Trax counterpart; one of '
        f'{", ".join("@" + n for n in trax_import.TRAX_COUNTERPARTS)}')
  weights, step = trax_import.load_trax_into(model_fn(mode='eval'), path)
  out = common.check_output_dir(flag_values.output_dir)
  written = trax_import.write_checkpoint(weights, out, step=step or 0,
                                         source=os.path.abspath(path))
  n_arrays = len(trax_import.flat_arrays(weights))
  print(f'Imported {n_arrays} weight arrays of Trax {counterpart} (step '
        f'{step}) into {name}: {written}')
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _import, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
