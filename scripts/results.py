#!/usr/bin/env python3
"""The results tables of README.md and docs/*.md, generated from results/*.json.

Each headline figure lives once, in `results/<name>.json` (written by the
experiment that measured it, `experiments/<name>.sh`); the pages carry
generated blocks whose bodies only this script writes:

  <!-- results:<name>/<table_id> -->   a table of results/<name>.json
  <!-- results:readme -->               README's table, rows from results/readme.json
  <!-- /results -->                     closes either

Usage (stdlib only, any Python 3):

  scripts/results.py [render] [--root DIR] [PAGE ...]   fill every block (writes)
  scripts/results.py --check [--root DIR] [PAGE ...]    exit 1 listing the blocks that differ
  scripts/results.py record NAME --table ID=PATH.json [--table ...]
      [--figure ID=VALUE ...] [--caption ID=TEXT ...] [--columns ID=a,b,...]
      [--command TEXT] [--short_command TEXT] [--cost TEXT] [--root DIR]

`record` reads a table a CLI wrote (`{"columns": [...], "rows": [[...]]}`, a
list of dicts, or `{"rows": [dicts]}`: columns from the keys, or those named
by --columns) and writes or updates results/<name>.json, its `measured` filled
from today's date and /proc/cpuinfo (model name; avx512_vnni -> avx512-vnni,
avx2 -> avx2, else unknown). A mistake (an unknown `<name>/<table_id>`, a
missing figure, a block left open, a file that is not JSON) is one line on
stderr and exit status 2.

results/<name>.json:
  {"experiment", "command", "short_command", "cost",
   "measured": {"date", "machine", "isa"},
   "tables": {ID: {"caption", "columns", "rows"[, "measured", "command", "cost"]}},
   "figures": {ID: "2.85x"}}
A table's own "measured" / "command" / "cost" override the file's (a table
transcribed from an earlier run keeps its own date).

results/readme.json: a list of rows
  {"result": ..., "ours": "<name>/<figure_id>", "paper": ..., "page": "docs/x.md#anchor"}
"""
import argparse
import datetime
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROG = 'results.py'
EXIT_USAGE = 2
README_BLOCK = 'readme'
BLOCK = re.compile(
    r'(<!-- results:(?P<key>[^\s>]+) -->\n)(?P<body>.*?)(<!-- /results -->)',
    re.S)
OPEN = re.compile(r'<!-- results:(\S+) -->')
ISAS = ('avx2', 'avx512-vnni', 'unknown')


class ResultsError(Exception):
  """A user's mistake: printed as one line, exit status 2."""


# ---------------------------------------------------------------------------
# Reading results files.


def _load_json(path):
  where = os.path.relpath(path) if os.path.abspath(path).startswith(
      os.getcwd() + os.sep) else path
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ResultsError(f'{where}: not JSON ({e})') from None
  except OSError as e:
    raise ResultsError(f'{where}: {e.strerror}') from None


def _results_dir(root):
  return os.path.join(root, 'results')


def load_results(root):
  """{name: results dict} for every results/<name>.json but readme.json."""
  results = {}
  for path in sorted(glob.glob(os.path.join(_results_dir(root), '*.json'))):
    name = os.path.splitext(os.path.basename(path))[0]
    if name == README_BLOCK:
      continue
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get('tables', {}),
                                                    dict):
      raise ResultsError(f'{path}: expected an object with "tables"')
    results[name] = data
  return results


def pages(root):
  """README.md and docs/*.md under `root`, those that exist."""
  found = [os.path.join(root, 'README.md')]
  found += sorted(glob.glob(os.path.join(root, 'docs', '*.md')))
  return [os.path.normpath(p) for p in found if os.path.isfile(p)]


# ---------------------------------------------------------------------------
# Rendering.


def _cell(value):
  """A table cell: one line, pipes escaped."""
  text = value if isinstance(value, str) else json.dumps(value)
  return ' '.join(text.split()).replace('|', r'\|')


def markdown_table(columns, rows):
  lines = ['| ' + ' | '.join(_cell(c) for c in columns) + ' |',
           '| ' + ' | '.join('---' for _ in columns) + ' |']
  for row in rows:
    lines.append('| ' + ' | '.join(_cell(c) for c in row) + ' |')
  return '\n'.join(lines)


def _measured_line(data, table):
  measured = table.get('measured') or data.get('measured') or {}
  command = table.get('command') or data.get('command')
  cost = table.get('cost') or data.get('cost')
  isa = measured.get('isa') or 'unknown'
  parts = ['Measured']
  if measured.get('date'):
    parts.append(measured['date'])
  if measured.get('machine'):
    parts.append(f'on a {measured["machine"]}')
  parts.append(f'({isa})' if isa != 'unknown' else '(ISA unknown)')
  if command:
    parts.append(f'by `{command}`')
  extra = [cost] if cost else []
  if data.get('short_command'):
    extra.append(f'short version: `{data["short_command"]}`')
  line = ' '.join(parts)
  return line + (f' ({"; ".join(extra)})' if extra else '') + '.'


def _lookup(results, ref, kind, what):
  """results/<name>.json's `kind` entry (tables/figures) `<name>/<id>`."""
  name, _, key = ref.partition('/')
  if name not in results:
    raise ResultsError(f'unknown {what} {ref!r}: no results/{name}.json')
  entries = results[name].get(kind, {})
  if key not in entries:
    raise ResultsError(
        f'unknown {what} {ref!r}: results/{name}.json has {kind} '
        f'{", ".join(sorted(entries)) or "(none)"}')
  return results[name], entries[key]


def render_table_block(results, key):
  """The body of a `<name>/<table_id>` block."""
  data, table = _lookup(results, key, 'tables', 'results block')
  columns, rows = table.get('columns'), table.get('rows')
  if not columns or not isinstance(rows, list) or any(
      len(r) != len(columns) for r in rows):
    raise ResultsError(
        f'results/{key.partition("/")[0]}.json: table '
        f'{key.partition("/")[2]!r} needs "columns" and "rows" of that many '
        'cells')
  body = []
  if table.get('caption'):
    body += [_cell(table['caption']), '']
  body += [markdown_table(columns, rows), '', _measured_line(data, table)]
  return '\n'.join(body) + '\n'


def figure(results, ref):
  """The figure `<name>/<figure_id>` of the results files."""
  return _lookup(results, ref, 'figures', 'figure')[1]


def _page_link(page):
  path, _, anchor = page.partition('#')
  label = os.path.splitext(os.path.basename(path))[0]
  return f'[{label}]({page})' if anchor or path else ''


def render_readme_block(results, root):
  """README's table: | result | ours | paper | page |, one figure per cell."""
  path = os.path.join(_results_dir(root), 'readme.json')
  rows = _load_json(path)
  if not isinstance(rows, list):
    raise ResultsError(f'{path}: expected a list of rows')
  table = []
  for i, row in enumerate(rows):
    missing = [k for k in ('result', 'ours', 'paper', 'page')
               if not isinstance(row, dict) or k not in row]
    if missing:
      raise ResultsError(f'{path}: row {i} lacks {", ".join(missing)}')
    table.append([row['result'], figure(results, row['ours']), row['paper'],
                  _page_link(row['page'])])
  return (markdown_table(['result', 'ours', 'paper', 'page'], table) + '\n\n'
          'Generated from `results/*.json` by '
          '`.venv/bin/python scripts/results.py`.\n')


def render_text(text, results, root, where):
  """`text` with every block's body regenerated; [keys] of the blocks."""
  keys = []

  def fill(match):
    key = match.group('key')
    keys.append(key)
    body = (render_readme_block(results, root) if key == README_BLOCK else
            render_table_block(results, key))
    return match.group(1) + body + match.group(4)

  try:
    new = BLOCK.sub(fill, text)
  except ResultsError as e:
    raise ResultsError(f'{where}: {e}') from None
  opened = OPEN.findall(text)
  if len(opened) != len(keys):
    unclosed = opened[len(keys)] if len(opened) > len(keys) else '?'
    raise ResultsError(
        f'{where}: block results:{unclosed} has no <!-- /results --> (or '
        'blocks nest)')
  return new, keys


def render(root, check=False, out=None, only=None):
  """Fills (or, with check, compares) every block of the pages (or of those
  in `only`, paths relative to root); returns the exit code."""
  out = out or sys.stdout
  results = load_results(root)
  stale, count = [], 0
  chosen = pages(root)
  if only:
    wanted = {os.path.normpath(os.path.join(root, p)) for p in only}
    unknown = wanted - set(chosen)
    if unknown:
      raise ResultsError(
          f'not README.md or docs/*.md: {", ".join(sorted(unknown))}')
    chosen = [p for p in chosen if p in wanted]
  for path in chosen:
    with open(path, encoding='utf-8') as f:
      text = f.read()
    where = os.path.relpath(path, root)
    new, keys = render_text(text, results, root, where)
    count += len(keys)
    if new == text:
      continue
    old_bodies = [m.group('body') for m in BLOCK.finditer(text)]
    new_bodies = [m.group('body') for m in BLOCK.finditer(new)]
    stale += [f'{where}: results:{key}'
              for key, old, fresh in zip(keys, old_bodies, new_bodies)
              if old != fresh]
    if not check:
      with open(path, 'w', encoding='utf-8') as f:
        f.write(new)
  if check:
    if stale:
      print('blocks that differ from results/*.json (run '
            '`.venv/bin/python scripts/results.py`):', file=out)
      for line in stale:
        print(f'  {line}', file=out)
      return 1
    print(f'{count} blocks match results/*.json', file=out)
  else:
    print(f'{count} blocks rendered, {len(stale)} changed', file=out)
  return 0


# ---------------------------------------------------------------------------
# Recording a CLI's table.


def machine(cpuinfo='/proc/cpuinfo'):
  """{"machine", "isa"} of this CPU: its model name and widest int8 ISA."""
  model, flags = None, set()
  try:
    with open(cpuinfo, encoding='utf-8') as f:
      for line in f:
        key, _, value = line.partition(':')
        key = key.strip()
        if key == 'model name' and model is None:
          model = value.strip()
        elif key == 'flags' and not flags:
          flags = set(value.split())
  except OSError:
    pass
  isa = ('avx512-vnni' if 'avx512_vnni' in flags else
         'avx2' if 'avx2' in flags else 'unknown')
  cores = os.cpu_count()
  name = model or 'unknown CPU'
  return {'machine': f'{cores}-core {name}' if cores else name, 'isa': isa}


def _text(value):
  if isinstance(value, str):
    return value
  if isinstance(value, bool) or value is None:
    return json.dumps(value)
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    return f'{value:.6g}'
  return json.dumps(value, ensure_ascii=False)


def table_from_json(data, columns=None, where='table'):
  """{"columns", "rows"} (cells as strings) of a CLI's JSON output."""
  if isinstance(data, dict) and 'columns' in data and 'rows' in data:
    cols, rows = list(data['columns']), data['rows']
    if not all(isinstance(r, list) and len(r) == len(cols) for r in rows):
      raise ResultsError(f'{where}: every row needs {len(cols)} cells')
    if columns:
      unknown = [c for c in columns if c not in cols]
      if unknown:
        raise ResultsError(f'{where}: no column(s) {", ".join(unknown)}')
      rows = [[r[cols.index(c)] for c in columns] for r in rows]
      cols = list(columns)
    return {'columns': [_text(c) for c in cols],
            'rows': [[_text(c) for c in r] for r in rows]}
  if isinstance(data, dict) and isinstance(data.get('rows'), list):
    data = data['rows']
  if isinstance(data, list) and data and all(isinstance(r, dict)
                                             for r in data):
    keys = []
    for row in data:
      keys += [k for k in row if k not in keys]
    if columns:
      unknown = [c for c in columns if c not in keys]
      if unknown:
        raise ResultsError(f'{where}: no key(s) {", ".join(unknown)}')
      keys = list(columns)
    return {'columns': keys,
            'rows': [[_text(row.get(k, '')) for k in keys] for row in data]}
  raise ResultsError(
      f'{where}: expected {{"columns", "rows"}}, a non-empty list of objects '
      'or {"rows": [objects]}')


def _pairs(values, what):
  pairs = {}
  for value in values or []:
    key, sep, rest = value.partition('=')
    if not sep or not key:
      raise ResultsError(f'--{what} needs ID=VALUE, got {value!r}')
    pairs[key] = rest
  return pairs


def _dump(value, indent=0):
  """JSON with each list of scalars (a row, the columns) on one line."""
  pad = '  ' * indent
  if isinstance(value, dict) and value:
    items = [f'{pad}  {json.dumps(k, ensure_ascii=False)}: '
             f'{_dump(v, indent + 1)}' for k, v in value.items()]
    return '{\n' + ',\n'.join(items) + f'\n{pad}}}'
  if isinstance(value, list) and value and any(
      isinstance(v, (dict, list)) for v in value):
    items = [f'{pad}  {_dump(v, indent + 1)}' for v in value]
    return '[\n' + ',\n'.join(items) + f'\n{pad}]'
  return json.dumps(value, ensure_ascii=False)


def write_results(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.write(_dump(data) + '\n')
  os.replace(tmp, path)


def header_cost(root, name):
  """The "Cost: ... ." sentence of experiments/<name>.sh's header comment
  (its lines joined), or 'unknown' without a script or a sentence."""
  path = os.path.join(root, 'experiments', f'{name}.sh')
  if not os.path.exists(path):
    return 'unknown'
  with open(path, encoding='utf-8') as f:
    comments = []
    for line in f:
      if line.startswith('#!'):
        continue
      if not line.startswith('#'):
        break
      comments.append(line[1:].strip())
  found = re.search(r'Cost: (.+?)\.(?:\s|$)', ' '.join(comments))
  return found.group(1) if found else 'unknown'


def record(root, name, tables, figures=None, captions=None, columns=None,
           command=None, short_command=None, cost=None, today=None,
           this_machine=None):
  """Writes or updates results/<name>.json; returns its path."""
  if not re.fullmatch(r'[\w.-]+', name) or name == README_BLOCK:
    raise ResultsError(f'bad experiment name {name!r}')
  path = os.path.join(_results_dir(root), f'{name}.json')
  data = _load_json(path) if os.path.exists(path) else {
      'experiment': name,
      'command': f'bash experiments/{name}.sh',
      'short_command': f'SHORT=1 bash experiments/{name}.sh',
      'cost': header_cost(root, name),
      'tables': {}, 'figures': {}}
  measured = {'date': (today or datetime.date.today()).isoformat(),
              **(this_machine or machine())}
  if cost is None:
    header = header_cost(root, name)  # The script's header, as it is now.
    cost = None if header == 'unknown' else header
  for key, value in (('command', command), ('short_command', short_command),
                     ('cost', cost)):
    if value is not None:
      data[key] = value
  unknown = set(captions or {}).union(columns or {}) - set(tables)
  if unknown:
    raise ResultsError(
        f'--caption/--columns for table(s) not recorded: '
        f'{", ".join(sorted(unknown))}')
  old = data.get('measured')
  all_tables = data.setdefault('tables', {})
  for table_id, table in all_tables.items():  # Untouched tables keep their date.
    if table_id not in tables and old and 'measured' not in table:
      table['measured'] = old
  for table_id, json_path in tables.items():
    cols = (columns or {}).get(table_id)
    table = table_from_json(_load_json(json_path),
                            cols.split(',') if cols else None, json_path)
    caption = (captions or {}).get(table_id,
                                   all_tables.get(table_id, {}).get('caption',
                                                                    ''))
    all_tables[table_id] = {'caption': caption, **table}
  data['measured'] = measured
  data.setdefault('figures', {}).update(figures or {})
  write_results(path, data)
  return path


# ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
  """argparse whose usage errors are one line (ResultsError, exit 2)."""

  def error(self, message):
    raise ResultsError(message)


def _parser_record():
  p = _Parser(prog=f'{PROG} record')
  p.add_argument('name', help='the experiment: writes results/NAME.json')
  p.add_argument('--table', action='append', required=True,
                 help='ID=PATH.json: a table a CLI wrote')
  p.add_argument('--figure', action='append', help='ID=VALUE')
  p.add_argument('--caption', action='append', help='ID=TEXT')
  p.add_argument('--columns', action='append',
                 help='ID=a,b,c: the keys to keep, in this order')
  p.add_argument('--command')
  p.add_argument('--short_command')
  p.add_argument('--cost')
  p.add_argument('--root', default=ROOT)
  return p


def _parser_render():
  p = _Parser(prog=PROG)
  p.add_argument('--check', action='store_true',
                 help='write nothing; exit 1 if a block differs')
  p.add_argument('--root', default=ROOT)
  p.add_argument('pages', nargs='*',
                 help='only these pages (e.g. README.md docs/ood.md)')
  return p


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  try:
    if argv and argv[0] == 'record':
      args = _parser_record().parse_args(argv[1:])
      path = record(args.root, args.name, _pairs(args.table, 'table'),
                    _pairs(args.figure, 'figure'),
                    _pairs(args.caption, 'caption'),
                    _pairs(args.columns, 'columns'),
                    args.command, args.short_command, args.cost)
      print(f'wrote {os.path.relpath(path)}')
      return 0
    if argv and argv[0] == 'render':
      argv = argv[1:]
    args = _parser_render().parse_args(argv)
    return render(args.root, check=args.check, only=args.pages)
  except ResultsError as e:
    print(f'{PROG}: error: {e}', file=sys.stderr)
    return EXIT_USAGE


if __name__ == '__main__':
  sys.exit(main())
