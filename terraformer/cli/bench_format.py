"""terraformer-bench's tables and plot, from the numbers the benchmarks return.

`terraformer.benchmarks.decode_configs` (speed tables, projection, agreement,
XLA operations, the user's path, the sweep) and
`terraformer.benchmarks.step_profile` (a traced step) measure and return
numbers; `terraformer/cli/bench.py` prints them with these functions.
"""
import numpy as np


def _f(value, fmt):
  return '-' if value is None else format(value, fmt)


HEADER = ('model', 'ms/token', '[min-max]', 'ms/block', 'MB/token',
          'MB/block', 'bound ms', 'x bound', 'speedup', 'sp/block',
          'vs dense', 'vs dense@bound', 'vs Trax')
# What the 'vs dense' columns mean, under every speed table.
DENSE_NOTE = ('vs dense: speedup over the dense model of the same decode '
              'options and d_model in this run, both measured; vs '
              'dense@bound: over that dense model at its bound')


def _x(value):
  return '-' if value is None else f'{value:.2f}x'


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


def format_row(result, baseline):
  """One table row (a list of strings) for a benchmark result."""
  speedup = baseline['ms_per_token'] / result['ms_per_token']
  per_block = None
  if result.get('ms_per_block') and baseline.get('ms_per_block'):
    per_block = baseline['ms_per_block'] / result['ms_per_block']
  mb_block = result.get('bytes_per_block')
  return [
      result['name'], _f(result['ms_per_token'], '.1f'),
      f"[{result['ms_per_token_min']:.1f}-{result['ms_per_token_max']:.1f}]",
      _f(result.get('ms_per_block'), '.2f'),
      _f(result['bytes_per_token'] / 1e6, '.1f'),
      _f(None if mb_block is None else mb_block / 1e6, '.2f'),
      _f(result.get('bound_ms_per_token'), '.1f'),
      _f(result.get('achieved_over_bound'), '.2f'),
      f'{speedup:.2f}x', _f(per_block, '.2f'),
      _x(result.get('speedup_vs_dense')),
      _x(result.get('speedup_vs_dense_bound')),
      _f(result.get('speedup_over_trax'), '.2f')]


def _trax_row(trax):
  return [trax['name'], _f(trax['ms_per_token'], '.1f'),
          f"[{trax['ms_per_token_min']:.1f}-{trax['ms_per_token_max']:.1f}]",
          _f(trax.get('ms_per_block'), '.2f')] + [''] * (len(HEADER) - 4)


def _aligned(rows):
  """Rows of strings as text lines: first column left-, others right-aligned."""
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  return ['  '.join(c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths))).rstrip()
          for row in rows]


def format_table(report):
  """The results of `run` as an aligned text table."""
  models = report['models']
  rows = [list(HEADER)]
  for result in models:
    rows.append(format_row(result, models[0]))
  for result in models:
    if 'trax' in result:
      rows.append(_trax_row(result['trax']))
  lines = _aligned(rows)
  settings = report['settings']
  lines.append(
      f"batch 1, {settings['tokens']} tokens after a "
      f"{settings['prompt_len']}-token prompt, {settings['repeats']} repeats;"
      f' bound = bytes read per token / {_bandwidths(report)}; ms/block and '
      'MB/block: (model - model without decoder blocks) / blocks')
  lines.append(DENSE_NOTE)
  paths = [f"{r['name']}: {r['decode_path']}" for r in models
           if r.get('decode_path') not in (None, 'xla')]
  if paths:
    lines.append('decode path (others: xla): ' + '; '.join(paths))
  return '\n'.join(lines)


PROJECTION_HEADER = (
    'model', 'measured: blocks', 'ms/token', 'ms/block', 'ms no blocks',
    'MB/block', 'projected: ms/token', 'MB/token', 'bound ms', 'x bound',
    'speedup', 'vs dense', 'vs dense@bound', 'paper: s/token', 'speedup')


def format_projection(report):
  """The results of `run(..., project_layers=L)` as a text table."""
  models = report['models']
  paper0 = models[0].get('paper_seconds')
  rows = [list(PROJECTION_HEADER)]
  for r in models:
    paper = r.get('paper_seconds')
    bound = r.get('projected_bound_ms_per_token')
    rows.append([
        r['name'], str(r['n_blocks']), f"{r['ms_per_token']:.1f}",
        f"{r['ms_per_block']:.2f}", f"{r['ms_no_blocks']:.1f}",
        f"{r['bytes_per_block'] / 1e6:.1f}",
        f"{r['projected_ms_per_token']:.1f}",
        f"{r['projected_bytes_per_token'] / 1e6:.0f}", _f(bound, '.1f'),
        _f(None if not bound else r['projected_ms_per_token'] / bound, '.2f'),
        f"{r['projected_speedup']:.2f}x",
        _x(r.get('projected_speedup_vs_dense')),
        _x(r.get('projected_speedup_vs_dense_bound')), _f(paper, '.3f'),
        _f(paper0 / paper if paper and paper0 else None, '.2f')])
  lines = _aligned(rows)
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


def format_agreement(results):
  """`agreement`'s rows as a text table, against the first model."""
  rows = [['model', 'decode path', 'max |delta logit|', 'greedy agreement',
           'first difference']]
  for r in results:
    first = r.get('first_difference')
    rows.append([r['name'], r['decode_path'],
                 f"{r['max_abs_logit_delta']:.3g}",
                 f"{r['greedy_agreement']:.3f}",
                 'none' if first is None else f'token {first}'])
  lines = _aligned(rows)
  first = results[0]
  if first.get('checkpoint'):
    weights = (f"the weights of {first['checkpoint']} (step "
               f"{first['checkpoint_step']})")
  else:
    weights = 'the same random weights'
  prompt = first.get('prompt', 'random')
  lines.append(
      f"vs {first['name']}: {first['tokens']} tokens, teacher-forced (every "
      f"model is fed {first['name']}'s greedy tokens), {weights}, "
      f"{'a random' if prompt == 'random' else prompt + ' as'} prompt; its "
      f"max |logit| {first['max_abs_logit']:.3g}"
      + (f", smallest top-2 logit gap {first['min_top2_margin']:.3g} (a "
         '|delta logit| under half of it cannot change an argmax)'
         if 'min_top2_margin' in first else ''))
  noisy = [f"{r['name']} {r['noise']:g}" for r in results if r.get('noise')]
  if noisy:
    lines.append('weights with noise (x RMS, bench_weights.noise): '
                 + ', '.join(noisy))
  return '\n'.join(lines)


def format_xla_ops(results):
  """One line per model: XLA operations per decoder block, by kind."""
  return '\n'.join(
      f"{r['name']:<28} {r['ops_per_block']:5.1f} XLA ops/block  "
      + ', '.join(f'{k} {v:g}' for k, v in sorted(
          r['ops_per_block_by_kind'].items(), key=lambda kv: -kv[1]))
      for r in results)


def format_user_path(report):
  """`user_path`'s report as a text table."""
  rows = [['model', 'ours ms/token', 'Trax ms/token', 'Trax / ours',
           'ours 1st call s', 'Trax 1st call s', 'same tokens']]
  for r in report['models']:
    rows.append([r['name'], f"{r['ours_ms_per_token']:.1f}",
                 f"{r['trax_ms_per_token']:.1f}",
                 f"{r['trax_over_ours']:.1f}x",
                 f"{r['ours_first_call_s']:.1f}",
                 f"{r['trax_first_call_s']:.1f}",
                 'yes' if r['same_tokens'] else 'NO'])
  lines = _aligned(rows)
  s = report['settings']
  lines.append(
      f"whole greedy decode calls, batch 1, {s['tokens']} tokens after a "
      f"{s['prompt_len']}-token input, median of {s['repeats']} calls after "
      'the first: ours = terraformer.decoding.search.decode, Trax = '
      'trax.supervised.decoding.autoregressive_sample; 1st call includes '
      'compilation')
  return '\n'.join(lines)


def format_sweep(report):
  """Sweep table: ms/token, ms/block and speedups per d_model."""
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
          f"per block {_f(r.get('speedup_per_block'), '.2f')}x  "
          f"vs dense@bound {_x(r.get('speedup_vs_dense_bound'))}")
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
