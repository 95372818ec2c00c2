"""terraformer-train: trains a gin-configured model with Trax's Loop.

  terraformer-train --config_file=F [--config_file=G] [--config='BINDING']
      --output_dir=DIR [--steps=N]

Rerunning with the same --output_dir resumes from its checkpoint; --steps is
the total number of steps (it overrides `terraformer.train.steps`).
"""
import sys

from absl import flags

from terraformer.cli import common

PROG = 'terraformer-train'
REQUIRED = ('model', 'train_stream', 'eval_stream')


def _define_flags(flag_values):
  flags.DEFINE_string('output_dir', None,
                      'Directory for checkpoints and TensorBoard events.',
                      flag_values=flag_values)
  flags.DEFINE_integer('steps', None, 'Total number of training steps.',
                       lower_bound=1, flag_values=flag_values)


def _check_output_dir(flag_values):
  common.check_output_dir(flag_values.output_dir)


def _train(flag_values):
  from terraformer import training  # pylint: disable=g-import-not-at-top
  output_dir = common.check_output_dir(flag_values.output_dir)
  common.require_bindings('terraformer.train', REQUIRED)
  kwargs = {} if flag_values.steps is None else {'steps': flag_values.steps}
  loop = training.train(output_dir, **kwargs)
  print(f'Done: step {loop.step}, checkpoint in {output_dir}')
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _train,
                    precheck=_check_output_dir)


if __name__ == '__main__':
  sys.exit(main())
