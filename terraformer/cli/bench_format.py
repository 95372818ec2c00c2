"""terraformer-bench's tables and plot, from the numbers the benchmarks return.

`terraformer.benchmarks.decode_configs` (speed tables, projection, agreement,
XLA operations, the user's path, the sweep) and
`terraformer.benchmarks.step_profile` (a traced step) measure and return
numbers; `terraformer/cli/bench.py` prints them with these functions. Each
table is made here once (`TABLES`: `{"columns", "rows"}` of the cells the
docs show): the CLI prints it and its --json holds it under "tables", where
tools/experiment_tables.py reads it for the results files.
"""
import re

import numpy as np

from terraformer.cli import common

MISSING = common.MISSING


def _f(value, fmt):
  return MISSING if value is None else format(value, fmt)


def _x(value):
  return MISSING if value is None else f'{value:.2f}x'


def _ratio(a, b):
  """a / b as a speedup ('2.50x'), MISSING without both."""
  return _x(a / b) if a and b else MISSING


# The speed table: its columns, then the speedups over the dense model of
# the same decode options (in every report since they were added), Trax's
# time (--compare_trax), and last the GB/s of each model's bound and its
# median ms/token alone (for tables that choose them).
SPEED_COLUMNS = ['model', 'ms/token [min-max]', 'ms/block', 'MB/token',
                 'MB/block', 'compute ms', 'bound ms', 'x bound', 'speedup',
                 'per block']
DENSE_COLUMNS = ['vs dense', 'vs dense bound']
TRAX_COLUMNS = ['Trax ms/token', 'ours vs Trax']
LAST_COLUMNS = ['GB/s', 'ms/token']
# What the 'vs dense' columns mean, under every speed table.
DENSE_NOTE = ('vs dense: speedup over the dense model of the same decode '
              'options and d_model in this run, both measured; vs dense '
              'bound: over that dense model at its bound')


def format_machine(machine):
  """'machine: <CPU model> (N cores); kernels: float avx512, q8 GEMV
  avx512vnni' (`decode_speed.machine`), the line under every table."""
  cpu = machine.get('cpu_model') or 'unknown CPU'
  if machine.get('cpu_cores'):
    cpu += f" ({machine['cpu_cores']} cores)"
  if machine.get('float_isa'):
    paths = (f"float {machine['float_isa']}, q8 GEMV "
             f"{machine.get('gemv_isa') or '-'}")
  else:
    paths = f"none ({machine.get('kernels')}): XLA's code only"
  return f'machine: {cpu}; kernels: {paths}'


def speed_table(report):
  """`run`'s models, a row each: ms/token (median [min-max] over the
  repeats), per decoder block, the bytes a step reads, its bound, and the
  speedups over the first model (whole and per block), over the dense
  model of the same decode options (measured and at its bound) and, with
  --compare_trax, over Trax's model."""
  models = report['models']
  dense = any('speedup_vs_dense' in m for m in models)
  trax = any('trax' in m for m in models)
  columns = (SPEED_COLUMNS + (DENSE_COLUMNS if dense else []) +
             (TRAX_COLUMNS if trax else []) + LAST_COLUMNS)
  rows = []
  for m in models:
    block = m.get('bytes_per_block')
    trax_ms = m['trax']['ms_per_token'] if 'trax' in m else None
    cells = {
        'model': m['name'],
        'ms/token [min-max]': f"{m['ms_per_token']:.1f} "
                              f"[{m['ms_per_token_min']:.1f}-"
                              f"{m['ms_per_token_max']:.1f}]",
        'ms/block': _f(m.get('ms_per_block'), '.2f'),
        'MB/token': f"{m['bytes_per_token'] / 1e6:.1f}",
        'MB/block': _f(None if block is None else block / 1e6, '.2f'),
        'compute ms': _f(m.get('compute_bound_ms_per_token'), '.1f'),
        'bound ms': _f(m.get('bound_ms_per_token'), '.1f'),
        'x bound': _f(m.get('achieved_over_bound'), '.2f'),
        'speedup': _x(m['speedup']),
        'per block': _x(m.get('speedup_per_block')),
        'vs dense': _x(m.get('speedup_vs_dense')),
        'vs dense bound': _x(m.get('speedup_vs_dense_bound')),
        'Trax ms/token': _f(trax_ms, '.1f'),
        'ours vs Trax': _ratio(trax_ms, m['ms_per_token']),
        'GB/s': _f(m.get('bandwidth_gbps'), '.1f'),
        'ms/token': f"{m['ms_per_token']:.1f}"}
    rows.append([cells[c] for c in columns])
  return common.table(columns, rows)


MEMORY_COLUMNS = ['model', 'int8 matrices (decoder, output layer)',
                  'float32 read per step', 'float32 under tl.Cache (encoder '
                  'block shared by 6, embedding, cross-attention K/V)',
                  'caches', 'total held']


def memory_table(report):
  """What each model holds while timed (GiB), from its `memory_by_kind`
  (bytes by 'LAYER DTYPE[ (under tl.Cache)]' and 'state (caches)'): stored
  int8 / bf16 matrices, float32 the step reads, what layers under tl.Cache
  hold (run on the first call only), the caches; None when no model says."""
  gib = 2.0 ** 30
  rows = []
  for m in report['models']:
    kinds = m.get('memory_by_kind')
    if not kinds:
      continue
    parts = dict.fromkeys(('stored', 'float32', 'cached', 'caches'), 0)
    for kind, n_bytes in kinds.items():
      if kind == 'state (caches)':
        parts['caches'] += n_bytes
      elif kind.endswith('(under tl.Cache)'):
        parts['cached'] += n_bytes
      elif ' float32' in kind:
        parts['float32'] += n_bytes
      else:
        parts['stored'] += n_bytes
    rows.append([m['name']] + [f'{n / gib:.2f}' for n in parts.values()] +
                [f'{sum(kinds.values()) / gib:.2f}'])
  return common.table(MEMORY_COLUMNS, rows) if rows else None


def format_table(report):
  """The results of `run` as an aligned text table."""
  models = report['models']
  lines = [common.format_aligned(speed_table(report))]
  settings = report['settings']
  lines.append(
      f"batch 1, {settings['tokens']} tokens after a "
      f"{settings['prompt_len']}-token prompt, {settings['repeats']} repeats;"
      f' bound = the larger of bytes read per token / {_bandwidths(report)}'
      f' and compute ms = {_compute(report)}; ms/block and '
      'MB/block: (model - model without decoder blocks) / blocks; speedup '
      'and per block: over the first model')
  lines.append(DENSE_NOTE)
  paths = [f"{r['name']}: {r['decode_path']}" for r in models
           if r.get('decode_path') not in (None, 'xla')]
  if paths:
    lines.append('decode path (others: xla): ' + '; '.join(paths))
  return '\n'.join(lines)


def projection_table(report):
  """`run(..., project_layers=L)`'s models: measured with `fit_blocks`
  decoder blocks and without, projected to L blocks, beside the paper's
  seconds (and, in a report that has them, the projected speedups over the
  dense model of the same decode options)."""
  models = report['models']
  first = models[0]
  fit = report['settings']['fit_blocks']
  dense = any('projected_speedup_vs_dense' in m for m in models)
  columns = (['model', 'blocks',
              f"measured ms/token ({fit} block{'s' if fit != 1 else ''})",
              'ms/block', 'ms no blocks', 'MB/block', 'projected ms/token',
              'projected MB/token', 'projected bound ms', 'x bound',
              'speedup (time)', 'speedup (bytes)', 'paper s/token',
              'paper speedup'] + (DENSE_COLUMNS if dense else []))
  rows = []
  for m in models:
    bound = m.get('projected_bound_ms_per_token')
    rows.append([
        m['name'], str(m['n_blocks']), f"{m['ms_per_token']:.1f}",
        f"{m['ms_per_block']:.2f}", f"{m['ms_no_blocks']:.1f}",
        f"{m['bytes_per_block'] / 1e6:.1f}",
        f"{m['projected_ms_per_token']:.1f}",
        f"{m['projected_bytes_per_token'] / 1e6:.0f}", _f(bound, '.1f'),
        _f(None if not bound else m['projected_ms_per_token'] / bound, '.2f'),
        _x(m['projected_speedup']),
        _ratio(first['projected_bytes_per_token'],
               m['projected_bytes_per_token']),
        _f(m.get('paper_seconds'), '.3f'),
        _ratio(first.get('paper_seconds'), m.get('paper_seconds'))] + (
            [_x(m.get('projected_speedup_vs_dense')),
             _x(m.get('projected_speedup_vs_dense_bound'))] if dense else []))
  return common.table(columns, rows)


def format_projection(report):
  """The results of `run(..., project_layers=L)` as a text table."""
  lines = [common.format_aligned(projection_table(report))]
  s = report['settings']
  lines.append(
      f"measured: each model with {s['fit_blocks']} decoder block(s), no "
      f"encoder blocks, and without decoder blocks (ms no blocks), batch 1, "
      f"{s['tokens']} tokens after a {s['prompt_len']}-token input, "
      f"{s['repeats']} repeats; projected: ms no blocks + "
      f"{s['project_layers']} x ms/block (bytes likewise); bound = bytes / "
      f"{_bandwidths(report)}; paper: "
      'PAPER_DECODE_SECONDS of the gin config')
  lines.append(DENSE_NOTE + ' (projected)')
  return '\n'.join(lines)


def format_memory(by_kind):
  """'12.3 GiB held: KernelDense int8 8.1, ...' (GiB, largest first)."""
  gib = lambda n: n / 2**30
  parts = ', '.join(f'{k} {gib(v):.2f}' for k, v in sorted(
      by_kind.items(), key=lambda kv: -kv[1]) if gib(v) >= 0.005)
  return f'{gib(sum(by_kind.values())):.2f} GiB held: {parts}'


def format_memory_lines(report):
  """Each model's memory held while timed (weights by layer class and
  dtype, caches) and the process's peak RSS."""
  lines = [f"memory {r['name']}: " + format_memory(r['memory_by_kind'])
           for r in report['models'] if r.get('memory_by_kind')]
  lines.append(f"peak RSS of this run: {report['peak_rss_bytes'] / 2**30:.2f}"
               ' GiB (weights are held one group of models at a time)')
  return '\n'.join(lines)


def json_report(report):
  """`run`'s report as JSON-ready data (numbers and strings only)."""
  def clean(value):
    if isinstance(value, dict):
      return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
      return [clean(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
      return value.item()
    return value
  return clean(report)


def agreement_table(results):
  """`agreement`'s rows against the first model: its decode path, max
  |delta logit|, greedy agreement and the first token that differs."""
  columns = ['model', 'decode path', 'max |delta logit| vs the first',
             f"greedy agreement ({results[0]['tokens']} tokens)",
             'first difference']
  rows = []
  for r in results:
    first = r.get('first_difference')
    rows.append([r['name'], r['decode_path'],
                 f"{r['max_abs_logit_delta']:.3g}",
                 f"{r['greedy_agreement']:.3f}",
                 'none' if first is None else f'token {first}'])
  return common.table(columns, rows)


def format_agreement(results):
  """`agreement`'s rows as a text table, against the first model."""
  lines = [common.format_aligned(agreement_table(results))]
  first = results[0]
  weights = _weights_decoded(first)
  prompt = first.get('prompt', 'random')
  lines.append(
      f"vs {first['name']}: {first['tokens']} tokens, teacher-forced (every "
      f"model is fed {first['name']}'s greedy tokens), {weights}, "
      f"{'a random' if prompt == 'random' else prompt + ' as'} prompt; its "
      f"max |logit| {first['max_abs_logit']:.3g}"
      + (f", smallest top-2 logit gap {first['min_top2_margin']:.3g} (a "
         '|delta logit| under half of it cannot change an argmax)'
         if 'min_top2_margin' in first else ''))
  return '\n'.join(lines + _noise_line(results))


def _weights_decoded(first):
  """What the first model's weights were: a checkpoint's, or random."""
  if first.get('checkpoint'):
    return (f"the weights of {first['checkpoint']} (step "
            f"{first['checkpoint_step']})")
  return 'the same random weights'


def _noise_line(results):
  """[the line naming the models with noise on their weights] or []."""
  noisy = [f"{r['name']} {r['noise']:g}" for r in results if r.get('noise')]
  return (['weights with noise (x RMS, bench_weights.noise): '
           + ', '.join(noisy)] if noisy else [])


def quality_table(results):
  """`quality`'s rows: each decode path's log-perplexity of the reference
  targets and, against the first model, its shift, mean KL divergence and
  share of the same top token."""
  columns = ['model', 'decode path', 'log-perplexity',
             'delta vs the first', 'mean KL vs the first',
             'same top token', 'accuracy']
  rows = [[r['name'], r['decode_path'], f"{r['log_perplexity']:.4f}",
           f"{r['log_perplexity_delta']:+.4f}", f"{r['mean_kl']:.2e}",
           f"{r['same_top_token']:.4f}", f"{r['accuracy']:.4f}"]
          for r in results]
  return common.table(columns, rows)


def format_quality(results):
  """`quality`'s rows as a text table, and what they were measured on."""
  first = results[0]
  lines = [common.format_aligned(quality_table(results)),
           f"teacher-forced on the reference targets of {first['examples']} "
           f"{first['split']} examples ({first['positions']} positions, "
           f"inputs of {first['input_len']} tokens), "
           f"{_weights_decoded(first)}; KL(first || model) in nats per "
           'position, log-perplexity in nats per token']
  return '\n'.join(lines + _noise_line(results))


def xla_ops_table(results):
  """A row per model: XLA operations per decoder block, and by kind."""
  return common.table(['model', 'XLA ops/block', 'of which'], [
      [r['name'], f"{r['ops_per_block']:g}",
       ', '.join(f'{k} {v:g}' for k, v in sorted(
           r['ops_per_block_by_kind'].items(), key=lambda kv: -kv[1]))]
      for r in results])


def format_xla_ops(results):
  """XLA operations per decoder block of each model, as a text table."""
  return common.format_aligned(xla_ops_table(results))


def user_path_table(report):
  """`user_path`'s models: whole decode calls, ours and Trax's."""
  return common.table(
      ['model', 'ours ms/token', 'Trax ms/token', 'Trax / ours',
       'ours 1st call s', 'Trax 1st call s', 'same tokens'],
      [[r['name'], f"{r['ours_ms_per_token']:.1f}",
        f"{r['trax_ms_per_token']:.1f}", f"{r['trax_over_ours']:.1f}x",
        f"{r['ours_first_call_s']:.1f}", f"{r['trax_first_call_s']:.1f}",
        'yes' if r['same_tokens'] else 'NO'] for r in report['models']])


def format_user_path(report):
  """`user_path`'s report as a text table."""
  lines = [common.format_aligned(user_path_table(report))]
  s = report['settings']
  lines.append(
      f"whole greedy decode calls, batch 1, {s['tokens']} tokens after a "
      f"{s['prompt_len']}-token input, median of {s['repeats']} calls after "
      'the first: ours = terraformer.decoding.search.decode, Trax = '
      'trax.supervised.decoding.autoregressive_sample; 1st call includes '
      'compilation')
  return '\n'.join(lines)


def sweep_table(report):
  """`sweep`'s rows: ms/token of each model per d_model, and the speedup
  of the others over the first, whole and per block; with a report that
  has it, over the dense model at its bound too (`vs dense bound`). With
  more than two models, a model's speedup columns start with its name."""
  names = report['names']
  bound = all('speedup_vs_dense_bound' in row['models'][n]
              for row in report['rows'] for n in names[1:])
  columns = ['d_model'] + [f'{n} ms/token' for n in names]
  for n in names[1:]:
    prefix = '' if len(names) == 2 else f'{n} '
    columns += [f'{prefix}speedup', f'{prefix}per block'] + (
        [f'{prefix}vs dense bound'] if bound else [])
  rows = []
  for row in report['rows']:
    cells = [str(row['d_model'])] + [
        f"{row['models'][n]['ms_per_token']:.2f}" for n in names]
    for n in names[1:]:
      r = row['models'][n]
      cells += [_x(r['speedup']), _x(r.get('speedup_per_block'))] + (
          [_x(r['speedup_vs_dense_bound'])] if bound else [])
    rows.append(cells)
  return common.table(columns, rows)


def format_sweep(report):
  """Progress lines of a sweep: each model's ms/token, ms/block, x bound
  and speedups per d_model."""
  names = report['names']
  lines = []
  for row in report['rows']:
    for name in names:
      r = row['models'][name]
      lines.append(
          f"d_model {row['d_model']:>5}  {name:<24} "
          f"{r['ms_per_token']:8.2f} ms/token  "
          f"{_f(r.get('ms_per_block'), '7.3f')} ms/block  "
          f"x bound {_f(r.get('achieved_over_bound'), '.2f')}  "
          f"speedup {r['speedup']:.2f}x  "
          f"per block {_x(r.get('speedup_per_block'))}  "
          f"vs dense bound {_x(r.get('speedup_vs_dense_bound'))}")
  return '\n'.join(lines)


def plot_sweep(report, path):
  """Writes a PNG: speedup over the first configuration vs d_model."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  d_models = [row['d_model'] for row in report['rows']]
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in report['names'][1:]:
    for key, style, label in (('speedup', 'o-', 'whole model'),
                              ('speedup_per_block', 's--', 'per block')):
      values = [row['models'][name].get(key) for row in report['rows']]
      if any(v is None for v in values):
        continue
      ax.plot(d_models, values, style, label=f'{name}, {label}')
  ax.set_xscale('log', base=2)
  ax.set_xticks(d_models)
  ax.set_xticklabels([str(d) for d in d_models])
  ax.set_xlabel('d_model')
  ax.set_ylabel(f'speedup over {report["names"][0]}')
  ax.set_title('Unbatched decoding, one token (CPU)')
  ax.axhline(1.0, color='gray', linewidth=0.5)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def _bandwidths(report):
  """How a report's bounds were made: one GEMV bandwidth for the run, or
  each model's own (measured between its rounds of repeats)."""
  own = [r['bandwidth_gbps'] for r in report['models']
         if r.get('bandwidth_gbps_rounds')]
  if not own:
    return (f"{report['bandwidth_gbps']:.1f} GB/s (GEMV, measured in this "
            'run)')
  return (f'the GEMV bandwidth measured between that model\'s rounds of '
          f'repeats ({min(own):.1f}-{max(own):.1f} GB/s over the models)')


def _compute(report):
  """How a report's compute bounds were made: a step's int8 and float
  multiply-adds at the peak rates of the kernels' instructions."""
  peaks = [r['peak_macs'] for r in report['models'] if r.get('peak_macs')]
  if not peaks:
    return "none (no kernels' peak probe, or a layer step_macs does not count)"

  def rate(kind):
    low, high = (f'{f(p[kind] for p in peaks) / 1e9:.0f}' for f in (min, max))
    return low if low == high else f'{low}-{high}'

  return ('int8 multiply-adds per token / the int8 peak + float ones / the '
          f"float32 peak (probed between rounds: {rate('int8')} and "
          f"{rate('float32')} G/s)")


def format_profile(name, summary, kinds=8):
  """`step_profile.summarize`'s summary as lines: the step's totals, time by
  kind, the slowest operations."""
  s = summary
  lines = [f'{name}: {s["steps"]} steps, {s["ops_per_step"]:.0f} XLA '
           f'operations and {s["ms_per_step"]:.2f} ms of operation time per '
           'step (self time, all threads); wall '
           f'{s["wall_ms_per_step"]:.2f} ms per step, an operation running '
           f'in {s["busy_ms_per_step"]:.2f} of them']
  lines.append('  by kind: ' + ', '.join(
      f'{k} {t:.2f} ms ({n:.0f})' for k, t, n in s['by_kind'][:kinds]))
  lines.append('  slowest (ms/step):')
  for op, t, desc in s['slowest']:
    lines.append(f'    {t:8.3f}  {op:<26} {desc[:110]}')
  return '\n'.join(lines)


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


def profile_table(results, operations=6):
  """Per model of `profile`: its step's wall time (and the part with an
  operation running), then the `operations` that took the most time per
  step (kernel calls by HLO line, the rest by kind), and the others
  together."""
  rows = []
  for r in results:
    s = r['summary']
    rows.append([r['name'], 'wall (an operation running)',
                 f"{s['ops_per_step']:.0f}",
                 f"{s['wall_ms_per_step']:.2f} ({s['busy_ms_per_step']:.2f})"])
    groups = s['by_operation']
    for group, ms, n in groups[:operations]:
      rows.append(['', _operation(group), f'{n:g}', f'{ms:.2f}'])
    rest = groups[operations:]
    if rest:
      rows.append(['', 'the others', f'{sum(n for _, _, n in rest):g}',
                   f'{sum(ms for _, ms, _ in rest):.2f}'])
  return common.table(['model', 'per step', 'calls', 'ms'], rows)
