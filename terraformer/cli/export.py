"""terraformer-export: TensorBoard scalars of runs -> CSV, JSON and PNG plots.

  terraformer-export --logdir=DIR [--logdir=DIR2 ...] [--label=NAME ...]
      [--from_export=EARLIER_OUT ...] --out=tensorboard_exports/NAME
      [--metrics=REGEX]
      [--table=METRIC (--table_steps=S1,S2,... | --table_minutes=M1,...)]

Each --logdir is a run (e.g. a `terraformer-train --output_dir`); --label
names it in the outputs (one per --logdir; default: the folder names). Writes
`scalars.csv`, `scalars.json` and one PNG per metric (all runs on one axis);
with --table, also `table.md`: that metric at --table_steps (or at
--table_minutes of wall-clock since each run's first point: equal training
time) as a Markdown table, one row per run, which it prints too.
--from_export reads the runs of an earlier export (its scalars.json) back,
so a committed export can be extended with new runs after the old run
folders are gone; a --logdir whose label is an earlier run's replaces it.
It needs no gin config (and does not import Trax).
"""
import sys

from absl import flags

from terraformer import errors
from terraformer import runtime
from terraformer.cli import common

PROG = 'terraformer-export'


def _define_flags(flag_values):
  flags.DEFINE_multi_string('logdir', None, 'Run directory; repeat for '
                            'several runs.', flag_values=flag_values)
  flags.DEFINE_multi_string('label', None, 'Label of each run, in --logdir '
                            'order.', flag_values=flag_values)
  flags.DEFINE_multi_string('from_export', None, 'Folder of an earlier '
                            'export: its runs (scalars.json) come first; '
                            'repeatable.', flag_values=flag_values)
  flags.DEFINE_string('out', None, 'Output directory.',
                      flag_values=flag_values)
  flags.DEFINE_string('metrics', None, 'Regular expression: export only the '
                      "matching metrics, e.g. '^eval/'.",
                      flag_values=flag_values)
  flags.DEFINE_string('table', None, 'Metric to print as a Markdown table '
                      '(one row per run), e.g. eval/metrics/log_perplexity.',
                      flag_values=flag_values)
  flags.DEFINE_list('table_steps', None, 'Steps (columns) of --table.',
                    flag_values=flag_values)
  flags.DEFINE_list('table_minutes', None, 'Or: minutes of wall-clock since '
                    "each run's first point (columns) of --table.",
                    flag_values=flag_values)


def _table(flag_values):
  """(metric, steps, minutes) from --table and its columns, or None."""
  columns = [c for c in ('table_steps', 'table_minutes')
             if flag_values[c].value]
  if bool(flag_values.table) != (len(columns) == 1):
    raise errors.TerraformerError(
        '--table goes with one of --table_steps, --table_minutes')
  if not flag_values.table:
    return None
  name, = columns
  try:
    values = [(int if name == 'table_steps' else float)(v)
              for v in flag_values[name].value]
  except ValueError:
    raise errors.TerraformerError(
        f'--{name} must be numbers, got {",".join(flag_values[name].value)}'
    ) from None
  if name == 'table_steps':
    return flag_values.table, values, None
  return flag_values.table, None, values


def _export(flag_values):
  from terraformer.evaluation import export  # pylint: disable=g-import-not-at-top
  if not flag_values.logdir and not flag_values.from_export:
    raise errors.TerraformerError('--logdir or --from_export is required')
  if not flag_values.out:
    raise errors.TerraformerError('--out is required')
  table = _table(flag_values)
  out = common.check_output_dir(flag_values.out)
  # Reading event files imports TensorFlow, whose notices go to stderr: hide
  # them (they come back with an unexpected crash, not with a user error).
  user_error = None
  with runtime.quiet():
    try:
      result = export.export(flag_values.logdir or [], out,
                             labels=flag_values.label,
                             metrics=flag_values.metrics, table=table,
                             earlier=flag_values.from_export or ())
    except errors.TerraformerError as e:
      user_error = e
  if user_error:
    raise user_error
  for run in result['runs']:
    print(f'{run["label"]}: {len(run["metrics"])} metrics from '
          f'{run["logdir"]}')
  if result['table']:
    print(result['table'], end='')
  print(f'Wrote {len(result["files"])} files to {out}')
  return 0


def main(argv=None):
  """Parses flags and exports; user errors are one line, exit status 2."""
  argv = sys.argv if argv is None else argv
  flag_values = flags.FlagValues()
  _define_flags(flag_values)
  if any(a in ('-h', '--help', '-help', '--helpfull') for a in argv[1:]):
    print(f'usage: {PROG} --logdir=DIR [--logdir=DIR ...] --out=DIR\n'
          f'{flag_values.get_help()}')
    return 0
  try:
    extra = flag_values(list(argv))[1:]
    if extra:
      raise errors.TerraformerError(
          f'unexpected argument(s): {" ".join(extra)}')
    return _export(flag_values)
  except (flags.Error, errors.TerraformerError) as e:
    print(f'{PROG}: error: {errors.first_line(e)}', file=sys.stderr)
  return common.EXIT_USAGE


if __name__ == '__main__':
  sys.exit(main())
