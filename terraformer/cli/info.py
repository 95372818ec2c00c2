"""terraformer-info: parameter count of a gin-configured model, by layer kind.

  terraformer-info --config_file=F [--config='BINDING'] [--json]
      [--devices=N [--batch_size=B] [--length=L] [--device_memory_gb=G]
       [--compiled]]

Counts the model bound to `terraformer.train.model` (or
`count_parameters.model`) from weight shapes only, without allocating them.
With `--devices=N`, also prints the bytes per device of FSDP training over N
devices (`terraformer.distributed`: weights and Adam's two slots split over
the devices, a global batch of B sequences of L tokens split over them).
With `--compiled`, also XLA's memory analysis of the real FSDP training step
(`ShardedTrainer`, Adam) compiled for N CPU devices from shapes only: what
each device holds (arguments, outputs, temporaries, peak).
"""
import json
import sys

from absl import flags

from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-info'


def _define_flags(flag_values):
  flags.DEFINE_bool('json', False, 'Print JSON instead of a table.',
                    flag_values=flag_values)
  flags.DEFINE_integer('devices', 0, 'Print per-device memory of FSDP '
                       'training over this many devices (0: no).',
                       lower_bound=0, flag_values=flag_values)
  flags.DEFINE_integer('batch_size', 8, 'Global batch (sequences) for the '
                       'activation estimate.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('length', 512, 'Tokens per sequence for the '
                       'activation estimate.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_bool('compiled', False, 'With --devices=N: also compile the '
                    'FSDP training step for N (forced CPU) devices and print '
                    "XLA's per-device memory analysis.",
                    flag_values=flag_values)
  flags.DEFINE_float('device_memory_gb', 0.0, 'Device memory (GiB): say '
                     'whether the per-device total fits.', lower_bound=0.0,
                     flag_values=flag_values)


def format_table(count):
  """Human-readable table of a ParamCount."""
  width = max([len('layer kind'), len('total')] + [len(k) for k in
                                                   count.by_layer])
  rows = [f'{"layer kind":<{width}}  {"parameters":>15}  {"share":>6}']
  for kind, n in list(count.by_layer.items()) + [('total', count.total)]:
    share = 100.0 * n / count.total if count.total else 0.0
    rows.append(f'{kind:<{width}}  {n:>15,}  {share:>5.1f}%')
  return '\n'.join(rows)


def format_plan(plan, device_memory_gb=0.0):
  """Human-readable per-device memory of a `memory_plan.memory_plan`."""
  gib = 2.0 ** 30
  rows = [f'FSDP over {plan["devices"]} devices, per device:']
  for label, key in (('weights', 'weights_bytes_per_device'),
                     ('optimizer slots (Adam)', 'slots_bytes_per_device'),
                     ('activations (residual stream estimate)',
                      'activation_bytes_per_device'),
                     ('total', 'total_bytes_per_device')):
    rows.append(f'  {label:<40} {plan[key] / gib:>10.3f} GiB')
  rows.append(f'  (of the weights, replicated small arrays: '
              f'{plan["replicated_bytes_per_device"] / 2**20:.2f} MiB)')
  if device_memory_gb:
    fits = plan['total_bytes_per_device'] <= device_memory_gb * gib
    rows.append(f'  {"fits" if fits else "does NOT fit"} in '
                f'{device_memory_gb:g} GiB per device')
  return '\n'.join(rows)


def format_compiled(memory, n_devices):
  """Human-readable `ShardedTrainer.compiled_step_memory`."""
  gib = 2.0 ** 30
  rows = [f'Compiled FSDP training step over {n_devices} devices (XLA memory '
          'analysis), per device:']
  for label, key in (('arguments (weights, slots, batch)', 'arguments'),
                     ('outputs', 'outputs'),
                     ('of them written over donated arguments', 'aliased'),
                     ('temporaries (activations, scratch)', 'temporaries'),
                     ('peak', 'peak')):
    rows.append(f'  {label:<40} {memory[key] / gib:>10.3f} GiB')
  return '\n'.join(rows)


def _precheck(flag_values):
  """--compiled: N forced CPU devices, set before JAX starts its backend."""
  if flag_values.compiled:
    if not flag_values.devices:
      raise errors.TerraformerError('--compiled needs --devices=N')
    import os  # pylint: disable=g-import-not-at-top
    from terraformer import distributed  # pylint: disable=g-import-not-at-top
    os.environ['XLA_FLAGS'] = distributed.force_host_devices(
        flag_values.devices)
    os.environ['JAX_PLATFORMS'] = 'cpu'


def _info(flag_values):
  from terraformer.benchmarks import param_count  # pylint: disable=g-import-not-at-top
  plan = compiled = None
  if flag_values.devices:
    count, plan = param_count.device_memory(
        flag_values.devices, flag_values.batch_size, flag_values.length)
  else:
    count = param_count.count_parameters()
  if flag_values.compiled:
    compiled = param_count.compiled_step_memory(flag_values.batch_size,
                                                flag_values.length)
  if flag_values.json:
    report = {'by_layer': count.by_layer, 'total': count.total}
    if plan:
      report['per_device'] = plan
    if compiled:
      report['compiled_per_device'] = compiled
    print(json.dumps(report, indent=2))
  else:
    print(format_table(count))
    if plan:
      print(format_plan(plan, flag_values.device_memory_gb))
    if compiled:
      print(format_compiled(compiled, flag_values.devices))
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _info, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
