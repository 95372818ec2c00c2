"""terraformer-topk-bench: soft top-k operators, time and nCCS vs n and k.

  python -m terraformer.cli.topk_bench [--ns=64,...,16384] [--ks=8,32,...]
      [--methods=sh,sh_unsorted,sh_plain,goyal,hard] [--batch=16] [--d=64]
      [--repeats=5] [--goyal_max=1048576] [--plot=docs/topk_operator.png]
      [--json=PATH]

Pietruszka et al. App. B.5 (Figs. 5, 6): prints a markdown table of the
median jitted time (ms per batch) and the nCCS to the exact top-k of each
method for every k < n; `terraformer.benchmarks.topk` measures, the table
and --plot are made here. --json writes the report with that table under
"tables" (topk: {"columns", "rows"}).
"""
import json
import sys

from absl import flags
import numpy as np

from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-topk-bench'


def _define_flags(flag_values):
  flags.DEFINE_list('ns', [str(2 ** i) for i in range(6, 15)],
                    'Input lengths n.', flag_values=flag_values)
  flags.DEFINE_list('ks', ['8', '32', '128', '512', '2048'],
                    'Output lengths k (only k < n are run).',
                    flag_values=flag_values)
  flags.DEFINE_list('methods', ['sh', 'sh_unsorted', 'sh_plain', 'goyal',
                                'hard'], 'Operators.', flag_values=flag_values)
  flags.DEFINE_integer('batch', 16, 'Batch size.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('d', 64, 'Vector width.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('repeats', 5, 'Timed repeats.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('goyal_max', 2 ** 20,
                       'Run the O(nk) iterative baseline only where n*k is '
                       'at most this.', lower_bound=0, flag_values=flag_values)
  flags.DEFINE_string('plot', None, 'Also write a PNG plot here.',
                      flag_values=flag_values)
  flags.DEFINE_string('json', None, 'Also write the results as JSON here.',
                      flag_values=flag_values)


def _check(flag_values):
  from terraformer.benchmarks import topk as topk_benchmark  # pylint: disable=g-import-not-at-top
  ns = common.positive_ints(flag_values.ns, 'ns')
  ks = common.positive_ints(flag_values.ks, 'ks')
  for n in ns:
    for k in ks:
      if k < n and (n % k or (n // k) & (n // k - 1)):
        raise errors.TerraformerError(
            f'n={n}, k={k}: the ratio n/k must be a power of 2')
  if not any(k < n for n in ns for k in ks):
    raise errors.TerraformerError('no k < n among --ns and --ks')
  unknown = [m for m in flag_values.methods
             if m not in topk_benchmark.METHODS]
  if unknown or not flag_values.methods:
    raise errors.TerraformerError(
        f'--methods: unknown {",".join(unknown)!r}; choose from '
        f'{",".join(topk_benchmark.METHODS)}')
  common.check_writable_file(flag_values.plot, 'plot')
  common.check_writable_file(flag_values.json, 'json')
  return ns, ks


# The methods as the tables name them.
LABELS = {'sh': 'SH', 'sh_unsorted': 'unsorted', 'sh_plain': 'plain',
          'goyal': 'Goyal', 'hard': 'hard top-k'}


def _ms(value):
  return f'{value:.2f}' if value < 10 else f'{value:.1f}'


def topk_table(report):
  """Per (k, n): the median ms of each method, then the nCCS of each but
  the exact one (1 by definition); MISSING where a method did not run."""
  methods = report['methods']
  similar = [m for m in methods if m != 'hard']
  name = lambda m: LABELS.get(m, m)
  rows = []
  for row in report['rows']:
    cells = [str(row['k']), str(row['n'])]
    cells += [common.MISSING if row.get(m) is None else _ms(row[m]['ms'])
              for m in methods]
    cells += [common.MISSING if row.get(m) is None
              else f"{row[m]['nccs']:.3f}" for m in similar]
    rows.append(cells)
  return common.table(['k', 'n'] + [f'{name(m)} ms' for m in methods] +
                      [f'{name(m)} nCCS' for m in similar], rows)


def format_table(report):
  """Markdown table: per (k, n), ms and nCCS of each method."""
  table = topk_table(report)
  lines = [f"top-k operators, batch {report['batch']}, d {report['d']}, "
           f"median of {report['repeats']} (jitted)",
           '| ' + ' | '.join(table['columns']) + ' |',
           '|' + '---|' * len(table['columns'])]
  lines += ['| ' + ' | '.join(row) + ' |' for row in table['rows']]
  return '\n'.join(lines)


def plot(report, path):
  """Figs. 5/6 analogue: time and nCCS vs n, one line per (method, k)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (ax_time, ax_sim) = plt.subplots(1, 2, figsize=(12, 4.5))
  styles = {'sh': '-', 'sh_unsorted': '--', 'sh_plain': '-.', 'goyal': ':',
            'hard': (0, (1, 3))}
  ks = sorted({row['k'] for row in report['rows']})
  colors = dict(zip(ks, plt.cm.viridis(np.linspace(0, 0.9, len(ks)))))
  for method in report['methods']:
    for k in ks:
      rows = [r for r in report['rows'] if r['k'] == k and r[method]]
      if not rows:
        continue
      ns = [r['n'] for r in rows]
      label = f'{method} k={k}'
      ax_time.plot(ns, [r[method]['ms'] for r in rows], linestyle=styles.get(
          method, '-'), color=colors[k], label=label)
      if method != 'hard':
        ax_sim.plot(ns, [r[method]['nccs'] for r in rows],
                    linestyle=styles.get(method, '-'), color=colors[k],
                    label=label)
  for ax in (ax_time, ax_sim):
    ax.set_xscale('log', base=2)
    ax.set_xlabel('n')
  ax_time.set_yscale('log')
  ax_time.set_ylabel('ms per batch (median)')
  ax_sim.set_ylabel('nCCS to exact top-k')
  ax_time.set_title('time (cf. Pietruszka et al. Fig. 5)')
  ax_sim.set_title('similarity (cf. Fig. 6)')
  ax_sim.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _bench(flag_values):
  from terraformer.benchmarks import topk as topk_benchmark  # pylint: disable=g-import-not-at-top
  ns, ks = _check(flag_values)
  report = topk_benchmark.run(
      ns, ks, flag_values.methods, flag_values.batch, flag_values.d,
      flag_values.repeats, flag_values.goyal_max,
      log=lambda m: print(m, file=sys.stderr, flush=True))
  print(format_table(report))
  if flag_values.plot:
    plot(report, flag_values.plot)
    print(f'plot: {flag_values.plot}')
  if flag_values.json:
    with open(flag_values.json, 'w') as f:
      json.dump(common.with_tables(report, {'topk': topk_table(report)}), f,
                indent=2)
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _bench, precheck=_check)


if __name__ == '__main__':
  sys.exit(main())
