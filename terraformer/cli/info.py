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
each device holds (arguments, outputs, temporaries, peak). Each of these is
also a one-row table (the config, its count, its plan, its compiled step),
printed, and held under "tables" by --json (parameters, plan, compiled:
{"columns", "rows"}).
"""
import json
import sys

from absl import flags

from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-info'
GIB = 2.0 ** 30


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


def parameters(total):
  """775.4M, 16.88B, 52,224: a parameter count as the docs write it."""
  if total >= 1e9:
    return f'{total / 1e9:.2f}B'
  if total >= 1e6:
    return f'{total / 1e6:.1f}M'
  return f'{total:,}'


def parameters_table(config_name, count):
  """The config and its parameter count, one row."""
  return common.table(['config', 'parameters'],
                      [[config_name, parameters(count.total)]])


def plan_table(config_name, plan):
  """The planned GiB per device of FSDP training (`memory_plan`), one row:
  weights, Adam's slots, activations (the residual stream's estimate)."""
  return common.table(
      ['config', 'devices', 'weights', 'Adam slots', 'activations (est.)',
       'total'],
      [[config_name, str(plan['devices'])] + [
          f'{plan[k] / GIB:.3f}' for k in (
              'weights_bytes_per_device', 'slots_bytes_per_device',
              'activation_bytes_per_device', 'total_bytes_per_device')]])


def format_plan(config_name, plan, device_memory_gb=0.0):
  """Human-readable per-device memory of a `memory_plan.memory_plan`."""
  rows = [f'FSDP over {plan["devices"]} devices, per device (GiB):',
          common.format_aligned(plan_table(config_name, plan)),
          f'(of the weights, replicated small arrays: '
          f'{plan["replicated_bytes_per_device"] / 2**20:.2f} MiB)']
  if device_memory_gb:
    fits = plan['total_bytes_per_device'] <= device_memory_gb * GIB
    rows.append(f'{"fits" if fits else "does NOT fit"} in '
                f'{device_memory_gb:g} GiB per device')
  return '\n'.join(rows)


def compiled_table(config_name, memory, n_devices):
  """`ShardedTrainer.compiled_step_memory` per device, one row: what the
  arguments (weights, slots, batch) and temporaries take, the peak; then
  the outputs and how much of them is written over donated arguments."""
  return common.table(
      ['config', 'devices', 'arguments (weights + slots + batch)',
       'temporaries', 'peak', 'outputs', 'outputs over donated arguments'],
      [[config_name, str(n_devices)] + [
          f'{memory[k] / GIB:.3f} GiB' for k in (
              'arguments', 'temporaries', 'peak', 'outputs', 'aliased')]])


def format_compiled(config_name, memory, n_devices):
  """Human-readable `ShardedTrainer.compiled_step_memory`."""
  return '\n'.join([
      f'Compiled FSDP training step over {n_devices} devices (XLA memory '
      'analysis), per device:',
      common.format_aligned(compiled_table(config_name, memory, n_devices))])


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
  name = '+'.join(flag_values.config_file or []) or common.MISSING
  tables = {'parameters': parameters_table(name, count)}
  if plan:
    tables['plan'] = plan_table(name, plan)
  if compiled:
    tables['compiled'] = compiled_table(name, compiled, flag_values.devices)
  if flag_values.json:
    report = {'by_layer': count.by_layer, 'total': count.total}
    if plan:
      report['per_device'] = plan
    if compiled:
      report['compiled_per_device'] = compiled
    print(json.dumps(common.with_tables(report, tables), indent=2))
  else:
    print(format_table(count))
    print(common.format_aligned(tables['parameters']))
    if plan:
      print(format_plan(name, plan, flag_values.device_memory_gb))
    if compiled:
      print(format_compiled(name, compiled, flag_values.devices))
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _info, precheck=_precheck)


if __name__ == '__main__':
  sys.exit(main())
