"""terraformer-topk-bench: soft top-k operators, time and nCCS vs n and k.

  python -m terraformer.cli.topk_bench [--ns=64,...,16384] [--ks=8,32,...]
      [--methods=sh,sh_unsorted,sh_plain,goyal,hard] [--batch=16] [--d=64]
      [--repeats=5] [--goyal_max=1048576] [--plot=docs/topk_operator.png]
      [--json=PATH]

Pietruszka et al. App. B.5 (Figs. 5, 6): prints a markdown table of the
median jitted time (ms per batch) and the nCCS to the exact top-k of each
method for every k < n; see `terraformer.benchmarks.topk`.
"""
import json
import sys

from absl import flags

from terraformer import errors
from terraformer.cli import bench
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


def _ints(values, flag):
  try:
    ints = [int(v) for v in values]
  except ValueError:
    raise errors.TerraformerError(
        f'--{flag} must be integers, got {",".join(values)!r}') from None
  if not ints or min(ints) < 1:
    raise errors.TerraformerError(f'--{flag} must be positive integers')
  return ints


def _check(flag_values):
  from terraformer.benchmarks import topk as topk_benchmark  # pylint: disable=g-import-not-at-top
  ns, ks = _ints(flag_values.ns, 'ns'), _ints(flag_values.ks, 'ks')
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
  bench._check_writable_file(flag_values.plot, 'plot')  # pylint: disable=protected-access
  bench._check_writable_file(flag_values.json, 'json')  # pylint: disable=protected-access
  return ns, ks


def _bench(flag_values):
  from terraformer.benchmarks import topk as topk_benchmark  # pylint: disable=g-import-not-at-top
  ns, ks = _check(flag_values)
  report = topk_benchmark.run(
      ns, ks, flag_values.methods, flag_values.batch, flag_values.d,
      flag_values.repeats, flag_values.goyal_max,
      log=lambda m: print(m, file=sys.stderr, flush=True))
  print(topk_benchmark.format_table(report))
  if flag_values.plot:
    topk_benchmark.plot(report, flag_values.plot)
    print(f'plot: {flag_values.plot}')
  if flag_values.json:
    with open(flag_values.json, 'w') as f:
      json.dump(report, f, indent=2)
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _bench, precheck=_check)


if __name__ == '__main__':
  sys.exit(main())
