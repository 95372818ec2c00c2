#!/usr/bin/env python3
"""A results table from what a committed CLI wrote (stdlib only).

`scripts/results.py record NAME --table ID=PATH` takes `{"columns", "rows"}`;
the CLIs below write richer JSON. Each subcommand reads one CLI's output and
writes such a table (and prints it), its cells formatted as the docs show
them:

  experiment_tables.py ood --out=T.json --row='LABEL=RUN_DIR[,RUN_DIR...]' ...
      terraformer-ood runs (RUN_DIR/ood_result.json; several dirs: the seeds
      of one row): model, seeds, steps, in distribution, OOD (per token, per
      sequence in parentheses; one value per seed), train s
  experiment_tables.py lengths --out=T.json [--label=MODEL=TEXT ...] JSON ...
      terraformer-memory-bench --input_lens=... --json (several merged):
      compiled gradient-step MiB per model and input length, then the step
      ms of the models that were timed
  experiment_tables.py depth --out=T.json JSON
      terraformer-memory-bench --layers=... --json: MiB reversible vs not
  experiment_tables.py params --out=T.json --row='LABEL=JSON' ...
      terraformer-info --json: the total parameters of each config
  experiment_tables.py topk --out=T.json --k=128 JSON
      terraformer-topk-bench --json: ms and nCCS of each operator per n
  experiment_tables.py recall --out=T.json --row='LABEL=JSON' ...
      scripts/long_input_eval.py's line: step, exact match, token accuracy
      (and, with --kept_by_pooling, what the first pooling keeps)

A mistake (a missing file, a run without its result) is one line on stderr
and exit status 2.
"""
import argparse
import json
import os
import sys

PROG = 'experiment_tables.py'
EXIT_USAGE = 2
MIB = 2 ** 20
MISSING = '–'
OOD_RESULT = 'ood_result.json'  # terraformer.evaluation.ood.RESULT_FILE
TOPK_LABELS = {'sh': 'SH', 'sh_unsorted': 'unsorted', 'sh_plain': 'plain',
               'goyal': 'Goyal', 'hard': 'hard top-k'}


class TableError(Exception):
  """A user's mistake: printed as one line, exit status 2."""


def _load(path):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise TableError(f'{path}: not JSON ({e})') from None
  except OSError as e:
    raise TableError(f'{path}: {e.strerror}') from None


def _pairs(values, what):
  """[(key, value)] of KEY=VALUE arguments, in order."""
  pairs = []
  for value in values or []:
    key, sep, rest = value.partition('=')
    if not sep or not key or not rest:
      raise TableError(f'--{what} needs KEY=VALUE, got {value!r}')
    pairs.append((key, rest))
  return pairs


def _joined(values):
  return ' / '.join(values)


# ---------------------------------------------------------------------------
# terraformer-ood


def _pct(value):
  return f'{100 * value:.1f}%'


def _split_cell(results, split):
  """'a% / b% (c% / d%)': per-token accuracy of each seed, per-sequence in
  parentheses; MISSING where a run did not score the split."""
  scores = [r['scores'].get(split) for r in results]
  if any(s is None for s in scores):
    return MISSING
  return (_joined(_pct(s['token_accuracy']) for s in scores) + ' (' +
          _joined(_pct(s['sequence_accuracy']) for s in scores) + ')')


def _digits(settings, key):
  low, high = settings[key]
  return f'{low}-{high} digits'


def ood_table(rows):
  """rows: [(label, [run dir, ...])] -> {"columns", "rows"}."""
  if not rows:
    raise TableError('ood: give at least one --row')
  table, lengths = [], None
  for label, dirs in rows:
    results = []
    for run_dir in dirs:
      path = os.path.join(run_dir, OOD_RESULT)
      if not os.path.isfile(path):
        raise TableError(f'{path}: no result (the run has not finished)')
      results.append(_load(path))
    settings = [r['settings'] for r in results]
    these = [(_digits(s, 'train_digits'), _digits(s, 'eval_digits'))
             for s in settings]
    for pair in these:
      if lengths is None:
        lengths = pair
      elif pair != lengths:
        raise TableError(
            f'ood: row {label!r} trains or evaluates on {pair}, the table on '
            f'{lengths}: one table per length')
    table.append([
        label,
        _joined(str(s.get('seed', '')) for s in settings),
        _joined(dict.fromkeys(str(r['steps']) for r in results)),
        _split_cell(results, 'validation'),
        _split_cell(results, 'ood'),
        _joined(f'{r["train_seconds"]:.0f}' for r in results)])
  columns = ['model (cell)', 'seeds', 'steps',
             f'in distribution ({lengths[0]})', f'OOD ({lengths[1]})',
             'train s']
  return {'columns': columns, 'rows': table}


# ---------------------------------------------------------------------------
# terraformer-memory-bench


def lengths_table(reports, labels=None):
  """Merged `--input_lens` reports -> input tokens x (MiB, then ms)."""
  labels = dict(labels or {})
  models = {}
  for where, report in reports:
    if not isinstance(report, dict) or not isinstance(
        report.get('models'), dict):
      raise TableError(f'{where}: not the JSON of terraformer-memory-bench '
                       '--input_lens=... --json')
    for name, rows in report['models'].items():
      if name in models:
        raise TableError(f'{where}: model {name!r} measured twice')
      models[name] = {row['input_len']: row for row in rows}
  if not models:
    raise TableError('lengths: no models')
  unknown = set(labels) - set(models)
  if unknown:
    raise TableError(f'--label for unmeasured model(s): '
                     f'{", ".join(sorted(unknown))}')
  lens = sorted({n for rows in models.values() for n in rows})
  timed = [m for m, rows in models.items()
           if any(r.get('step_ms') is not None for r in rows.values())]
  columns = (['input tokens'] + [labels.get(m, m) for m in models] +
             [f'{labels.get(m, m)} ms' for m in timed])
  table = []
  for n in lens:
    row = [str(n)]
    for m in models:
      r = models[m].get(n)
      row.append(MISSING if r is None else
                 f'{r["memory"]["total"] / MIB:.1f}')
    for m in timed:
      r = models[m].get(n)
      ms = None if r is None else r.get('step_ms')
      row.append(MISSING if ms is None else f'{ms:.0f}')
    table.append(row)
  return {'columns': columns, 'rows': table}


def depth_table(report, where='depth'):
  """`--layers` report -> layers x reversible / not reversible MiB."""
  if not isinstance(report, dict) or not isinstance(report.get('rows'), list):
    raise TableError(f'{where}: not the JSON of terraformer-memory-bench '
                     '--layers=... --json')
  table = []
  for row in report['rows']:
    rev, plain = row['reversible'], row['non_reversible']
    table.append([str(row['layers']),
                  f'{rev["total"] / MIB:.1f}', f'{rev["temp"] / MIB:.1f}',
                  f'{plain["total"] / MIB:.1f}', f'{plain["temp"] / MIB:.1f}',
                  f'{plain["total"] / rev["total"]:.2f}'])
  return {'columns': ['layers', 'reversible', '(temporaries)',
                      'not reversible', '(temporaries)', 'ratio'],
          'rows': table}


# ---------------------------------------------------------------------------
# terraformer-info, terraformer-topk-bench


def parameters(total):
  """775.4M, 16.88B, 52,224: as the docs write parameter counts."""
  if total >= 1e9:
    return f'{total / 1e9:.2f}B'
  if total >= 1e6:
    return f'{total / 1e6:.1f}M'
  return f'{total:,}'


def params_table(rows):
  """rows: [(label, terraformer-info --json path)] -> config x parameters."""
  if not rows:
    raise TableError('params: give at least one --row')
  table = []
  for label, path in rows:
    report = _load(path)
    if not isinstance(report, dict) or 'total' not in report:
      raise TableError(f'{path}: not the JSON of terraformer-info --json')
    table.append([label, parameters(report['total'])])
  return {'columns': ['config', 'parameters'], 'rows': table}


def _ms(value):
  return f'{value:.2f}' if value < 10 else f'{value:.1f}'


def topk_table(report, k, where='topk'):
  """terraformer-topk-bench's rows at one k -> n x (ms, nCCS) per method."""
  if not isinstance(report, dict) or not isinstance(report.get('rows'), list):
    raise TableError(f'{where}: not the JSON of terraformer-topk-bench')
  methods = list(report.get('methods') or [])
  rows = [r for r in report['rows'] if r.get('k') == k]
  if not rows:
    raise TableError(f'{where}: no rows with k = {k}')
  similar = [m for m in methods if m != 'hard']  # Exact: nCCS 1 by definition.
  label = lambda m: TOPK_LABELS.get(m, m)
  columns = (['n'] + [f'{label(m)} ms' for m in methods] +
             [f'{label(m)} nCCS' for m in similar])
  table = []
  for r in rows:
    cells = [str(r['n'])]
    cells += [MISSING if r.get(m) is None else _ms(r[m]['ms'])
              for m in methods]
    cells += [MISSING if r.get(m) is None else f'{r[m]["nccs"]:.3f}'
              for m in similar]
    table.append(cells)
  return {'columns': columns, 'rows': table}


# ---------------------------------------------------------------------------
# scripts/long_input_eval.py

RECALL_COLUMNS = (('step', 'step', str),
                  ('exact_match', 'exact match', '{:.3f}'.format),
                  ('token_accuracy', 'token accuracy', '{:.3f}'.format),
                  ('first_pooling_keeps_facts', 'fact tokens kept',
                   '{:.3f}'.format),
                  ('first_pooling_keeps_queries', 'query tokens kept',
                   '{:.3f}'.format),
                  ('first_pooling_keeps_all', 'examples keeping all',
                   '{:.3f}'.format))


def recall_table(rows):
  """rows: [(label, long_input_eval.py JSON path)] -> run x scores."""
  if not rows:
    raise TableError('recall: give at least one --row')
  results = []
  for label, path in rows:
    result = _load(path)
    if not isinstance(result, dict) or 'exact_match' not in result:
      raise TableError(f'{path}: not the line of scripts/long_input_eval.py')
    results.append((label, result))
  keys = [(k, name, fmt) for k, name, fmt in RECALL_COLUMNS
          if any(k in r for _, r in results)]
  return {'columns': ['run'] + [name for _, name, _ in keys],
          'rows': [[label] + [MISSING if k not in r else fmt(r[k])
                              for k, _, fmt in keys]
                   for label, r in results]}


# ---------------------------------------------------------------------------


def markdown(table):
  lines = ['| ' + ' | '.join(table['columns']) + ' |',
           '| ' + ' | '.join('---' for _ in table['columns']) + ' |']
  lines += ['| ' + ' | '.join(row) + ' |' for row in table['rows']]
  return '\n'.join(lines)


def _parser():
  parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split(
      '\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command', required=True)
  ood = sub.add_parser('ood', help='terraformer-ood runs')
  ood.add_argument('--row', action='append',
                   help="LABEL=RUN_DIR[,RUN_DIR...] (repeat; table order)")
  lengths = sub.add_parser('lengths', help='terraformer-memory-bench '
                           '--input_lens')
  lengths.add_argument('--label', action='append',
                       help='MODEL=TEXT: the column of MODEL')
  lengths.add_argument('json', nargs='+')
  depth = sub.add_parser('depth', help='terraformer-memory-bench --layers')
  depth.add_argument('json')
  params = sub.add_parser('params', help='terraformer-info --json')
  params.add_argument('--row', action='append', help='LABEL=JSON (repeat)')
  topk = sub.add_parser('topk', help='terraformer-topk-bench --json')
  topk.add_argument('--k', type=int, required=True)
  topk.add_argument('json')
  recall = sub.add_parser('recall', help='scripts/long_input_eval.py')
  recall.add_argument('--row', action='append', help='LABEL=JSON (repeat)')
  for p in (ood, lengths, depth, params, topk, recall):
    p.add_argument('--out', required=True, help='the table (JSON) written')
  return parser


def build(args):
  if args.command == 'ood':
    return ood_table([(label, value.split(','))
                      for label, value in _pairs(args.row, 'row')])
  if args.command == 'lengths':
    return lengths_table([(p, _load(p)) for p in args.json],
                         _pairs(args.label, 'label'))
  if args.command == 'depth':
    return depth_table(_load(args.json), args.json)
  if args.command == 'params':
    return params_table(_pairs(args.row, 'row'))
  if args.command == 'recall':
    return recall_table(_pairs(args.row, 'row'))
  return topk_table(_load(args.json), args.k, args.json)


def main(argv=None):
  args = _parser().parse_args(argv)
  try:
    table = build(args)
    tmp = args.out + '.tmp'
    with open(tmp, 'w', encoding='utf-8') as f:
      json.dump(table, f, indent=1, ensure_ascii=False)
    os.replace(tmp, args.out)
  except TableError as e:
    print(f'{PROG}: {e}', file=sys.stderr)
    return EXIT_USAGE
  except OSError as e:
    print(f'{PROG}: {args.out}: {e.strerror}', file=sys.stderr)
    return EXIT_USAGE
  except (KeyError, TypeError) as e:  # A JSON of another shape.
    print(f'{PROG}: unexpected input: {e!r}', file=sys.stderr)
    return EXIT_USAGE
  print(markdown(table))
  print(f'(written to {args.out})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
