#!/usr/bin/env python3
"""Tables for the results files: a CLI's tables as its --json holds them,
and the tables no CLI prints.

The experiments (experiments/*.sh) run committed CLIs. Each CLI makes its
tables once, with the formatter that prints them, and its --json holds
them under "tables" (`{"columns": [...], "rows": [[...]]}`, the cells as the
docs show them; terraformer-eval's summary file too). This takes such a
table as it is, picks the rows, columns and labels a results file shows,
and writes `{"columns", "rows"}`: the table `tools/results.py record NAME
--table ID=T.json` takes. The tables no CLI prints it makes itself: a
Markdown table a CLI printed (terraformer-export's table.md), the seeds of
terraformer-ood's runs side by side, the long setting's curve
(experiments/long_setting.py), experiments/long_input_eval.py's lines, and
pytest's JUnit XML.

  experiment_tables.py MODE --out=T.json INPUT... [--label=NAME=TEXT ...]
      [--paper=NAME=TEXT ...] [--columns=A,B,...] [--rename=A=B ...]
      [--figure=ID=SPEC ...] [--figures=F.txt] [--k=K]

writes T.json, prints it as a Markdown table, and writes the cells that
--figure names to F.txt as ID=VALUE lines (for `record --figure`).
experiments/lib.sh's `tabulate MODE ID INPUT...` is how an experiment calls
it (T.json = OUT/ID.json), and its `record` passes every table and figure on.

MODE, its INPUT and what it reads: `experiment_tables.py --help` (TABLES
and MODES below). An INPUT `LABEL=PATH` names a row; it splits at its last
`=`, so a label may hold one (`sparse_ff.gin (N=64)`). --label renames a
model: in the rows' first cells and in the columns named by it (`NAME` or
`NAME ...`: a sweep's, a memory-bench's columns); --k keeps the rows whose
column `k` is K, without that column (terraformer-topk-bench's); --columns
keeps these columns in this order; --rename renames a column; --paper adds
a "paper" column (the paper's figure beside a row, by the model's name);
--figure SPEC is a cell ROW:COLUMN (ROW by its first cell), the mean of
several rows' cells ROW1|ROW2:COLUMN, or a difference of two such,
`A:COLUMN - B:COLUMN`.

It lives in tools/, beside results.py, whose JSON reading, Markdown tables
and one-line errors it uses: the two are the stdlib-only path from a CLI's
output to the committed results files. A mistake (a missing file, a run
without its result, JSON of another shape, a CLI's JSON without its table)
is one line on stderr and exit status 2.
"""
import argparse
import collections
import json
import os
import re
import sys

import results  # tools/results.py (this folder is on sys.path).

PROG = 'experiment_tables.py'
EXIT_USAGE = results.EXIT_USAGE
MISSING = '–'  # As the CLIs write a missing cell (terraformer.cli.common).
OOD_RESULT = 'ood_result.json'  # terraformer.evaluation.ood.RESULT_FILE

TableError = results.ResultsError  # A user's mistake: one line, exit 2.
load_json = results.load_json
key_values = results.key_values


def _joined(values):
  return ' / '.join(values)


def _f(value, fmt):
  return MISSING if value is None else format(value, fmt)


# ---------------------------------------------------------------------------
# A CLI's tables, as its --json holds them.


def cli_table(path, name):
  """The table `name` of a CLI's JSON (its "tables")."""
  data = load_json(path)
  tables = data.get('tables') if isinstance(data, dict) else None
  if not isinstance(tables, dict) or name not in tables:
    raise TableError(
        f'{path}: no table {name!r} (tables: '
        f'{", ".join(tables or {}) or "none"}; a CLI run before its --json '
        'kept its tables: run it again)')
  table = tables[name]
  columns, rows = table.get('columns'), table.get('rows')
  if not isinstance(columns, list) or not isinstance(rows, list) or any(
      len(row) != len(columns) for row in rows):
    raise TableError(f'{path}: table {name!r} needs "columns" and "rows" of '
                     'that many cells')
  return {'columns': list(columns), 'rows': [list(row) for row in rows]}


def _one_table(name, inputs):
  """The table of one CLI run."""
  return cli_table(_one(inputs), name)


def _labelled(name, inputs):
  """[(label, table)] of LABEL=PATH inputs; the tables' columns agree."""
  tables = [(label, cli_table(path, name))
            for label, path in map(_split_label, inputs)]
  for label, table in tables[1:]:
    if table['columns'] != tables[0][1]['columns']:
      raise TableError(f'{label}: columns {table["columns"]} differ from '
                       f'those of {tables[0][0]}: {tables[0][1]["columns"]}')
  return tables


def _one_row_each(name, inputs):
  """A row per LABEL=PATH, labelled: the row of a table of one row (a run
  of one model, one config)."""
  tables = _labelled(name, inputs)
  for label, table in tables:
    if len(table['rows']) != 1:
      raise TableError(f'{label}: {len(table["rows"])} rows in its table; '
                       'takes tables of one row (a run of one model)')
  return {'columns': tables[0][1]['columns'],
          'rows': [[label] + table['rows'][0][1:] for label, table in tables]}


def _first_rows_then_yardsticks(name, inputs):
  """The first row of each LABEL=PATH's table, labelled, then the other
  rows of the first input's (its yardsticks: the same papers for every
  input)."""
  tables = _labelled(name, inputs)
  return {'columns': tables[0][1]['columns'],
          'rows': [[label] + table['rows'][0][1:] for label, table in tables]
                  + tables[0][1]['rows'][1:]}


def _joined_on_first_column(name, inputs):
  """The tables of several runs side by side: a row per first cell (in the
  order met), each table's other columns (MISSING where it has no such
  row); a column in two tables (a model measured twice) is a mistake."""
  columns, rows = None, collections.OrderedDict()
  for path in inputs:
    table = cli_table(path, name)
    if columns is None:
      columns = table['columns'][:1]
    twice = set(columns[1:]) & set(table['columns'][1:])
    if twice:
      raise TableError(f'{path}: column(s) {", ".join(sorted(twice))} '
                       'measured twice')
    by_key = {row[0]: row[1:] for row in table['rows']}
    for key in by_key:
      rows.setdefault(key, [MISSING] * (len(columns) - 1))
    blank = [MISSING] * (len(table['columns']) - 1)
    for key, cells in rows.items():
      cells.extend(by_key.get(key, blank))
    columns += table['columns'][1:]
  return {'columns': columns,
          'rows': [[key] + cells for key, cells in rows.items()]}


def relabel(table, labels):
  """--label: a model's name renamed in the rows' first cells and in the
  columns after the first that it names (NAME, or NAME and more)."""
  names = sorted(labels, key=len, reverse=True)

  def header(column):
    for name in names:
      if column == name or column.startswith(name + ' '):
        return labels[name] + column[len(name):]
    return column

  return {'columns': table['columns'][:1] + [header(c) for c in
                                               table['columns'][1:]],
          'rows': [[labels.get(row[0], row[0])] + row[1:]
                   for row in table['rows']]}


def rows_of_k(table, k):
  """--k: the rows whose column `k` is K, without that column."""
  if 'k' not in table['columns']:
    raise TableError(f'--k: no column k (columns: '
                     f'{", ".join(table["columns"])})')
  at = table['columns'].index('k')
  rows = [row[:at] + row[at + 1:] for row in table['rows']
          if row[at] == str(k)]
  if not rows:
    raise TableError(f'no rows with k = {k}')
  return {'columns': table['columns'][:at] + table['columns'][at + 1:],
          'rows': rows}


CliTable = collections.namedtuple('CliTable', 'name combine reads')
# MODE: the table of a CLI's --json, and how its INPUTs combine.
TABLES = {
    'speed': CliTable('speed', _one_table, 'terraformer-bench --json'),
    'memory': CliTable('memory', _one_table, 'terraformer-bench --json: what '
                       'each model holds, by kind'),
    'speeds': CliTable('speed', _one_row_each, 'LABEL=PATH of '
                       'terraformer-bench --json of one model (a row each)'),
    'projection': CliTable('projection', _one_table,
                           'terraformer-bench --project_layers=L --json'),
    'user_path': CliTable('user_path', _one_table,
                          'terraformer-bench --trax_user_path --json'),
    'agreement': CliTable('agreement', _one_table,
                          'terraformer-bench --agreement --json'),
    'quality': CliTable('quality', _one_table,
                        'terraformer-bench --quality --json'),
    'xla_ops': CliTable('xla_ops', _one_table,
                        'terraformer-bench --xla_ops --json'),
    'profile': CliTable('profile', _one_table,
                        'terraformer-bench --profile_dir=DIR --json'),
    'sweep': CliTable('sweep', _one_table, 'terraformer-bench --sweep --json'),
    'kernel_layers': CliTable('layers', _one_table, 'python -m '
                              'terraformer.benchmarks.kernels --json'),
    'kernel_products': CliTable('products', _one_table, 'python -m '
                                'terraformer.benchmarks.kernels --json'),
    'rouge': CliTable('rouge', _one_table,
                      "terraformer-eval's eval_<split>_step<N>.json"),
    'settings': CliTable('fluency', _first_rows_then_yardsticks,
                         "LABEL=PATH of terraformer-eval's "
                         'eval_<split>_step<N>.json (one split, a row each, '
                         "then the first one's yardsticks)"),
    'params': CliTable('parameters', _one_row_each,
                       'LABEL=PATH of terraformer-info --json (a row each)'),
    'plan': CliTable('plan', _one_row_each,
                     'LABEL=PATH of terraformer-info --devices=N --json'),
    'compiled': CliTable('compiled', _one_row_each, 'LABEL=PATH of '
                         'terraformer-info --devices=N --compiled --json'),
    'lengths': CliTable('lengths', _joined_on_first_column,
                        'terraformer-memory-bench --input_lens=... --json '
                        '(several: side by side)'),
    'depth': CliTable('depth', _one_table,
                      'terraformer-memory-bench --layers=... --json'),
    'topk': CliTable('topk', _one_table,
                     'terraformer-topk-bench --json (with --k)'),
}


# ---------------------------------------------------------------------------
# Tables no CLI prints: a Markdown table a CLI printed, the long setting's
# curve, terraformer-ood's seeds side by side, long_input_eval.py's lines,
# pytest's JUnit XML.


def markdown(text, opts):
  """A Markdown table: header, separator, rows."""
  lines = [l.strip() for l in text.splitlines() if l.strip().startswith('|')]
  if len(lines) < 2:
    raise TableError('no Markdown table')
  split = lambda l: [c.strip() for c in l.strip('|').split('|')]
  rows = [split(l) for l in lines[2:]]
  for row in rows:
    row[0] = opts.label(row[0])
  return split(lines[0]), rows


def curve(data, opts):
  """experiments/long_setting.py curve's points: a row per evaluated step
  of each fine-tuning run (CPU-hours of training so far, pretraining
  included), a row per run for the step chosen on validation, then the
  yardsticks of both splits."""
  columns = ['point', 'fine-tuning steps', 'CPU-hours', 'val ROUGE-1',
             'val ROUGE-2', 'val log-perplexity', 'test ROUGE-1',
             'test ROUGE-2', 'test known trigrams (%)']
  pct = lambda v: f'{100 * v:.2f}'

  def cells(point):
    val, test = point['validation'], point['test']
    ppl = val.get('log_perplexity')
    return [str(point['step']), f'{point["cpu_hours"]:.2f}',
            pct(val['rouge1']), pct(val['rouge2']),
            MISSING if ppl is None else f'{ppl:.3f}', pct(test['rouge1']),
            pct(test['rouge2']), f'{100 * test["known_trigrams"]:.1f}']

  rows = []
  for run in data['runs']:
    label = opts.label(run['label'])
    rows += [[f'{label}, step {p["step"]}'] + cells(p) for p in run['points']]
  for run in data['runs']:
    chosen = [p for p in run['points'] if p['chosen']]
    rows += [[f'{opts.label(run["label"])}, chosen on validation'] + cells(p)
             for p in chosen]
  val, test = (data['yardsticks'].get(s, {}) for s in ('validation', 'test'))
  for name in val:
    rows.append([opts.label(name), MISSING, MISSING, pct(val[name]['rouge1']),
                 pct(val[name]['rouge2']), MISSING,
                 pct(test[name]['rouge1']) if name in test else MISSING,
                 pct(test[name]['rouge2']) if name in test else MISSING,
                 MISSING])
  return columns, rows


# ---------------------------------------------------------------------------
# terraformer-ood


def _pct(value):
  return f'{100 * value:.1f}%'


def _split_cell(runs, split):
  """'a% / b% (c% / d%)': per-token accuracy of each seed, per-sequence in
  parentheses; MISSING where a run did not score the split."""
  scores = [r['scores'].get(split) for r in runs]
  if any(s is None for s in scores):
    return MISSING
  return (_joined(_pct(s['token_accuracy']) for s in scores) + ' (' +
          _joined(_pct(s['sequence_accuracy']) for s in scores) + ')')


def _digits(settings, key):
  low, high = settings[key]
  return f'{low}-{high} digits'


def ood(rows, opts):
  """terraformer-ood runs, a row per LABEL (several runs: its seeds):
  seeds, steps, in distribution and OOD accuracy, train seconds."""
  table, lengths = [], None
  for label, runs in rows:
    settings = [r['settings'] for r in runs]
    for pair in ((_digits(s, 'train_digits'), _digits(s, 'eval_digits'))
                 for s in settings):
      if lengths is None:
        lengths = pair
      elif pair != lengths:
        raise TableError(
            f'row {label!r} trains or evaluates on {pair}, the table on '
            f'{lengths}: one table per length')
    table.append([
        opts.label(label),
        _joined(str(s.get('seed', '')) for s in settings),
        _joined(dict.fromkeys(str(r['steps']) for r in runs)),
        _split_cell(runs, 'validation'),
        _split_cell(runs, 'ood'),
        _joined(f'{r["train_seconds"]:.0f}' for r in runs)])
  columns = ['model (cell)', 'seeds', 'steps',
             f'in distribution ({lengths[0]})', f'OOD ({lengths[1]})',
             'train s']
  return columns, table


# ---------------------------------------------------------------------------
# experiments/long_input_eval.py

RECALL_SCORES = (('step', 'step', str),
                 ('exact_match', 'exact match', '{:.3f}'.format),
                 ('token_accuracy', 'token accuracy', '{:.3f}'.format))
RECALL_POOLING = (('first_pooling_keeps_facts', 'fact tokens kept'),
                  ('first_pooling_keeps_queries', 'query tokens kept'),
                  ('first_pooling_keeps_all', 'examples keeping all'))


BY_KEY_POSITION = 'value_accuracy_by_key_position'


def recall(pairs, opts):
  """experiments/long_input_eval.py's line of each run: step, exact match, token
  accuracy, what the first pooling keeps where it was measured
  (--kept_by_pooling), and the answer values' accuracy by their key's input
  position where measured (--by_key_position; a column per position)."""
  pooling = [(k, name) for k, name in RECALL_POOLING
             if any(k in line for _, line in pairs)]
  positions = sorted({int(p) for _, line in pairs
                      for p in line.get(BY_KEY_POSITION, {})})
  columns = ['run'] + [name for _, name, _ in RECALL_SCORES] + [
      name for _, name in pooling] + [f'key at {p}' for p in positions]
  return columns, [
      [opts.label(label)] + [fmt(line[k]) for k, _, fmt in RECALL_SCORES] +
      [_f(line.get(k), '.3f') for k, _ in pooling] +
      [_f(line.get(BY_KEY_POSITION, {}).get(str(p)), '.3f')
       for p in positions] for label, line in pairs]


# ---------------------------------------------------------------------------
# pytest --junitxml (with -o junit_logging=system-out)


MEASURED_LINE = re.compile(r'max \|')


def pytest_cases(xml_text, _):
  """A row per test file: its tests passed of run, those failed or in error,
  and the measurements its tests printed: the lines that state a `max |...|`
  (e.g. `dense: max |dlogit| 1.2e-06`; progress lines are left out)."""
  import xml.etree.ElementTree as ET  # pylint: disable=import-outside-toplevel
  try:
    root = ET.fromstring(xml_text)
  except ET.ParseError as e:
    raise TableError(f'not a JUnit XML file ({e})') from None
  files = collections.OrderedDict()
  for case in root.iter('testcase'):
    module = case.get('classname', '').split('.')
    name = '/'.join(m for m in module if m) + '.py'
    entry = files.setdefault(name, {'run': 0, 'passed': 0, 'failed': [],
                                    'printed': []})
    if case.find('skipped') is not None:
      continue
    entry['run'] += 1
    if case.find('failure') is not None or case.find('error') is not None:
      entry['failed'].append(case.get('name'))
    else:
      entry['passed'] += 1
    out = case.find('system-out')
    if out is not None and out.text:
      entry['printed'] += [line.strip() for line in out.text.splitlines()
                           if MEASURED_LINE.search(line)]
  if not files:
    raise TableError('no test cases')
  columns = ['tests', 'passed', 'failed', 'printed (measured)']
  rows = [[name, f'{e["passed"]} of {e["run"]}',
           ', '.join(e['failed']) or '0', '; '.join(e['printed']) or MISSING]
          for name, e in files.items()]
  return columns, rows


# ---------------------------------------------------------------------------
# Inputs.


def _split_label(item):
  """LABEL=VALUE at the last `=` (a label may hold one, a path rarely)."""
  label, sep, value = item.rpartition('=')
  if not sep or not label or not value:
    raise TableError(f'expected LABEL=PATH, got {item!r}')
  return label, value


def _text(path):
  try:
    with open(path, encoding='utf-8') as f:
      return f.read()
  except OSError as e:
    raise TableError(f'{path}: {e.strerror}') from None


def _one(inputs):
  if len(inputs) != 1:
    raise TableError(f'takes one input, got {len(inputs)}')
  return inputs[0]


def _runs(value):
  """The ood_result.json of each RUN_DIR of `RUN_DIR[,RUN_DIR...]`."""
  runs = []
  for run_dir in value.split(','):
    path = os.path.join(run_dir, OOD_RESULT)
    if not os.path.isfile(path):
      raise TableError(f'{path}: no result (the run has not finished)')
    runs.append(load_json(path))
  return runs


READERS = {
    'json': lambda inputs: load_json(_one(inputs)),
    'text': lambda inputs: _text(_one(inputs)),
    'labelled': lambda inputs: [(label, load_json(path))
                                for label, path in map(_split_label, inputs)],
    'runs': lambda inputs: [(label, _runs(dirs))
                            for label, dirs in map(_split_label, inputs)],
}

Mode = collections.namedtuple('Mode', 'table inputs reads')
# MODE: a table made here, of what it reads.
MODES = {
    'markdown': Mode(markdown, 'text',
                     "a Markdown table (terraformer-export's table.md)"),
    'curve': Mode(curve, 'json', 'experiments/long_setting.py curve --out'),
    'ood': Mode(ood, 'runs', 'LABEL=RUN_DIR[,RUN_DIR...] of terraformer-ood '
                '(RUN_DIR/ood_result.json; several: the seeds of one row)'),
    'recall': Mode(recall, 'labelled',
                   "LABEL=PATH of experiments/long_input_eval.py's line"),
    'pytest': Mode(pytest_cases, 'text', 'pytest --junitxml=F -o '
                   'junit_logging=system-out -s: a row per test file'),
}


# ---------------------------------------------------------------------------
# Columns, papers, figures.


class Options:
  """What a table made here may use besides its input: --label."""

  def __init__(self, labels):
    self.labels = labels

  def label(self, name):
    return self.labels.get(name, name)


def _select(columns, rows, chosen):
  """The rows (lists in `columns` order, or dicts by column name) as lists
  of the `chosen` columns."""
  table = []
  for row in rows:
    if not isinstance(row, dict):
      if chosen == columns:
        table.append(list(row))
        continue
      row = {c: row[i] for i, c in reversed(list(enumerate(columns)))}
    missing = [c for c in chosen if c not in row]
    if missing:
      raise TableError(f'no column(s) {", ".join(missing)} (columns: '
                       f'{", ".join(row)})')
    table.append([row[c] for c in chosen])
  return table


def _cell(columns, rows, spec):
  """The cell ROW:COLUMN (row by its first cell, column by its name); with
  ROW1|ROW2|... the mean of their numbers (the cells' decimals kept)."""
  row_names, sep, column = spec.rpartition(':')
  if not sep or column not in columns:
    raise TableError(f'--figure {spec!r}: no column {column!r} '
                     f'(columns: {", ".join(columns)})')
  by_name = {row[0]: row[columns.index(column)] for row in rows}
  cells = []
  for name in row_names.split('|'):
    if name not in by_name:
      raise TableError(f'--figure {spec!r}: no row {name!r}')
    cells.append(by_name[name])
  if len(cells) == 1:
    return cells[0]
  return _number(cells, sum(_float(c, spec) for c in cells) / len(cells))


def _float(cell, spec):
  try:
    return float(re.match(r'[-+]?[\d.]+', cell).group())
  except (AttributeError, ValueError):
    raise TableError(f'--figure {spec!r}: {cell!r} is not a number') from None


def _number(cells, value, sign=''):
  decimals = max(len(c.partition('.')[2].rstrip('x%')) for c in cells)
  return f'{value:{sign}.{decimals}f}'


def figure(columns, rows, spec):
  """A cell (see _cell), or `CELL - CELL`: their difference, signed."""
  if ' - ' not in spec:
    return _cell(columns, rows, spec)
  a, b = (_cell(columns, rows, part) for part in spec.split(' - ', 1))
  return _number([a, b], _float(a, spec) - _float(b, spec), '+')


def build(mode, inputs, labels=None, papers=None, columns=None, k=None,
          renames=None):
  """{"columns", "rows"} of MODE's INPUTs (see the module's docstring)."""
  labels = labels or {}
  if mode in TABLES:
    spec = TABLES[mode]
    table = relabel(spec.combine(spec.name, inputs), labels)
    if k is not None:
      table = rows_of_k(table, k)
    elif mode == 'topk':
      raise TableError('topk needs --k')
    all_columns, rows = table['columns'], table['rows']
  else:
    spec = MODES[mode]
    data = READERS[spec.inputs](inputs)
    try:
      all_columns, rows = spec.table(data, Options(labels))
    except (KeyError, TypeError, IndexError, AttributeError) as e:
      raise TableError(f'{", ".join(inputs)} is not what {mode} reads '
                       f'({spec.reads}; {type(e).__name__}: {e})') from None
  chosen = columns or all_columns
  rows = _select(all_columns, rows, chosen)
  chosen = [(renames or {}).get(c, c) for c in chosen]
  if papers:
    by_label = {labels.get(name, name): v for name, v in papers.items()}
    chosen = chosen + ['paper']
    rows = [row + [by_label.get(row[0], MISSING)] for row in rows]
  return {'columns': list(chosen), 'rows': rows}


def _parser():
  reads = {**{name: t.reads for name, t in TABLES.items()},
           **{name: m.reads for name, m in MODES.items()}}
  parser = results.OneLineParser(
      prog=PROG, description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog='MODE and its INPUT:\n' + '\n'.join(
          f'  {name:13s} {what}' for name, what in reads.items()))
  parser.add_argument('mode', choices=list(reads), metavar='MODE')
  parser.add_argument('inputs', nargs='+', metavar='INPUT')
  parser.add_argument('--out', required=True, help='the table (JSON) written')
  parser.add_argument('--label', action='append', help='NAME=TEXT (repeat)')
  parser.add_argument('--paper', action='append', help='NAME=TEXT (repeat)')
  parser.add_argument('--columns', help='comma-separated: only these '
                      'columns, in this order')
  parser.add_argument('--rename', action='append',
                      help='COLUMN=NAME (repeat): a column renamed')
  parser.add_argument('--figure', action='append',
                      help='ID=SPEC (repeat): a cell, a mean or a difference')
  parser.add_argument('--figures', help='where the figures go, as ID=VALUE '
                      'lines')
  parser.add_argument('--k', type=int, help="the rows whose column k is K "
                      "(terraformer-topk-bench's), without it")
  return parser


def _write(path, text):
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(tmp, path)


def main(argv=None):
  mode = None
  try:
    args = _parser().parse_args(argv)
    mode = args.mode
    table = build(args.mode, args.inputs, key_values(args.label, 'label'),
                  key_values(args.paper, 'paper'),
                  args.columns.split(',') if args.columns else None, args.k,
                  key_values(args.rename, 'rename'))
    figures = {fid: figure(table['columns'], table['rows'], spec)
               for fid, spec in key_values(args.figure, 'figure').items()}
    _write(args.out, json.dumps(table, indent=1, ensure_ascii=False))
    if args.figures:
      _write(args.figures, ''.join(f'{fid}={value}\n'
                                   for fid, value in figures.items()))
  except TableError as e:
    print(f'{PROG}: error: {mode + ": " if mode else ""}{e}', file=sys.stderr)
    return EXIT_USAGE
  except OSError as e:
    print(f'{PROG}: error: {e.filename}: {e.strerror}', file=sys.stderr)
    return EXIT_USAGE
  print(results.markdown_table(table['columns'], table['rows']))
  for fid, value in figures.items():
    print(f'figure {fid}: {value}')
  print(f'(written to {args.out})')
  return 0


if __name__ == '__main__':
  sys.exit(main())
