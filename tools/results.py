#!/usr/bin/env python3
"""The results tables of README.md and docs/*.md, generated from results/*.json.

Each headline figure lives once, in `results/<name>.json` (written by the
experiment that measured it, `experiments/<name>.sh`); the pages carry
generated blocks whose bodies only this script writes:

  <!-- results:<name>/<table_id> -->   a table of results/<name>.json
  <!-- results:readme -->               README's table, rows from results/readme.json
  <!-- /results -->                     closes either

Usage (stdlib only, any Python 3):

  tools/results.py [render] [--root DIR] [PAGE ...]   fill every block (writes)
  tools/results.py --check [--root DIR] [PAGE ...]    exit 1 listing the blocks that differ
  tools/results.py record NAME --table ID=PATH.json [--table ...]
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
   "provenance": PROVENANCE,
   "tables": {ID: {"caption", "columns", "rows", "figures": [figure IDs]
                   [, "measured", "provenance", "command", "cost",
                      "history"]}},
   "figures": {ID: "2.85x"}}
A table's own "measured" / "provenance" / "command" / "cost" override the
file's (a table kept from an earlier run keeps its own). Each figure belongs
to the one table that lists it (a rerun of that table replaces its figures).
PROVENANCE says where a table's numbers come from:
  {"kind": "recorded", "commit", "command", "started", "wall_s"}
      written by its script's run (`record`; experiments/lib.sh passes the
      commit the run started at, "+dirty" with uncommitted changes, the
      command and the start time); files recorded before provenance was kept
      name the commit that committed them ("committed_in") instead;
  {"kind": "transcribed", "from"}
      typed in from an earlier run's output: not written by its script.
A table with "history": {"figures": [IDs], "summaries": {ID: figure ID}}
is the file's runs: `record` appends a row (date, commit, machine, ISA, the
figures) at every run and sets each summary figure to the median [min-max]
over the runs on this run's ISA (what the README shows of a speed).
`--check` also fails on a table without provenance, a figure no table lists
and a README row whose figure comes from a transcribed table.

results/readme.json: a list of rows
  {"result": ..., "ours": "<name>/<figure_id>", "paper": ..., "page": "docs/x.md#anchor"}
"""
import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys
import time

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


def load_json(path):
  """The JSON of the file `path`; a missing file or one that is not JSON is
  a ResultsError (one line)."""
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
    data = load_json(path)
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


def provenance_of(data, table):
  """The table's provenance: its own, else its file's (None without)."""
  return table.get('provenance') or data.get('provenance')


def _measured_line(data, table):
  """The line under a table: where its numbers come from, when, on what."""
  measured = table.get('measured') or data.get('measured') or {}
  command = table.get('command') or data.get('command')
  cost = table.get('cost') or data.get('cost')
  provenance = provenance_of(data, table) or {}
  if table.get('history'):
    return (f'Recorded by `{command}`, a row per run: its date, commit (the '
            'commit that committed the file, for runs recorded before '
            'provenance was kept), machine and ISA; the summary figures are '
            'the median [min-max] over the runs on one ISA.')
  isa = measured.get('isa') or 'unknown'
  isa = f'({isa})' if isa != 'unknown' else '(ISA unknown)'
  date, machine = measured.get('date'), measured.get('machine')
  kind = provenance.get('kind')
  if kind == 'recorded':
    parts = ['Recorded'] + ([f'by `{command}`'] if command else [])
    commit = provenance.get('commit')
    if commit and commit != 'unknown':
      dirty = '+dirty' if commit.endswith('+dirty') else ''
      parts.append(f'at commit {commit[:7]}{dirty}')
    where = ([f'on {date}'] if date else []) + (
        [f'a {machine} {isa}'] if machine else [isa])
    parts.append(', '.join(where))
    wall = provenance.get('wall_s')
    if wall is not None:
      parts[-1] += ','
      parts.append(f'in {wall / 60:.0f} min' if wall >= 60 else
                   f'in {wall:.0f} s')
    if provenance.get('committed_in'):
      parts[-1] += ';'
      parts.append(f'committed in {provenance["committed_in"][:7]}')
  else:
    parts = ['Measured'] + ([date] if date else []) + (
        [f'on a {machine}'] if machine else []) + [isa]
    if kind == 'transcribed':
      parts = [f'Transcribed from {provenance.get("from", "an earlier run")}'
               ', not written by its script' +
               (f' `{command}`' if command else '') + ':', 'measured'] + \
          parts[1:]
    elif command:
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
  rows = load_json(path)
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
          '`.venv/bin/python tools/results.py`.\n')


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
    readme = os.path.join(_results_dir(root), 'readme.json')
    rows = load_json(readme) if os.path.exists(readme) else []
    problems = provenance_problems(results, rows if isinstance(rows, list)
                                   else [])
    if problems:
      print('results files without provenance or with stray figures:',
            file=out)
      for line in problems:
        print(f'  {line}', file=out)
    if stale:
      print('blocks that differ from results/*.json (run '
            '`.venv/bin/python tools/results.py`):', file=out)
      for line in stale:
        print(f'  {line}', file=out)
      return 1
    if problems:
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


def key_values(values, what):
  """{KEY: VALUE} of the `--what KEY=VALUE` options (split at the first
  `=`)."""
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


def _git_commit(root):
  """HEAD's hash, "+dirty" with uncommitted changes to tracked files."""
  def git(*args):
    return subprocess.run(['git', '-C', root, *args], capture_output=True,
                          text=True, check=True).stdout.strip()
  try:
    commit = git('rev-parse', 'HEAD')
    dirty = git('status', '--porcelain', '--untracked-files=no')
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return commit + ('+dirty' if dirty else '')


def run_provenance(root, env=None, now=None):
  """The provenance of the run recording now: the commit, command and start
  time experiments/lib.sh exported when the run started (without them, as
  when `record` is called by hand: HEAD now, no wall time)."""
  env = os.environ if env is None else env
  provenance = {'kind': 'recorded',
                'commit': env.get('TERRAFORMER_RUN_COMMIT') or
                          _git_commit(root),
                'command': env.get('TERRAFORMER_RUN_COMMAND')}
  started = env.get('TERRAFORMER_RUN_STARTED')
  if started:
    started = int(started)
    provenance['started'] = datetime.datetime.fromtimestamp(
        started, datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
    provenance['wall_s'] = round((now or time.time()) - started)
  return provenance


def _figures_by_table(figures, tables):
  """{table_id: {figure_id: value}} of `--figure` keys `TABLE:ID` (or `ID`,
  the one table recorded)."""
  by_table = {table_id: {} for table_id in tables}
  for key, value in (figures or {}).items():
    table_id, sep, figure_id = key.rpartition(':')
    if not sep:
      if len(tables) != 1:
        raise ResultsError(
            f'--figure {key}=...: name its table (TABLE:{key}=...) when '
            'several tables are recorded')
      table_id = next(iter(tables))
    if table_id not in by_table:
      raise ResultsError(f'--figure {key}=...: table {table_id!r} is not '
                         'recorded')
    by_table[table_id][figure_id] = value
  return by_table


def record(root, name, tables, figures=None, captions=None, columns=None,
           command=None, short_command=None, cost=None, today=None,
           this_machine=None, provenance=None):
  """Writes or updates results/<name>.json; returns its path."""
  if not re.fullmatch(r'[\w.-]+', name) or name == README_BLOCK:
    raise ResultsError(f'bad experiment name {name!r}')
  path = os.path.join(_results_dir(root), f'{name}.json')
  data = load_json(path) if os.path.exists(path) else {
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
  figures = _figures_by_table(figures, tables)
  provenance = dict(provenance or run_provenance(root))
  if not provenance.get('command'):
    provenance['command'] = data.get('command')
  old = {'measured': data.get('measured'),
         'provenance': data.get('provenance')}
  all_tables = data.setdefault('tables', {})
  all_figures = data.setdefault('figures', {})
  for table_id, table in all_tables.items():
    if table_id in tables:  # Rerun: its old figures go with it.
      for figure_id in table.get('figures', []):
        all_figures.pop(figure_id, None)
      continue
    for key, value in old.items():  # Untouched tables keep theirs.
      if value and key not in table and 'history' not in table:
        table[key] = value
  for table_id, json_path in tables.items():
    cols = (columns or {}).get(table_id)
    table = table_from_json(load_json(json_path),
                            cols.split(',') if cols else None, json_path)
    caption = (captions or {}).get(table_id,
                                   all_tables.get(table_id, {}).get('caption',
                                                                    ''))
    all_tables[table_id] = {'caption': caption, **table,
                            'figures': list(figures[table_id])}
    all_figures.update(figures[table_id])
  data['measured'] = measured
  data['provenance'] = provenance
  recorded = {}
  for values in figures.values():
    recorded.update(values)
  add_history_row(data, recorded, measured, provenance)
  write_results(path, data)
  return path


HISTORY_COLUMNS = ['date', 'commit', 'machine', 'ISA']


def _number(value):
  """(number, text before it, decimals, text after it) of a figure like
  '16.09x' or '18.5 [17.9-22.1]' (its first number), or None."""
  found = re.search(r'[-+]?\d+(?:\.(\d+))?', value or '')
  if not found:
    return None
  return (float(found.group()), value[:found.start()],
          len(found.group(1) or ''), value[found.end():].split(' ')[0])


def history_summary(table, figure_id, isa):
  """'median [min-max] (N runs)' of `figure_id`'s column in a history
  table, over its rows measured on `isa`; None without such a row."""
  column = table['columns'].index(figure_id)
  isa_column = table['columns'].index('ISA')
  numbers = [_number(row[column]) for row in table['rows']
             if row[isa_column] == isa and row[column] not in ('', '–')]
  numbers = [n for n in numbers if n]
  if not numbers:
    return None
  values = sorted(n[0] for n in numbers)
  half = len(values) // 2
  median = values[half] if len(values) % 2 else (values[half - 1] +
                                                  values[half]) / 2
  _, before, decimals, after = numbers[0]
  text = lambda v: f'{before}{v:.{decimals}f}{after}'  # pylint: disable=unnecessary-lambda-assignment
  runs = 'run' if len(values) == 1 else 'runs'
  return (f'{text(median)} [{text(values[0])}-{text(values[-1])}] '
          f'({len(values)} {runs})')


def add_history_row(data, figures, measured, provenance):
  """Appends this run's figures to each table of `data` that keeps a
  history ("history": {"figures": [IDs], "summaries": {ID: figure ID}}) and
  refreshes its summary figures (median [min-max] over the runs on this
  run's ISA)."""
  for table in data.get('tables', {}).values():
    history = table.get('history')
    if not history or not any(f in figures for f in history['figures']):
      continue
    commit = provenance.get('commit') or provenance.get('committed_in') or ''
    table['rows'].append(
        [measured.get('date', ''), commit[:7] + (
            '+dirty' if commit.endswith('+dirty') else ''),
         measured.get('machine', ''), measured.get('isa', 'unknown')] +
        [figures.get(f, '–') for f in history['figures']])
    for summary_id, figure_id in history.get('summaries', {}).items():
      value = history_summary(table, figure_id, measured.get('isa'))
      if value:
        data.setdefault('figures', {})[summary_id] = value
        if summary_id not in table.setdefault('figures', []):
          table['figures'].append(summary_id)


def provenance_problems(results, readme_rows=()):
  """What `--check` finds wrong besides stale blocks: tables without
  provenance, figures that no table (or two) lists, README rows whose figure
  comes from a transcribed table. A list of one-line problems."""
  problems, owner = [], {}
  for name, data in sorted(results.items()):
    where = f'results/{name}.json'
    listed = {}
    for table_id, table in data.get('tables', {}).items():
      provenance = provenance_of(data, table) or {}
      kind = provenance.get('kind')
      if kind == 'recorded':
        if not provenance.get('command') or not (
            provenance.get('commit') or provenance.get('committed_in')):
          problems.append(f'{where}: table {table_id}: recorded without its '
                          'command and commit')
      elif kind == 'transcribed':
        if not provenance.get('from'):
          problems.append(f'{where}: table {table_id}: transcribed from '
                          'nowhere ("from")')
      else:
        problems.append(f'{where}: table {table_id} has no provenance '
                        '(recorded or transcribed)')
      for figure_id in table.get('figures', []):
        if figure_id in listed:
          problems.append(f'{where}: figure {figure_id} is listed by tables '
                          f'{listed[figure_id]} and {table_id}')
        listed[figure_id] = table_id
        if figure_id not in data.get('figures', {}):
          problems.append(f'{where}: table {table_id} lists figure '
                          f'{figure_id}, which the file lacks')
    for figure_id in data.get('figures', {}):
      if figure_id not in listed:
        problems.append(f'{where}: figure {figure_id} is in no table '
                        '(a stale figure?)')
      else:
        owner[f'{name}/{figure_id}'] = (data, data['tables'][listed[figure_id]])
  for row in readme_rows:
    ref = row.get('ours', '') if isinstance(row, dict) else ''
    if ref in owner:
      kind = (provenance_of(*owner[ref]) or {}).get('kind')
      if kind != 'recorded':
        problems.append(f'README row {row.get("result", ref)!r}: its figure '
                        f'{ref} comes from a {kind or "provenance-less"} '
                        'table; the README shows recorded figures only')
  return problems


# ---------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
  """argparse whose usage errors are one line (ResultsError, exit 2)."""

  def error(self, message):
    raise ResultsError(message)


def _parser_record():
  p = OneLineParser(prog=f'{PROG} record')
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
  p = OneLineParser(prog=PROG)
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
      path = record(args.root, args.name, key_values(args.table, 'table'),
                    key_values(args.figure, 'figure'),
                    key_values(args.caption, 'caption'),
                    key_values(args.columns, 'columns'),
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
