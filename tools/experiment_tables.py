#!/usr/bin/env python3
"""The JSON a committed CLI wrote, as the results table of an experiment.

The experiments (experiments/*.sh) run committed CLIs; most of these write
JSON of their own shape (terraformer-bench's `{"models": [...]}`,
terraformer-ood's run folders, terraformer-eval's summary, ...) or a Markdown
table (terraformer-export's table.md). This turns one such output into
`{"columns": [...], "rows": [[...]]}`, the cells formatted as the docs show
them: the table `tools/results.py record NAME --table ID=T.json` takes.

  experiment_tables.py MODE --out=T.json INPUT... [--label=NAME=TEXT ...]
      [--paper=NAME=TEXT ...] [--columns=A,B,...] [--figure=ID=SPEC ...]
      [--figures=F.txt] [--k=K]

writes T.json, prints it as a Markdown table, and writes the cells that
--figure names to F.txt as ID=VALUE lines (for `record --figure`).
experiments/lib.sh's `tabulate MODE ID INPUT...` is how an experiment calls
it (T.json = OUT/ID.json), and its `record` passes every table and figure on.

MODE, its INPUT and what it reads: `experiment_tables.py --help` (MODES
below). An INPUT `LABEL=PATH` names a row; it splits at its last `=`, so a
label may hold one (`sparse_ff.gin (N=64)`). --label renames a row (a model's
name in the JSON -> the docs' label; for `lengths`, a model's column);
--paper adds a "paper" column (the paper's figure beside a row, by the
model's name); --columns keeps these columns in this order; --figure SPEC is
a cell ROW:COLUMN (ROW by its first cell), the mean of several rows' cells
ROW1|ROW2:COLUMN, or a difference of two such, `A:COLUMN - B:COLUMN`.

It lives in tools/, beside results.py, whose JSON reading, Markdown
tables and one-line errors it uses: the two are the stdlib-only path from a
CLI's output to the committed results files. A mistake (a missing file, a run
without its result, JSON of another shape) is one line on stderr and exit
status 2.
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
GIB = 2.0 ** 30
MIB = 2 ** 20
MISSING = '–'
OOD_RESULT = 'ood_result.json'  # terraformer.evaluation.ood.RESULT_FILE
TOPK_LABELS = {'sh': 'SH', 'sh_unsorted': 'unsorted', 'sh_plain': 'plain',
               'goyal': 'Goyal', 'hard': 'hard top-k'}

TableError = results.ResultsError  # A user's mistake: one line, exit 2.
# results.py's own reading, KEY=VALUE options and argparse of one-line errors.
load_json = results._load_json  # pylint: disable=protected-access
key_values = results._pairs  # pylint: disable=protected-access
OneLineParser = results._Parser  # pylint: disable=protected-access


def _f(value, fmt):
  return MISSING if value is None else format(value, fmt)


def _ratio(a, b, fmt='.2f'):
  return None if not a or not b else format(a / b, fmt) + 'x'


def _joined(values):
  return ' / '.join(values)


# ---------------------------------------------------------------------------
# terraformer-bench --json


SPEED_COLUMNS = ['model', 'ms/token [min-max]', 'ms/block', 'MB/token',
                 'MB/block', 'bound ms', 'x bound', 'speedup', 'per block']
# Speedups over the dense model of the same decode options, measured and at
# its bound: in the JSON of terraformer-bench runs since they were added.
DENSE_COLUMNS = ['vs dense', 'vs dense bound']


def _dense_cells(m, prefix=''):
  return {'vs dense': _x(m.get(f'{prefix}speedup_vs_dense')),
          'vs dense bound': _x(m.get(f'{prefix}speedup_vs_dense_bound'))}


def _x(value):
  return MISSING if value is None else f'{value:.2f}x'


def speed(data, opts):
  """terraformer-bench's default table (one row per model); with
  --compare_trax also Trax's ms/token and ours vs Trax; with a JSON that
  has them, the speedups over the dense model of the same decode options
  (DENSE_COLUMNS). Besides the default columns, `ms/token` (the median
  alone) and `GB/s` (the bandwidth of the model's bound: measured between
  its rounds of repeats, or the run's) can be chosen with --columns."""
  models = data['models']
  trax = any('trax' in m for m in models)
  dense = any('speedup_vs_dense' in m for m in models)
  columns = (SPEED_COLUMNS + (DENSE_COLUMNS if dense else []) +
             (['Trax ms/token', 'ours vs Trax'] if trax else []))
  rows = []
  for m in models:
    block = m.get('bytes_per_block')
    per_block = m.get('speedup_per_block')
    rows.append({
        'model': opts.label(m['name']),
        'ms/token': f"{m['ms_per_token']:.1f}",
        'ms/token [min-max]': f"{m['ms_per_token']:.1f} [{m['ms_per_token_min']:.1f}-"
                              f"{m['ms_per_token_max']:.1f}]",
        'ms/block': _f(m.get('ms_per_block'), '.2f'),
        'MB/token': f"{m['bytes_per_token'] / 1e6:.1f}",
        'MB/block': _f(None if block is None else block / 1e6, '.2f'),
        'bound ms': _f(m.get('bound_ms_per_token'), '.1f'),
        'GB/s': _f(m.get('bandwidth_gbps'), '.1f'),
        'x bound': _f(m.get('achieved_over_bound'), '.2f'),
        'speedup': f"{m['speedup']:.2f}x",
        'per block': _f(per_block, '.2f') + ('x' if per_block else ''),
        'Trax ms/token': _f(m['trax']['ms_per_token'], '.1f')
                         if 'trax' in m else MISSING,
        'ours vs Trax': _ratio(m['trax']['ms_per_token'], m['ms_per_token'])
                        if 'trax' in m else MISSING, **_dense_cells(m)})
  return columns, rows


MEMORY_COLUMNS = ['model', 'int8 matrices (decoder, output layer)',
                  'float32 read per step', 'float32 under tl.Cache (encoder '
                  'block shared by 6, embedding, cross-attention K/V)',
                  'caches', 'total held']


def memory(data, opts):
  """What each model of a terraformer-bench run holds (GiB), from its
  `memory_by_kind` (bytes by 'LAYER DTYPE[ (under tl.Cache)]' and 'state
  (caches)'): stored int8 / bf16 matrices, float32 the step reads, what
  layers under tl.Cache hold (run on the first call only), the caches."""
  rows = []
  for m in data['models']:
    kinds = m.get('memory_by_kind')
    if not kinds:
      raise TableError(f"model {m['name']!r} has no memory_by_kind")
    parts = collections.Counter()
    for kind, n_bytes in kinds.items():
      if kind == 'state (caches)':
        parts['caches'] += n_bytes
      elif kind.endswith('(under tl.Cache)'):
        parts['cached'] += n_bytes
      elif ' float32' in kind:
        parts['float32'] += n_bytes
      else:
        parts['stored'] += n_bytes
    rows.append([opts.label(m['name'])] + [
        f'{parts[p] / GIB:.2f}' for p in ('stored', 'float32', 'cached',
                                          'caches')] +
                [f'{sum(kinds.values()) / GIB:.2f}'])
  return MEMORY_COLUMNS, rows


def speeds(pairs, opts):
  """One row per terraformer-bench --json run, labelled LABEL (LABEL=PATH;
  one model per run): the same model timed under other bindings or input
  lengths, which one run cannot vary. The columns are `speed`'s."""
  columns, rows = None, []
  for label, data in pairs:
    if len(data['models']) != 1:
      raise TableError(f'{label}: {len(data["models"])} models in the run; '
                       'takes runs of one model')
    columns, (row,) = speed(data, Options({data['models'][0]['name']: label}))
    rows.append(row)
  return columns, rows


def projection(data, opts):
  """terraformer-bench --project_layers: measured, projected, paper (and,
  with a JSON that has them, the projected speedups over the dense model of
  the same decode options, DENSE_COLUMNS)."""
  models = data['models']
  first = models[0]
  dense = any('projected_speedup_vs_dense' in m for m in models)
  columns = ['model', 'measured ms/token (1 block)', 'ms/block',
             'ms no blocks', 'projected ms/token', 'projected MB/token',
             'x bound', 'speedup (time)', 'speedup (bytes)', 'paper s/token',
             'paper speedup'] + (DENSE_COLUMNS if dense else [])
  rows = []
  for m in models:
    bound = m.get('projected_bound_ms_per_token')
    rows.append([
        opts.label(m['name']), f"{m['ms_per_token']:.1f}",
        f"{m['ms_per_block']:.2f}", f"{m['ms_no_blocks']:.1f}",
        f"{m['projected_ms_per_token']:.1f}",
        f"{m['projected_bytes_per_token'] / 1e6:.0f}",
        _f(None if not bound else m['projected_ms_per_token'] / bound, '.2f'),
        f"{m['projected_speedup']:.2f}x",
        _ratio(first['projected_bytes_per_token'],
               m['projected_bytes_per_token']),
        _f(m.get('paper_seconds'), '.3f'),
        _ratio(first.get('paper_seconds'), m.get('paper_seconds')) or MISSING]
        + (list(_dense_cells(m, 'projected_').values()) if dense else []))
  return columns, rows


def user_path(data, opts):
  """terraformer-bench --trax_user_path: whole calls, ours and Trax's."""
  columns = ['model', 'ours ms/token', 'Trax ms/token', 'Trax / ours',
             'ours 1st call s', 'Trax 1st call s', 'same tokens']
  rows = [[opts.label(m['name']), f"{m['ours_ms_per_token']:.1f}",
           f"{m['trax_ms_per_token']:.1f}", f"{m['trax_over_ours']:.1f}x",
           f"{m['ours_first_call_s']:.1f}", f"{m['trax_first_call_s']:.1f}",
           'yes' if m['same_tokens'] else 'NO'] for m in data['models']]
  return columns, rows


def agreement(data, opts):
  """terraformer-bench --agreement: logits and argmax vs the first path."""
  columns = ['decode path', 'max |delta logit| vs the first',
             f'greedy agreement ({data[0]["tokens"]} tokens)']
  rows = [[opts.label(r['name']), f"{r['max_abs_logit_delta']:.3g}",
           f"{r['greedy_agreement']:.3f}"] for r in data]
  return columns, rows


def xla_ops(data, opts):
  """terraformer-bench --xla_ops: operations per decoder block by kind."""
  columns = ['model', 'XLA ops/block', 'of which']
  rows = [[opts.label(r['name']), f"{r['ops_per_block']:g}",
           ', '.join(f'{k} {v:g}' for k, v in sorted(
               r['ops_per_block_by_kind'].items(), key=lambda kv: -kv[1]))]
          for r in data]
  return columns, rows


def kernel_layers(data, opts):
  """python -m terraformer.benchmarks.kernels --json: a row per layer
  (--label names it), the median ms of each variant with its x bound, the
  bytes each reads, and the last variant against the first (XLA)."""
  variants = list(dict.fromkeys(r['variant'] for r in data['rows']))
  cases = list(dict.fromkeys(r['case'] for r in data['rows']))
  cell = {(r['case'], r['variant']): r for r in data['rows']}
  columns = (['layer'] + [f'{v} ms (x bound)' for v in variants]
             + [f'MB read ({" / ".join(variants)})',
                f'{variants[-1]} vs {variants[0]}'])
  rows = []
  for case in cases:
    got = [cell[case, v] for v in variants]
    rows.append([opts.label(case)]
                + [f"{r['median_ms']:.2f} ({r['x_bound']:.2f})" for r in got]
                + [' / '.join(f"{r['bytes'] / 1e6:.1f}" for r in got),
                   f"{got[-1]['vs_xla']:.2f}x"])
  return columns, rows


# Most operands and results a kernel call's cell lists (a sparse QKV
# attention's 19 and 4); a longer list (a Terraformer block's 60 and 9)
# shows its first two and how many there are.
_MAX_LISTED = {'operands': 24, 'results': 4}


def _shapes(text, what):
  """Comma-separated shapes without layouts or HLO comments; of a list
  longer than _MAX_LISTED[what], the first two, then '… N what'."""
  text = re.sub(r'/\*.*?\*/', '', re.sub(r'\{[\d,]*\}', '', text))
  shapes = [s.strip() for s in text.split(',') if s.strip()] if '[' in text else []
  # Shapes hold commas: rejoin the pieces of each one.
  joined, depth = [], 0
  for piece in shapes:
    if depth:
      joined[-1] += ',' + piece
    else:
      joined.append(piece)
    depth += piece.count('[') - piece.count(']')
  if len(joined) <= _MAX_LISTED[what]:
    return ', '.join(joined)
  return ', '.join(joined[:2]) + f', … {len(joined)} {what}'


def _operation(group):
  """A `by_operation` group as a cell: 'tf_q8_matmul (operand shapes) ->
  output shape' (a tuple of them for several outputs) for kernel calls
  (layouts dropped), else the kind."""
  m = re.match(r'custom-call (\([^()]*\)|\S+) (\S+)(?: <- (.*))?$', group)
  if not m:
    return group
  out, target, operands = m.groups()
  if out.startswith('('):
    out = f'({_shapes(out[1:-1], "results")})'
  else:
    out = _shapes(out, 'results')
  return f'{target} ({_shapes(operands or "", "operands")}) -> {out}'


def profile(data, opts):
  """terraformer-bench --profile_dir --json: per model, its step's wall
  time (and the part with an operation running), then the operations that
  took the most time per step (kernel calls by HLO line, the rest by kind),
  --k of them (default 6), and the others together."""
  top = opts.k or 6
  columns = ['model', 'per step', 'calls', 'ms']
  rows = []
  for r in data:
    s = r['summary']
    rows.append([opts.label(r['name']), 'wall (an operation running)',
                 f"{s['ops_per_step']:.0f}",
                 f"{s['wall_ms_per_step']:.2f} ({s['busy_ms_per_step']:.2f})"])
    groups = s['by_operation']
    for group, ms, n in groups[:top]:
      rows.append(['', _operation(group), f'{n:g}', f'{ms:.2f}'])
    rest = groups[top:]
    if rest:
      rows.append(['', 'the others', f'{sum(n for _, _, n in rest):g}',
                   f'{sum(ms for _, ms, _ in rest):.2f}'])
  return columns, rows


def sweep(data, opts):
  """terraformer-bench --sweep: ms/token of each model per d_model, and the
  speedup of the others over the first; with a JSON that has it, over the
  dense model at its bound too (`vs dense bound`)."""
  names = data['names']
  bound = all('speedup_vs_dense_bound' in row['models'][n]
              for row in data['rows'] for n in names[1:])
  columns = ['d_model'] + [f'{opts.label(n)} ms/token' for n in names]
  for n in names[1:]:
    prefix = '' if len(names) == 2 else f'{opts.label(n)} '
    columns += [f'{prefix}speedup', f'{prefix}per block'] + (
        [f'{prefix}vs dense bound'] if bound else [])
  rows = []
  for row in data['rows']:
    cells = [str(row['d_model'])] + [
        f"{row['models'][n]['ms_per_token']:.2f}" for n in names]
    for n in names[1:]:
      r = row['models'][n]
      cells += [f"{r['speedup']:.2f}x",
                _f(r.get('speedup_per_block'), '.2f') + (
                    'x' if r.get('speedup_per_block') else '')]
      if bound:
        cells.append(_x(r['speedup_vs_dense_bound']))
    rows.append(cells)
  return columns, rows


# ---------------------------------------------------------------------------
# terraformer-export, terraformer-eval


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


ROUGE = (('rouge1', 'ROUGE-1'), ('rouge2', 'ROUGE-2'), ('rougeL', 'ROUGE-L'))


def rouge(data, opts):
  """terraformer-eval's summary: the model beside its extractive yardsticks
  (lead-3, lead-k matched to the abstract's length, 3 random sentences)."""
  pct = lambda scores: [f'{100 * scores[k]:.2f}' for k, _ in ROUGE]
  base = data.get('baselines') or {}
  k, seed = data.get('baseline_k'), data.get('baseline_seed')
  rows = [[opts.label('model')] + pct(data)]
  for key, name in ((f'lead_{k}', f'lead-{k}'),
                    ('lead_matched', 'lead-k matched (mean k {:.1f})'),
                    (f'random_{k}', f'random {k} (seed {seed})')):
    if key in base:
      rows.append([opts.label(name.format(base[key].get('sentences', 0)))] +
                  pct(base[key]))
  return ['F1 (%)'] + [name for _, name in ROUGE], rows


def settings(pairs, opts):
  """Several terraformer-eval summaries of one split, a row per setting, with
  the fluency shares; then the references' fluency and the yardsticks of the
  first summary (the same papers)."""
  columns = (['setting'] + [name for _, name in ROUGE] +
             ['words', 'known words (%)', 'known trigrams (%)',
              'repeated trigrams (%)'])
  fluency_cells = lambda f: [f'{100 * f[k]:.1f}' for k in (
      'known_words', 'known_trigrams', 'repeated_trigrams')]
  pct = lambda scores: [f'{100 * scores[k]:.2f}' for k, _ in ROUGE]
  rows = [[opts.label(name)] + pct(data) +
          [f'{data["prediction_words"]:.1f}'] +
          fluency_cells(data['fluency']['model']) for name, data in pairs]
  first = pairs[0][1]
  rows.append([opts.label('references'), MISSING, MISSING, MISSING,
               f'{first["reference_words"]:.1f}'] +
              fluency_cells(first['fluency']['references']))
  base = first.get('baselines') or {}
  k, seed = first.get('baseline_k'), first.get('baseline_seed')
  for key, name in ((f'lead_{k}', f'lead-{k}'),
                    (f'random_{k}', f'random {k} (seed {seed})')):
    if key in base:
      rows.append([opts.label(name)] + pct(base[key]) +
                  [f'{base[key]["words"]:.1f}'] + [MISSING] * 3)
  return columns, rows


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
# terraformer-info


def parameters(total):
  """775.4M, 16.88B, 52,224: as the docs write parameter counts."""
  if total >= 1e9:
    return f'{total / 1e9:.2f}B'
  if total >= 1e6:
    return f'{total / 1e6:.1f}M'
  return f'{total:,}'


def params(pairs, opts):
  """terraformer-info --json of each config: its total parameters."""
  return ['config', 'parameters'], [
      [opts.label(name), parameters(data['total'])] for name, data in pairs]


def plan(pairs, opts):
  """terraformer-info --devices=N --json: the planned GiB per device."""
  columns = ['config', 'devices', 'weights', 'Adam slots',
             'activations (est.)', 'total']
  rows = []
  for name, data in pairs:
    p = data['per_device']
    rows.append([opts.label(name), str(p['devices'])] + [
        f'{p[k] / GIB:.3f}' for k in (
            'weights_bytes_per_device', 'slots_bytes_per_device',
            'activation_bytes_per_device', 'total_bytes_per_device')])
  return columns, rows


def compiled(pairs, opts):
  """terraformer-info --devices=N --compiled --json: XLA's GiB per device."""
  columns = ['config', 'devices', 'arguments (weights + slots + batch)',
             'temporaries', 'peak']
  rows = []
  for name, data in pairs:
    c = data['compiled_per_device']
    rows.append([opts.label(name), str(data['per_device']['devices'])] + [
        f'{c[k] / GIB:.3f} GiB' for k in ('arguments', 'temporaries',
                                           'peak')])
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
# terraformer-memory-bench, terraformer-topk-bench


def lengths(reports, opts):
  """Merged `--input_lens` reports -> input tokens x (MiB, then the step ms
  of the models that were timed)."""
  models = {}
  for where, report in reports:
    for name, rows in report['models'].items():
      if name in models:
        raise TableError(f'{where}: model {name!r} measured twice')
      models[name] = {row['input_len']: row for row in rows}
  if not models:
    raise TableError('no models')
  unknown = set(opts.labels) - set(models)
  if unknown:
    raise TableError(f'--label for unmeasured model(s): '
                     f'{", ".join(sorted(unknown))}')
  lens = sorted({n for rows in models.values() for n in rows})
  timed = [m for m, rows in models.items()
           if any(r.get('step_ms') is not None for r in rows.values())]
  columns = (['input tokens'] + [opts.label(m) for m in models] +
             [f'{opts.label(m)} ms' for m in timed])
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
  return columns, table


def depth(report, opts):
  """`--layers` report -> layers x reversible / not reversible MiB."""
  table = []
  for row in report['rows']:
    rev, plain = row['reversible'], row['non_reversible']
    table.append([str(row['layers']),
                  f'{rev["total"] / MIB:.1f}', f'{rev["temp"] / MIB:.1f}',
                  f'{plain["total"] / MIB:.1f}', f'{plain["temp"] / MIB:.1f}',
                  f'{plain["total"] / rev["total"]:.2f}'])
  return ['layers', 'reversible', '(temporaries)', 'not reversible',
          '(temporaries)', 'ratio'], table


def _ms(value):
  return f'{value:.2f}' if value < 10 else f'{value:.1f}'


def topk(report, opts):
  """terraformer-topk-bench's rows at one k (--k) -> n x (ms, nCCS) per
  method."""
  if opts.k is None:
    raise TableError('topk needs --k')
  methods = list(report.get('methods') or [])
  rows = [r for r in report['rows'] if r.get('k') == opts.k]
  if not rows:
    raise TableError(f'no rows with k = {opts.k}')
  similar = [m for m in methods if m != 'hard']  # Exact: nCCS 1 by definition.
  name = lambda m: opts.label(TOPK_LABELS.get(m, m))
  columns = (['n'] + [f'{name(m)} ms' for m in methods] +
             [f'{name(m)} nCCS' for m in similar])
  table = []
  for r in rows:
    cells = [str(r['n'])]
    cells += [MISSING if r.get(m) is None else _ms(r[m]['ms'])
              for m in methods]
    cells += [MISSING if r.get(m) is None else f'{r[m]["nccs"]:.3f}'
              for m in similar]
    table.append(cells)
  return columns, table


# ---------------------------------------------------------------------------
# experiments/long_input_eval.py

RECALL_SCORES = (('step', 'step', str),
                 ('exact_match', 'exact match', '{:.3f}'.format),
                 ('token_accuracy', 'token accuracy', '{:.3f}'.format))
RECALL_POOLING = (('first_pooling_keeps_facts', 'fact tokens kept'),
                  ('first_pooling_keeps_queries', 'query tokens kept'),
                  ('first_pooling_keeps_all', 'examples keeping all'))


def recall(pairs, opts):
  """experiments/long_input_eval.py's line of each run: step, exact match, token
  accuracy, and what the first pooling keeps where it was measured
  (--kept_by_pooling)."""
  pooling = [(k, name) for k, name in RECALL_POOLING
             if any(k in line for _, line in pairs)]
  columns = ['run'] + [name for _, name, _ in RECALL_SCORES] + [
      name for _, name in pooling]
  return columns, [
      [opts.label(label)] + [fmt(line[k]) for k, _, fmt in RECALL_SCORES] +
      [_f(line.get(k), '.3f') for k, _ in pooling] for label, line in pairs]


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
    'jsons': lambda inputs: [(path, load_json(path)) for path in inputs],
    'labelled': lambda inputs: [(label, load_json(path))
                                for label, path in map(_split_label, inputs)],
    'runs': lambda inputs: [(label, _runs(dirs))
                            for label, dirs in map(_split_label, inputs)],
}

Mode = collections.namedtuple('Mode', 'table inputs reads')
MODES = {
    'speed': Mode(speed, 'json', 'terraformer-bench --json (with '
                  '--compare_trax: also Trax ms/token, ours vs Trax)'),
    'memory': Mode(memory, 'json', 'terraformer-bench --json: what each '
                   'model holds, by kind'),
    'speeds': Mode(speeds, 'labelled', 'LABEL=PATH of terraformer-bench '
                   '--json of one model (several: a row each)'),
    'projection': Mode(projection, 'json',
                       'terraformer-bench --project_layers=L --json'),
    'user_path': Mode(user_path, 'json',
                      'terraformer-bench --trax_user_path --json'),
    'agreement': Mode(agreement, 'json',
                      'terraformer-bench --agreement --json'),
    'xla_ops': Mode(xla_ops, 'json', 'terraformer-bench --xla_ops --json'),
    'kernel_layers': Mode(kernel_layers, 'json', 'python -m '
                          'terraformer.benchmarks.kernels --json'),
    'profile': Mode(profile, 'json', 'terraformer-bench --profile_dir=DIR '
                    '--json (with --k: operation rows per model, default 6)'),
    'sweep': Mode(sweep, 'json', 'terraformer-bench --sweep --json'),
    'markdown': Mode(markdown, 'text',
                     "a Markdown table (terraformer-export's table.md)"),
    'rouge': Mode(rouge, 'json',
                  "terraformer-eval's eval_<split>_step<N>.json"),
    'curve': Mode(curve, 'json', 'experiments/long_setting.py curve --out'),
    'settings': Mode(settings, 'labelled', "LABEL=PATH of terraformer-eval's "
                     'eval_<split>_step<N>.json (one split, several settings)'),
    'params': Mode(params, 'labelled', 'LABEL=PATH of terraformer-info --json'),
    'plan': Mode(plan, 'labelled',
                 'LABEL=PATH of terraformer-info --devices=N --json'),
    'compiled': Mode(compiled, 'labelled', 'LABEL=PATH of terraformer-info '
                     '--devices=N --compiled --json'),
    'ood': Mode(ood, 'runs', 'LABEL=RUN_DIR[,RUN_DIR...] of terraformer-ood '
                '(RUN_DIR/ood_result.json; several: the seeds of one row)'),
    'lengths': Mode(lengths, 'jsons', 'terraformer-memory-bench '
                    '--input_lens=... --json (several: merged)'),
    'pytest': Mode(pytest_cases, 'text', 'pytest --junitxml=F -o junit_logging=system-out -s: a row per test file'),
    'depth': Mode(depth, 'json',
                  'terraformer-memory-bench --layers=... --json'),
    'topk': Mode(topk, 'json', 'terraformer-topk-bench --json (with --k)'),
    'recall': Mode(recall, 'labelled',
                   "LABEL=PATH of experiments/long_input_eval.py's line"),
}


# ---------------------------------------------------------------------------
# Columns, papers, figures.


class Options:
  """What a table function may use besides its input: --label, --k."""

  def __init__(self, labels, k=None):
    self.labels, self.k = labels, k

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


def build(mode, inputs, labels=None, papers=None, columns=None, k=None):
  """{"columns", "rows"} of MODE's INPUTs (see the module's docstring)."""
  labels = labels or {}
  spec = MODES[mode]
  data = READERS[spec.inputs](inputs)
  try:
    all_columns, rows = spec.table(data, Options(labels, k))
  except (KeyError, TypeError, IndexError, AttributeError) as e:
    raise TableError(f'{", ".join(inputs)} is not what {mode} reads '
                     f'({spec.reads}; {type(e).__name__}: {e})') from None
  chosen = columns or all_columns
  rows = _select(all_columns, rows, chosen)
  if papers:
    by_label = {labels.get(name, name): v for name, v in papers.items()}
    chosen = chosen + ['paper']
    rows = [row + [by_label.get(row[0], MISSING)] for row in rows]
  return {'columns': list(chosen), 'rows': rows}


def _parser():
  parser = OneLineParser(
      prog=PROG, description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog='MODE and its INPUT:\n' + '\n'.join(
          f'  {name:10s} {mode.reads}' for name, mode in MODES.items()))
  parser.add_argument('mode', choices=list(MODES), metavar='MODE')
  parser.add_argument('inputs', nargs='+', metavar='INPUT')
  parser.add_argument('--out', required=True, help='the table (JSON) written')
  parser.add_argument('--label', action='append', help='NAME=TEXT (repeat)')
  parser.add_argument('--paper', action='append', help='NAME=TEXT (repeat)')
  parser.add_argument('--columns', help='comma-separated: only these '
                      'columns, in this order (speed: also ms/token, the '
                      'median alone)')
  parser.add_argument('--figure', action='append',
                      help='ID=SPEC (repeat): a cell, a mean or a difference')
  parser.add_argument('--figures', help='where the figures go, as ID=VALUE '
                      'lines')
  parser.add_argument('--k', type=int, help='topk: the k of the rows kept')
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
                  args.columns.split(',') if args.columns else None, args.k)
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
