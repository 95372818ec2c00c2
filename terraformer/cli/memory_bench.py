"""terraformer-memory-bench: training-step memory vs depth or input length.

  terraformer-memory-bench --config_file=F [--config='BINDING']
      [--layers=1,2,4,8] [--batch_size=N] [--input_len=N] [--target_len=N]
      [--json]
  terraformer-memory-bench --input_lens=1024,2048,... --config_file=A
      [--config_file=B ...] [--config='BINDING'] [--batch_size=N]
      [--target_len=N] [--repeats=R] [--time_budget_gb=G] [--plot=PNG]
      [--json]

Depth (without --input_lens):

For each number of layers n (encoder and decoder each), the model bound to
`terraformer.train.model` (a `Terraformer`) is built with n + n layers, once
reversible and once not (`reversible=False`: the same function, plain
backpropagation), and the gradient step, value_and_grad of the
cross-entropy loss with respect to all weights, is compiled with XLA on
abstract inputs (nothing is allocated or run). XLA's buffer assignment gives
its memory: arguments (weights, state, batch) + outputs (gradients) +
temporaries (activations kept for the backward pass, workspace). The figures
are exact for the compiled program and deterministic.

Input length (--input_lens, Pyramidion Fig. 4, CST Fig. 2): as in
terraformer-bench, EACH --config_file is one model ('a.gin+b.gin' composes
two files), all measured in one run; --config bindings apply to every model.
For each input length the model's gradient step is compiled the same way
(memory), and where it needs at most --time_budget_gb it also runs on random
tokens: the median ms of --repeats calls after a warm-up
(`terraformer.benchmarks.long_input` measures; the table and --plot are
made here). --json prints the report instead, with the table under
"tables" (depth or lengths: {"columns", "rows"}).
"""
import json
import sys

from absl import flags

from terraformer import config
from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-memory-bench'
MIB = 2.0 ** 20


def _define_flags(flag_values):
  flags.DEFINE_list('layers', ['1', '2', '4', '8'],
                    'Comma-separated layer counts (encoder = decoder).',
                    flag_values=flag_values)
  flags.DEFINE_integer('batch_size', 1, 'Batch size.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('input_len', 2048, 'Input (encoder) length.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('target_len', 256, 'Target (decoder) length.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_list('input_lens', None,
                    'Sweep these input lengths; each --config_file is a '
                    'model.', flag_values=flag_values)
  flags.DEFINE_integer('repeats', 3, 'Timed steps per length (--input_lens).',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_float('time_budget_gb', 4.0,
                     'Time only steps whose compiled memory fits (GiB).',
                     lower_bound=0.0, flag_values=flag_values)
  flags.DEFINE_string('plot', None, 'PNG of the --input_lens sweep.',
                      flag_values=flag_values)
  flags.DEFINE_bool('json', False, 'Print JSON instead of a table.',
                    flag_values=flag_values)


def step_memory(model_fn, n_layers, reversible, batch_size, input_len,
                target_len):
  """Bytes of the compiled gradient step: dict(argument, output, temp, total).

  Weights, state and batch are abstract (`jax.ShapeDtypeStruct`): the step
  is lowered and compiled, never run.
  """
  from terraformer.benchmarks import long_input as lib  # pylint: disable=g-import-not-at-top
  try:
    model = model_fn(mode='train', n_encoder_layers=n_layers,
                     n_decoder_layers=n_layers, reversible=reversible)
  except TypeError as e:
    raise errors.TerraformerError(
        f'the configured model does not take n_encoder_layers, '
        f'n_decoder_layers and reversible (a Terraformer does): {e}') from None
  compiled, _ = lib.compile_grad_step(model, batch_size, input_len,
                                      target_len)
  return lib.memory_of(compiled)


def depth_table(rows):
  """Total and temporary MiB per layer count, reversible and not, and the
  ratio of the totals."""
  table = []
  for row in rows:
    rev, plain = row['reversible'], row['non_reversible']
    table.append([str(row['layers']),
                  f'{rev["total"] / MIB:.1f}', f'{rev["temp"] / MIB:.1f}',
                  f'{plain["total"] / MIB:.1f}', f'{plain["temp"] / MIB:.1f}',
                  f'{plain["total"] / rev["total"]:.2f}'])
  return common.table(['layers', 'reversible', '(temporaries)',
                       'not reversible', '(temporaries)', 'ratio'], table)


def lengths_table(report):
  """`long_input.length_sweep`'s rows of each model: a row per input
  length, the MiB of each model, then the step ms of each model timed at
  some length (MISSING where a model was not measured or not run)."""
  models = {name: {row['input_len']: row for row in rows}
            for name, rows in report['models'].items()}
  lens = sorted({n for rows in models.values() for n in rows})
  timed = [m for m, rows in models.items()
           if any(r.get('step_ms') is not None for r in rows.values())]
  table = []
  for n in lens:
    row = [str(n)]
    for m in models:
      r = models[m].get(n)
      row.append(common.MISSING if r is None else
                 f'{r["memory"]["total"] / MIB:.1f}')
    for m in timed:
      ms = (models[m].get(n) or {}).get('step_ms')
      row.append(common.MISSING if ms is None else f'{ms:.0f}')
    table.append(row)
  return common.table(['input tokens'] + list(models) +
                      [f'{m} ms' for m in timed], table)


def plot_lengths(report, path):
  """Memory and step time vs input length, one line per model (log-log)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
  for name, rows in report['models'].items():
    ax_mem.plot([r['input_len'] for r in rows],
                [r['memory']['total'] / MIB for r in rows], marker='o',
                label=name)
    timed = [r for r in rows if r['step_ms'] is not None]
    ax_time.plot([r['input_len'] for r in timed],
                 [r['step_ms'] for r in timed], marker='o', label=name)
  for ax in (ax_mem, ax_time):
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel('input tokens')
    ax.legend(fontsize=8)
  ax_mem.set_ylabel('compiled gradient step, MiB')
  ax_time.set_ylabel('gradient step, ms (median)')
  ax_mem.set_title('memory (cf. Pyramidion Fig. 4, CST Fig. 2)')
  ax_time.set_title(f'time, batch {report["batch_size"]}, '
                    f'target {report["target_len"]}')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _bench(flag_values):
  counts = common.positive_ints(flag_values.layers, 'layers')
  config.require_bindings('terraformer.train', ['model'])
  model_fn = config.model_from_config()
  sizes = dict(batch_size=flag_values.batch_size,
               input_len=flag_values.input_len,
               target_len=flag_values.target_len)
  rows = []
  for n in counts:
    row = {'layers': n}
    for name, reversible in (('reversible', True), ('non_reversible', False)):
      row[name] = step_memory(model_fn, n, reversible, **sizes)
    rows.append(row)
    if not flag_values.json:
      print(f'compiled {n} + {n} layers', file=sys.stderr, flush=True)
  tables = {'depth': depth_table(rows)}
  if flag_values.json:
    print(json.dumps(common.with_tables({**sizes, 'rows': rows}, tables),
                     indent=2))
  else:
    print(f'gradient step, batch {sizes["batch_size"]}, input '
          f'{sizes["input_len"]}, target {sizes["target_len"]} tokens; MiB '
          '= arguments + outputs (gradients) + temporaries; ratio = not '
          'reversible / reversible')
    print(common.format_aligned(tables['depth']))
  return 0


def _length_bench(flag_values, model_files):
  from terraformer.benchmarks import long_input as lib  # pylint: disable=g-import-not-at-top
  from terraformer.cli import bench  # pylint: disable=g-import-not-at-top
  lens = common.positive_ints(flag_values.input_lens, 'input_lens')
  if not model_files:
    raise errors.TerraformerError('at least one --config_file is required')
  report = dict(batch_size=flag_values.batch_size,
                target_len=flag_values.target_len, models={})
  taken = set()
  for files in model_files:
    name = bench.model_name(files, taken)
    config.parse_gin(files, flag_values.config)
    config.require_bindings('terraformer.train', ['model'])
    print(f'{name}:', file=sys.stderr, flush=True)
    report['models'][name] = lib.length_sweep(
        config.model_from_config(), lens, flag_values.target_len,
        flag_values.batch_size, flag_values.time_budget_gb * 2 ** 30,
        flag_values.repeats,
        log=lambda m: print(f'  {m}', file=sys.stderr, flush=True))
  if flag_values.plot:
    plot_lengths(report, flag_values.plot)
  tables = {'lengths': lengths_table(report)}
  if flag_values.json:
    print(json.dumps(common.with_tables(report, tables), indent=2))
  else:
    print(f'gradient step, batch {report["batch_size"]}, target '
          f'{report["target_len"]} tokens; MiB = compiled arguments + outputs '
          f'+ temporaries; ms = median of {flag_values.repeats} steps, for '
          f'the models timed ({common.MISSING} : over '
          f'{flag_values.time_budget_gb:g} GiB, not run)')
    print(common.format_aligned(tables['lengths']))
    if flag_values.plot:
      print(f'plot: {flag_values.plot}')
  return 0


def main(argv=None):
  argv = list(sys.argv if argv is None else argv)
  if not any(a.startswith('--input_lens') for a in argv[1:]):
    return common.run(PROG, argv, _define_flags, _bench)
  from terraformer.cli import bench  # pylint: disable=g-import-not-at-top
  try:
    argv, model_files = bench.split_config_files(argv)
  except errors.TerraformerError as e:
    print(f'{PROG}: error: {e}', file=sys.stderr)
    return common.EXIT_USAGE

  def precheck(flag_values):
    config.check_config_files([f for files in model_files for f in files])
    if flag_values.plot:
      common.check_writable_file(flag_values.plot, 'plot')

  return common.run(PROG, argv, _define_flags,
                    lambda fv: _length_bench(fv, model_files),
                    precheck=precheck)


if __name__ == '__main__':
  sys.exit(main())
