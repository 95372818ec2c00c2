"""Where a decode step's time goes, read from a jax.profiler trace.

`terraformer-bench --profile_dir=DIR` traces `--tokens` decoding steps of
each model and prints this summary of the trace: the steady-state step
program's XLA operations (XLA:CPU records one event per operation it runs),
their self time per step (an operation's time minus the operations nested in
it, e.g. a `conditional`'s branch), summed by kind (`ffi_call`: the fused
kernels; `ynn_fusion`: XNNPACK; `fusion`/`wrapped_*`: XLA's loops; ...), and
the slowest operations, each with its line of the compiled HLO (the kernel's
target and shapes). Only the timed steps count (DecodeTimer marks them with
an annotation), not the prompt. Time summed over threads: with the kernels or XLA's
intra-op pool running on 2 cores it can exceed the step's wall time.
"""
import collections
import glob
import os
import re

# `name = shape opcode(...)` of an optimized HLO instruction.
_HLO_LINE = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+)\s+([\w\-]+)\(')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]+)"')


def trace_file(trace_dir):
  """The newest `.xplane.pb` under `trace_dir` (jax.profiler.trace's)."""
  files = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'),
                    recursive=True)
  if not files:
    raise FileNotFoundError(f'no .xplane.pb trace under {trace_dir}')
  return max(files, key=os.path.getmtime)


def operation_events(path, window=None):
  """([(thread, hlo_op, program_id, module, start_ns, duration_ns)] of every
  XLA operation on the host, {annotation name: [(start_ns, end_ns)]}).

  window: an annotation name: only operations that start inside one of its
  events are kept.
  """
  from jax.profiler import ProfileData  # pylint: disable=g-import-not-at-top
  data = ProfileData.from_file(path)
  events, marks = [], collections.defaultdict(list)
  for plane in data.planes:
    for line in plane.lines:
      for e in line.events:
        stats = dict(e.stats)
        if 'hlo_op' not in stats:
          marks[e.name].append((e.start_ns, e.start_ns + e.duration_ns))
        elif not e.name.startswith(('ThunkExecutor', 'end:')):
          events.append((line.name, stats['hlo_op'], stats.get('program_id'),
                         stats.get('hlo_module', ''), e.start_ns,
                         e.duration_ns))
  if window is not None:
    spans = marks.get(window, [])
    events = [e for e in events if any(a <= e[4] < b for a, b in spans)]
  return events, marks


def self_times(events):
  """Each event's duration minus that of events nested in it on its thread."""
  own = [e[5] for e in events]
  by_thread = collections.defaultdict(list)
  for i, e in enumerate(events):
    by_thread[e[0]].append(i)
  for ids in by_thread.values():
    ids.sort(key=lambda i: (events[i][4], -events[i][5]))
    stack = []  # Enclosing events: (index, end).
    for i in ids:
      start, end = events[i][4], events[i][4] + events[i][5]
      while stack and stack[-1][1] <= start:
        stack.pop()
      if stack:
        own[stack[-1][0]] -= events[i][5]
      stack.append((i, end))
  return own


def kind(op):
  """'ffi_call.13' -> 'ffi_call'; 'wrapped_slice.1' -> 'wrapped_slice';
  XLA's loop fusions ('add_rsqrt_fusion.2') -> 'fusion'; XNNPACK's
  'ynn_fusion.8' -> 'ynn_fusion'."""
  name = re.sub(r'(\.\d+)*(\.clone)?$', '', op)
  if name.endswith('fusion') and name != 'ynn_fusion':
    return 'fusion'
  return name


def hlo_lines(hlo_text):
  """{instruction name: 'opcode shape [target] (op_name tail)'}."""
  lines = {}
  for line in (hlo_text or '').splitlines():
    m = _HLO_LINE.match(line)
    if not m:
      continue
    name, shape, opcode = m.groups()
    target = _TARGET.search(line)
    op_name = _OP_NAME.search(line)
    desc = f'{opcode} {shape}'
    if target:
      desc += f' {target.group(1)}'
    if op_name:
      desc += f' ({op_name.group(1).split("/")[-1]})'
    lines[name] = desc
  return lines


def summarize(trace_dir, module, steps, window, hlo_text=None, top=10):
  """The step program's operations, per step.

  module: the HLO module name of the step ('jit_' + the jitted function's
  name); steps: the steps run inside the `window` annotation (the timed
  ones). Returns a dict: steps, ops_per_step, ms_per_step (self time, all
  threads), by_kind [(kind, ms/step, ops/step)] and slowest [(op, ms/step,
  HLO line)].
  """
  events, marks = operation_events(trace_file(trace_dir), window)
  if window not in marks:
    raise ValueError(f'the trace has no {window!r} annotation')
  own = self_times(events)
  per_op, count = collections.Counter(), collections.Counter()
  for e, t in zip(events, own):
    if e[3] == module:
      per_op[e[1]] += t
      count[e[1]] += 1
  if not per_op:
    raise ValueError(f'no operation of module {module} in the trace')
  kinds, kind_ops = collections.Counter(), collections.Counter()
  for op, t in per_op.items():
    kinds[kind(op)] += t
    kind_ops[kind(op)] += count[op]
  described = hlo_lines(hlo_text)
  ms = lambda ns: ns / 1e6 / steps
  return {
      'steps': steps,
      'ops_per_step': sum(count.values()) / steps,
      'ms_per_step': ms(sum(per_op.values())),
      'by_kind': [(k, ms(t), kind_ops[k] / steps)
                  for k, t in kinds.most_common()],
      'slowest': [(op, ms(t), described.get(op, ''))
                  for op, t in per_op.most_common(top)],
  }


def format_summary(name, summary, kinds=8):
  """Lines: the step's totals, time by kind, the slowest operations."""
  s = summary
  lines = [f'{name}: {s["steps"]} steps, {s["ops_per_step"]:.0f} XLA '
           f'operations and {s["ms_per_step"]:.2f} ms of operation time per '
           'step (self time, all threads)']
  lines.append('  by kind: ' + ', '.join(
      f'{k} {t:.2f} ms ({n:.0f})' for k, t, n in s['by_kind'][:kinds]))
  lines.append('  slowest (ms/step):')
  for op, t, desc in s['slowest']:
    lines.append(f'    {t:8.3f}  {op:<26} {desc[:110]}')
  return '\n'.join(lines)
