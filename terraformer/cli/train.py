"""terraformer-train: trains a gin-configured model with Trax's Loop.

  terraformer-train --config_file=F [--config_file=G] [--config='BINDING']
      --output_dir=DIR [--steps=N]
      [--coordinator_address=HOST:PORT --num_processes=N --process_id=I |
       --distributed]

Rerunning with the same --output_dir resumes from its checkpoint; --steps is
the total number of steps (it overrides `terraformer.train.steps`). One
trainer at a time: while a run holds --output_dir, another one started on it
stops at once with one line naming the holder (host, pid) and exit status 2,
writing nothing; the lock of a run that died is taken over with one line
(terraformer/training/run_lock.py).

Many processes (hosts) join one job through JAX's distributed runtime: give
each the same command with the three process flags, or `--distributed` to
take them from the environment JAX detects (Slurm, Open MPI, TPU pods,
Kubernetes). The batch size is the global one; `--output_dir` is read and
written by process 0 only.
"""
import sys

from absl import flags

from terraformer import config
from terraformer import errors
from terraformer import supervisor
from terraformer.cli import common

PROG = 'terraformer-train'
REQUIRED = ('model', 'train_stream', 'eval_stream')


def _define_flags(flag_values):
  flags.DEFINE_string('output_dir', None,
                      'Directory for checkpoints and TensorBoard events.',
                      flag_values=flag_values)
  flags.DEFINE_integer('steps', None, 'Total number of training steps.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_string('coordinator_address', None,
                      'HOST:PORT of process 0 of a multi-process job.',
                      flag_values=flag_values)
  flags.DEFINE_integer('num_processes', None, 'Processes in the job.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('process_id', None, 'This process, 0..N-1.',
                       lower_bound=0, flag_values=flag_values)
  flags.DEFINE_boolean('distributed', False, 'Join the multi-process job '
                       'that JAX detects from the environment (Slurm, Open '
                       'MPI, TPU pod, Kubernetes).', flag_values=flag_values)
  flags.DEFINE_integer('join_timeout_s', 300, 'Seconds to wait for all '
                       'processes to join.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('heartbeat_timeout_s', 60, 'Seconds without a sign '
                       'of life after which a process counts as dead and '
                       'the others stop (exit 2).', lower_bound=1,
                       flag_values=flag_values)


def _precheck(flag_values):
  """Checks --output_dir, then joins the job (before JAX starts)."""
  common.check_output_dir(flag_values.output_dir)
  explicit = (flag_values.coordinator_address, flag_values.num_processes,
              flag_values.process_id)
  if any(v is not None for v in explicit) or flag_values.distributed:
    from terraformer import distributed  # pylint: disable=g-import-not-at-top
    if (flag_values.process_id is not None and flag_values.num_processes
        and flag_values.process_id >= flag_values.num_processes):
      raise errors.TerraformerError(
          f'--process_id={flag_values.process_id} is not below '
          f'--num_processes={flag_values.num_processes}')
    distributed.initialize(
        *explicit, timeout_s=flag_values.join_timeout_s,
        heartbeat_timeout_s=flag_values.heartbeat_timeout_s,
        detect=flag_values.distributed)


def _train(flag_values):
  from terraformer import distributed  # pylint: disable=g-import-not-at-top
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  output_dir = common.check_output_dir(flag_values.output_dir)
  config.require_bindings('terraformer.train', REQUIRED)
  kwargs = {} if flag_values.steps is None else {'steps': flag_values.steps}
  try:
    loop = training.train(output_dir, **kwargs)
  except distributed.ProcessGroupError as e:
    # Not a normal exit: JAX's shutdown would wait for the dead process.
    print(f'{PROG}: error: {errors.first_line(e)}', file=sys.stderr)
    distributed.exit_now(common.EXIT_USAGE)
  distributed.say(f'Done: step {loop.step}, checkpoint in {output_dir}')
  return 0


# Flags of a multi-process job: it runs under `supervisor.supervise` (a
# peer's death is then one line, not JAX's fatal log).
_PROCESS_FLAGS = ('--coordinator_address', '--num_processes', '--process_id',
                  '--distributed')


def main(argv=None):
  argv = sys.argv if argv is None else argv
  if any(a.split('=')[0] in _PROCESS_FLAGS for a in argv[1:]):
    code = supervisor.supervise(PROG, 'terraformer.cli.train', argv)
    if code is not None:  # The parent: the child has ended.
      return code
  return common.run(PROG, argv, _define_flags, _train, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
