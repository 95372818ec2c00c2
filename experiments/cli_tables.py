#!/usr/bin/env python3
"""The JSON a CLI wrote, as the table `scripts/results.py record` takes.

The experiments under experiments/ run committed CLIs; most of them write
JSON of their own shape (terraformer-bench's `{"models": [...]}`,
terraformer-eval's summary, terraformer-info's plan) or a Markdown table
(terraformer-export's table.md). This turns one of those into
`{"columns": [...], "rows": [[...]]}` with the cells formatted as the docs
show them, and prints the cells named by --figure as `ID=VALUE` lines (the
experiment passes them on as `record --figure`). Stdlib only.

  cli_tables.py MODE --out=T.json INPUT... [--label=NAME=LABEL ...]
      [--paper=NAME=TEXT ...] [--figure=ID=ROW:COLUMN ...]

An experiment records the table and its figures with
  mapfile -t figures < <(.venv/bin/python experiments/cli_tables.py ...)
  record --table=ID=T.json "${figures[@]/#/--figure=}"
(scripts/experiment_tables.py does the same for terraformer-ood,
terraformer-memory-bench, terraformer-topk-bench and parameter counts.)

MODE and its INPUT:
  speed       terraformer-bench --json (its default table; with --compare_trax
              also Trax's ms/token and ours vs Trax)
  projection  terraformer-bench --project_layers=L --json
  user_path   terraformer-bench --trax_user_path --json
  agreement   terraformer-bench --agreement --json
  xla_ops     terraformer-bench --xla_ops --json
  sweep       terraformer-bench --sweep --json
  markdown    a Markdown table (terraformer-export's table.md)
  rouge       terraformer-eval's eval_<split>_step<N>.json
  plan        LABEL=PATH pairs of terraformer-info --devices=N --json
  compiled    LABEL=PATH pairs of terraformer-info --devices=N --compiled --json

--label renames a row (a model's name in the JSON -> the docs' label);
--paper adds a "paper" column (the paper's figure beside a row); --figure
names a cell ROW:COLUMN, the mean of several rows' cells ROW1|ROW2:COLUMN,
or a difference of two such, `A:COLUMN - B:COLUMN`.
"""
import argparse
import json
import re
import sys

GIB = 2.0 ** 30


class TableError(Exception):
  """A bad input: one line on stderr, exit status 2."""


def _f(value, fmt):
  return '–' if value is None else format(value, fmt)


def _ratio(a, b, fmt='.2f'):
  return None if not a or not b else format(a / b, fmt) + 'x'


SPEED_COLUMNS = ['model', 'ms/token [min-max]', 'ms/block', 'MB/token',
                 'MB/block', 'bound ms', 'x bound', 'speedup', 'per block']


def speed(data, label):
  """terraformer-bench's default table (one row per model); with
  --compare_trax also Trax's ms/token and ours vs Trax. Besides the default
  columns, `ms/token` (the median alone) can be chosen with --columns."""
  models = data['models']
  trax = any('trax' in m for m in models)
  columns = SPEED_COLUMNS + (['Trax ms/token', 'ours vs Trax'] if trax else [])
  rows = []
  for m in models:
    block = m.get('bytes_per_block')
    per_block = m.get('speedup_per_block')
    cells = {
        'model': label(m['name']),
        'ms/token': f"{m['ms_per_token']:.1f}",
        'ms/token [min-max]': f"{m['ms_per_token']:.1f} [{m['ms_per_token_min']:.1f}-"
                              f"{m['ms_per_token_max']:.1f}]",
        'ms/block': _f(m.get('ms_per_block'), '.2f'),
        'MB/token': f"{m['bytes_per_token'] / 1e6:.1f}",
        'MB/block': _f(None if block is None else block / 1e6, '.2f'),
        'bound ms': _f(m.get('bound_ms_per_token'), '.1f'),
        'x bound': _f(m.get('achieved_over_bound'), '.2f'),
        'speedup': f"{m['speedup']:.2f}x",
        'per block': _f(per_block, '.2f') + ('x' if per_block else ''),
        'Trax ms/token': _f(m['trax']['ms_per_token'], '.1f')
                         if 'trax' in m else '–',
        'ours vs Trax': _ratio(m['trax']['ms_per_token'], m['ms_per_token'])
                        if 'trax' in m else '–'}
    rows.append(cells)
  return columns, rows


def projection(data, label):
  """terraformer-bench --project_layers: measured, projected, paper."""
  models = data['models']
  first = models[0]
  columns = ['model', 'measured ms/token (1 block)', 'ms/block',
             'ms no blocks', 'projected ms/token', 'projected MB/token',
             'x bound', 'speedup (time)', 'speedup (bytes)', 'paper s/token',
             'paper speedup']
  rows = []
  for m in models:
    bound = m.get('projected_bound_ms_per_token')
    rows.append([
        label(m['name']), f"{m['ms_per_token']:.1f}",
        f"{m['ms_per_block']:.2f}", f"{m['ms_no_blocks']:.1f}",
        f"{m['projected_ms_per_token']:.1f}",
        f"{m['projected_bytes_per_token'] / 1e6:.0f}",
        _f(None if not bound else m['projected_ms_per_token'] / bound, '.2f'),
        f"{m['projected_speedup']:.2f}x",
        _ratio(first['projected_bytes_per_token'],
               m['projected_bytes_per_token']),
        _f(m.get('paper_seconds'), '.3f'),
        _ratio(first.get('paper_seconds'), m.get('paper_seconds')) or '–'])
  return columns, rows


def user_path(data, label):
  columns = ['model', 'ours ms/token', 'Trax ms/token', 'Trax / ours',
             'ours 1st call s', 'Trax 1st call s', 'same tokens']
  rows = [[label(m['name']), f"{m['ours_ms_per_token']:.1f}",
           f"{m['trax_ms_per_token']:.1f}", f"{m['trax_over_ours']:.1f}x",
           f"{m['ours_first_call_s']:.1f}", f"{m['trax_first_call_s']:.1f}",
           'yes' if m['same_tokens'] else 'NO'] for m in data['models']]
  return columns, rows


def agreement(data, label):
  columns = ['decode path', 'max |delta logit| vs the first',
             f'greedy agreement ({data[0]["tokens"]} tokens)']
  rows = [[label(r['name']), f"{r['max_abs_logit_delta']:.3g}",
           f"{r['greedy_agreement']:.3f}"] for r in data]
  return columns, rows


def xla_ops(data, label):
  columns = ['model', 'XLA ops/block', 'of which']
  rows = [[label(r['name']), f"{r['ops_per_block']:g}",
           ', '.join(f'{k} {v:g}' for k, v in sorted(
               r['ops_per_block_by_kind'].items(), key=lambda kv: -kv[1]))]
          for r in data]
  return columns, rows


def sweep(data, label):
  """terraformer-bench --sweep: ms/token of each model per d_model, and the
  speedup of the others over the first."""
  names = data['names']
  columns = ['d_model'] + [f'{label(n)} ms/token' for n in names]
  for n in names[1:]:
    prefix = '' if len(names) == 2 else f'{label(n)} '
    columns += [f'{prefix}speedup', f'{prefix}per block']
  rows = []
  for row in data['rows']:
    cells = [str(row['d_model'])] + [
        f"{row['models'][n]['ms_per_token']:.2f}" for n in names]
    for n in names[1:]:
      r = row['models'][n]
      cells += [f"{r['speedup']:.2f}x",
                _f(r.get('speedup_per_block'), '.2f') + (
                    'x' if r.get('speedup_per_block') else '')]
    rows.append(cells)
  return columns, rows


def markdown(text, label):
  """A Markdown table: header, separator, rows."""
  lines = [l.strip() for l in text.splitlines() if l.strip().startswith('|')]
  if len(lines) < 2:
    raise TableError('no Markdown table')
  split = lambda l: [c.strip() for c in l.strip('|').split('|')]
  columns = split(lines[0])
  rows = [split(l) for l in lines[2:]]
  for row in rows:
    row[0] = label(row[0])
  return columns, rows


ROUGE = (('rouge1', 'ROUGE-1'), ('rouge2', 'ROUGE-2'), ('rougeL', 'ROUGE-L'))


def rouge(data, label):
  """terraformer-eval's summary: the model beside its extractive yardsticks
  (lead-3, lead-k matched to the abstract's length, 3 random sentences)."""
  pct = lambda scores: [f'{100 * scores[k]:.2f}' for k, _ in ROUGE]
  base = data.get('baselines') or {}
  k, seed = data.get('baseline_k'), data.get('baseline_seed')
  rows = [[label('model')] + pct(data)]
  for key, name in ((f'lead_{k}', f'lead-{k}'),
                    ('lead_matched', 'lead-k matched (mean k {:.1f})'),
                    (f'random_{k}', f'random {k} (seed {seed})')):
    if key in base:
      rows.append([label(name.format(base[key].get('sentences', 0)))] +
                  pct(base[key]))
  return ['F1 (%)'] + [name for _, name in ROUGE], rows


def _pairs(inputs):
  pairs = []
  for item in inputs:
    name, sep, path = item.partition('=')
    if not sep:
      raise TableError(f'expected LABEL=PATH, got {item!r}')
    pairs.append((name, _load(path)))
  return pairs


def plan(pairs, label):
  columns = ['config', 'devices', 'weights', 'Adam slots',
             'activations (est.)', 'total']
  rows = []
  for name, data in pairs:
    p = data['per_device']
    rows.append([label(name), str(p['devices'])] + [
        f'{p[k] / GIB:.3f}' for k in (
            'weights_bytes_per_device', 'slots_bytes_per_device',
            'activation_bytes_per_device', 'total_bytes_per_device')])
  return columns, rows


def compiled(pairs, label):
  columns = ['config', 'devices', 'arguments (weights + slots + batch)',
             'temporaries', 'peak']
  rows = []
  for name, data in pairs:
    c = data['compiled_per_device']
    rows.append([label(name), str(data['per_device']['devices'])] + [
        f'{c[k] / GIB:.3f} GiB' for k in ('arguments', 'temporaries',
                                           'peak')])
  return columns, rows


MODES = {'speed': speed, 'projection': projection, 'user_path': user_path,
         'agreement': agreement, 'xla_ops': xla_ops, 'sweep': sweep,
         'markdown': markdown, 'rouge': rouge, 'plan': plan,
         'compiled': compiled}


def _load(path):
  try:
    with open(path, encoding='utf-8') as f:
      return f.read() if path.endswith('.md') else json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise TableError(f'{path}: {e}') from None


def _mapping(items, what):
  out = {}
  for item in items or []:
    key, sep, value = item.partition('=')
    if not sep:
      raise TableError(f'--{what} needs NAME=VALUE, got {item!r}')
    out[key] = value
  return out


def _cells(row, columns):
  """A row (a dict by column name) as a list in `columns` order."""
  missing = [c for c in columns if c not in row]
  if missing:
    raise TableError(f'no column(s) {", ".join(missing)} (columns: '
                     f'{", ".join(row)})')
  return [row[c] for c in columns]


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


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('mode', choices=sorted(MODES))
  parser.add_argument('--out', required=True)
  parser.add_argument('inputs', nargs='+')
  parser.add_argument('--label', action='append')
  parser.add_argument('--paper', action='append')
  parser.add_argument('--figure', action='append')
  parser.add_argument('--columns', help='comma-separated: only these '
                      'columns, in this order (speed: also ms/token, the '
                      'median alone)')
  args = parser.parse_args(argv)
  try:
    labels = _mapping(args.label, 'label')
    papers = _mapping(args.paper, 'paper')
    figures = _mapping(args.figure, 'figure')
    label = lambda name: labels.get(name, name)
    if args.mode in ('plan', 'compiled'):
      data = _pairs(args.inputs)
    elif len(args.inputs) != 1:
      raise TableError(f'{args.mode} takes one input')
    else:
      data = _load(args.inputs[0])
    columns, rows = MODES[args.mode](data, label)
    rows = [row if isinstance(row, dict) else dict(zip(columns, row))
            for row in rows]
    if args.columns:
      columns = args.columns.split(',')
    rows = [_cells(row, columns) for row in rows]
    if papers:
      by_label = {labels.get(k, k): v for k, v in papers.items()}
      columns = columns + ['paper']
      rows = [row + [by_label.get(row[0], '–')] for row in rows]
    values = {fid: figure(columns, rows, spec)
              for fid, spec in figures.items()}
  except TableError as e:
    print(f'cli_tables.py: error: {args.mode}: {e}', file=sys.stderr)
    return 2
  except (KeyError, TypeError, IndexError) as e:
    print(f'cli_tables.py: error: {args.mode}: {", ".join(args.inputs)} is '
          f'not what {args.mode} reads ({type(e).__name__}: {e})',
          file=sys.stderr)
    return 2
  with open(args.out, 'w', encoding='utf-8') as f:
    json.dump({'columns': columns, 'rows': rows}, f, indent=1,
              ensure_ascii=False)
  for fid, value in values.items():
    print(f'{fid}={value}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
