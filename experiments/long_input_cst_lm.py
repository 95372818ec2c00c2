#!/usr/bin/env python3
"""CST against full attention (experiments/long_input_cst_lm.sh): how far
each row trains, and its table at equal steps and at equal wall time.

  long_input_cst_lm.py targets --bench=B.json --steps=S --every=E ROW...
      prints `ROW STEPS` a line: S, or for a row faster than `full` the
      steps it takes in the time full takes to S (S * t_full / t_row,
      rounded up to a multiple of E, so that an evaluation brackets it);
      t: the gradient step's median ms in B.json (terraformer-memory-bench
      --json, one length; a model is its gin file's name).
  long_input_cst_lm.py table --export=DIR --bench=B.json --steps=S1,S2,...
      --out=T.json LABEL=ROW:RUN,RUN ...
      a row per LABEL: the eval log-perplexity of its runs (labels in DIR's
      terraformer-export scalars.json) at each step S (mean, then seed by
      seed), at the equal wall time (the time full takes to the last S, by
      the step times of B.json; linear between the evaluations around it),
      each minus full's, the step ms and compiled MiB of B.json and the
      median ms a step of the training logs (Trax's steps per second of
      each interval between evaluations, the first two left out: compiling).

The table is `{"columns", "rows"}` (`tools/results.py record` takes it), also
printed as Markdown. A mistake (a missing file, run or model) is one line on
stderr, exit status 2.
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'tools'))
# A missing or broken file: one line (tools/results.py's reader).
from results import ResultsError as Error  # pylint: disable=g-import-not-at-top,wrong-import-position
from results import load_json as _load  # pylint: disable=g-import-not-at-top,wrong-import-position

EXIT_USAGE = 2
FULL = 'full'
LOG_PPL = 'eval/metrics/log_perplexity'
STEPS_PER_S = 'train/training/steps per second'
MISSING = '–'




def bench(path):
  """{model: (step ms, compiled bytes)} of a terraformer-memory-bench
  --input_lens=N --json report (one length)."""
  out = {}
  for name, rows in _load(path).get('models', {}).items():
    if len(rows) != 1:
      raise Error(f'{path}: {name} has {len(rows)} lengths, expected one')
    out[name] = (rows[0]['step_ms'], rows[0]['memory']['total'])
  return out


def _step_ms(times, row):
  if row not in times or times[row][0] is None:
    raise Error(f'no step time of {row!r} in the bench report')
  return times[row][0]


def targets(times, rows, steps, every):
  """{row: steps to train}: `steps`, or the steps a row faster than full
  makes in full's time to `steps`, rounded up to a multiple of `every`."""
  out = {}
  for row in rows:
    out[row] = steps
    if FULL in rows and row != FULL:
      equal_time = steps * _step_ms(times, FULL) / _step_ms(times, row)
      out[row] = max(steps, every * math.ceil(equal_time / every - 1e-9))
  return out


def value_at(points, step):
  """The curve [(step, value)] at `step`, linear between its points; None
  outside them."""
  points = sorted(points)
  for (s0, v0), (s1, v1) in zip(points, points[1:]):
    if s0 <= step <= s1:
      return v0 if s1 == s0 else v0 + (v1 - v0) * (step - s0) / (s1 - s0)
  if points and step == points[-1][0]:
    return points[-1][1]
  return None


def _runs(export_dir):
  data = _load(os.path.join(export_dir, 'scalars.json'))
  return {run['label']: run['metrics'] for run in data['runs']}


def _curve(metrics, name):
  return [(p['step'], p['value']) for p in metrics.get(name, [])]


def log_ms(metrics):
  """ms a step of each logged interval, the first two (compiling) left
  out where there are more."""
  rates = _curve(metrics, STEPS_PER_S)[1:]
  rates = rates[1:] if len(rates) > 1 else rates
  return [1e3 / rate for _, rate in rates if rate > 0]


def _mean_cell(values):
  if any(v is None for v in values) or not values:
    return MISSING, None
  mean = statistics.fmean(values)
  seeds = ', '.join(f'{v:.3f}' for v in values)
  return (f'{mean:.3f} ({seeds})' if len(values) > 1 else f'{mean:.3f}',
          mean)


def _diff(value, reference):
  return MISSING if value is None or reference is None else (
      f'{value - reference:+.3f}')


def table(runs, times, specs, steps):
  """(columns, rows) of the rows `specs` [(label, row, [run labels])]."""
  if not any(row == FULL for _, row, _ in specs):
    raise Error(f'the table needs the {FULL!r} row')
  last = steps[-1]
  budget = last * _step_ms(times, FULL)
  columns = ([f'log-ppl at {s}' for s in steps] + [f'vs full at {last}'] +
             ['step ms', 'speed vs full', 'MiB', 'log ms/step',
              "steps in full's time", "log-ppl in full's time",
              "vs full in full's time"])
  means, cells = {}, {}
  for label, row, labels in specs:
    missing = [l for l in labels if l not in runs]
    if missing:
      raise Error(f'{label}: no run {missing[0]!r} in the export')
    curves = [_curve(runs[l], LOG_PPL) for l in labels]
    ms, total = times.get(row, (None, None))
    if ms is None:
      raise Error(f'{label}: no step time of {row!r} in the bench report')
    at = [_mean_cell([value_at(c, s) for c in curves]) for s in steps]
    equal_step = budget / ms
    in_time = _mean_cell([value_at(c, equal_step) for c in curves])
    logged = [v for l in labels for v in log_ms(runs[l])]
    means[row] = (at[-1][1], in_time[1])
    cells[row] = ([c for c, _ in at], ms, total, logged, equal_step,
                  in_time[0])
  full_at, full_in_time = means[FULL]
  rows = []
  for label, row, _ in specs:
    at, ms, total, logged, equal_step, in_time = cells[row]
    rows.append([label] + at + [
        _diff(means[row][0], full_at), f'{ms:.0f}',
        f'{_step_ms(times, FULL) / ms:.2f}x', f'{total / 2 ** 20:.0f}',
        f'{statistics.median(logged):.0f}' if logged else MISSING,
        f'{equal_step:.0f}', in_time, _diff(means[row][1], full_in_time)])
  return ['row'] + columns, rows


def markdown(columns, rows):
  lines = ['| ' + ' | '.join(columns) + ' |',
           '|' + ' --- |' * len(columns)]
  lines += ['| ' + ' | '.join(row) + ' |' for row in rows]
  return '\n'.join(lines)


def _spec(text):
  label, sep, rest = text.rpartition('=')
  row, colon, runs = rest.partition(':')
  if not sep or not colon or not label or not row or not runs:
    raise Error(f'a row is LABEL=ROW:RUN[,RUN...], got {text!r}')
  return label, row, runs.split(',')


def _steps(text):
  try:
    steps = [int(s) for s in text.split(',')]
  except ValueError:
    raise Error(f'--steps must be integers, got {text!r}') from None
  if steps != sorted(steps) or not steps:
    raise Error(f'--steps must be increasing, got {text!r}')
  return steps


def _parser():
  parser = argparse.ArgumentParser(prog='long_input_cst_lm.py')
  sub = parser.add_subparsers(dest='command', required=True)
  t = sub.add_parser('targets')
  t.add_argument('--bench', required=True)
  t.add_argument('--steps', type=int, required=True)
  t.add_argument('--every', type=int, required=True)
  t.add_argument('rows', nargs='+')
  b = sub.add_parser('table')
  b.add_argument('--export', required=True)
  b.add_argument('--bench', required=True)
  b.add_argument('--steps', required=True)
  b.add_argument('--out', required=True)
  b.add_argument('specs', nargs='+')
  return parser


def main(argv=None):
  args = _parser().parse_args(argv)
  try:
    times = bench(args.bench)
    if args.command == 'targets':
      for row, n in targets(times, args.rows, args.steps, args.every).items():
        print(row, n)
      return 0
    columns, rows = table(_runs(args.export), times,
                          [_spec(s) for s in args.specs], _steps(args.steps))
  except Error as e:
    print(f'long_input_cst_lm.py: error: {e}', file=sys.stderr)
    return EXIT_USAGE
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump({'columns': columns, 'rows': rows}, f, indent=1,
              ensure_ascii=False)
  print(markdown(columns, rows))
  return 0


if __name__ == '__main__':
  sys.exit(main())
