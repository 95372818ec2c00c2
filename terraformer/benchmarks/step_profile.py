"""What a compiled decode step runs, and where its time goes.

Read from the optimized HLO of the step (`terraformer.decoding.step`'s jitted
one) and from a jax.profiler trace of it:

- `xla_op_counts` / `hlo_op_counts`: the XLA operations of the steady-state
  step, by kind (`terraformer-bench --xla_ops`): on CPU each one is a launch
  per token, so a small model can be operation-bound, not memory-bound.
- `summarize`: `terraformer-bench --profile_dir=DIR` traces `--tokens`
  decoding steps of each model; the step program's XLA operations (XLA:CPU
  records one event per operation it runs), their self time per step (an
  operation's time minus the operations nested in it, e.g. a `conditional`'s
  branch), summed by kind (`ffi_call`: the fused kernels; `ynn_fusion`:
  XNNPACK; `fusion`/`wrapped_*`: XLA's loops; ...), and the slowest
  operations, each with its line of the compiled HLO (the kernel's target and
  shapes). Only the timed steps count (DecodeTimer marks them with an
  annotation), not the prompt. Time summed over threads: with the kernels or
  XLA's intra-op pool running on 2 cores it can exceed the step's wall time.
"""
import collections
import glob
import os
import re

import jax
import numpy as np

from terraformer.decoding import step as decode_step

# `name = shape opcode(...)` of an optimized HLO instruction.
# A shape: one array's, or a tuple of them (a kernel with several outputs).
_HLO_LINE = re.compile(
    r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\([^()]*\)|\S+)\s+([\w\-]+)\(')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OPERANDS = re.compile(
    r'operand_layout_constraints=\{((?:[^{}]|\{[^{}]*\})*)\}')
_LAYOUT = re.compile(r'\{[\d,]*\}')
_OP_NAME = re.compile(r'op_name="([^"]+)"')
# HLO instructions of the entry computation that do no work at run time.
_FREE_HLO_OPS = ('parameter', 'constant', 'get-tuple-element', 'tuple',
                 'bitcast')


def xla_op_counts(model, prompt_len=16):
  """{HLO op kind: count} of the compiled steady-state decoding step.

  Counts the instructions of the optimized entry computation (each fusion,
  dot, copy, conditional, ... is one operation the CPU runtime launches per
  token), without the free ones. A `conditional` runs one of its branches:
  the operations of its largest branch count too (`hlo_op_counts`), so a
  `lax.switch` does not hide the work it runs. Compiled from shapes only: no
  weights are allocated.
  """
  signature = decode_step.predict_signature(model, prompt_len)
  weights, state = decode_step.init_shapes(model, signature)
  scalars = lambda tree: jax.tree_util.tree_map(
      lambda s: np.zeros((), s.dtype), tree)
  step = decode_step.make_step(model)
  weights = jax.eval_shape(step.store_weights, weights)
  model.weights, model.state = scalars(weights), scalars(state)
  jitted = step.jitted
  x = jax.tree_util.tree_map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), signature)
  rng = jax.random.PRNGKey(0)
  _, steady = jax.eval_shape(jitted, x, weights, state, rng)  # tl.Cache full
  return hlo_op_counts(jitted.lower(x, weights, steady, rng).compile()
                       .as_text())


def _hlo_computations(text):
  """{computation name: [(op kind, instruction text)]}, and the entry's."""
  computations, entry, name = {}, None, None
  for line in text.split('\n'):
    header = re.match(r'(ENTRY )?%?([\w.-]+) \(.*\{$', line)
    if header and not line.startswith(' '):
      name = header.group(2)
      computations[name] = []
      if header.group(1):
        entry = name
    elif line.startswith('}'):
      name = None
    elif name is not None and ' = ' in line:
      match = re.search(r' ([a-z][\w-]*)\(', ' ' + line.split(' = ', 1)[1])
      computations[name].append((match.group(1) if match else '?', line))
  return computations, entry


def hlo_op_counts(text):
  """{op kind: count} of an optimized HLO module's entry computation.

  Free instructions (parameters, constants, tuples, bitcasts) do not count;
  a `conditional` counts once plus the operations of its largest branch; a
  `while` once plus one pass of its condition and body (the trip count is
  not known here); a `call` its callee's operations.
  """
  computations, entry = _hlo_computations(text)

  def count(name, seen=()):
    counts = collections.Counter()
    for kind, line in computations.get(name, ()):
      if kind in _FREE_HLO_OPS:
        continue
      if kind != 'call':
        counts[kind] += 1
      if name in seen:
        continue
      inner = seen + (name,)
      if kind == 'conditional':
        branches = re.search(r'branch_computations=\{([^}]*)\}', line)
        names = ([b.strip().lstrip('%') for b in branches.group(1).split(',')]
                 if branches else re.findall(
                     r'(?:true|false)_computation=%?([\w.-]+)', line))
        counts.update(max((count(b, inner) for b in names),
                          key=lambda c: sum(c.values()),
                          default=collections.Counter()))
      elif kind == 'while':
        for key in ('condition', 'body'):
          callee = re.search(key + r'=%?([\w.-]+)', line)
          if callee:
            counts.update(count(callee.group(1), inner))
      elif kind == 'call':
        callee = re.search(r'to_apply=%?([\w.-]+)', line)
        if callee:
          counts.update(count(callee.group(1), inner))
    return counts

  return dict(count(entry))


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


def busy_ns(events, spans):
  """Nanoseconds of `spans` [(start, end)] during which at least one of
  `events` (operation events, any thread) runs: the rest of a span is time
  between operations (dispatch, waits), when no operation of the step runs."""
  intervals = sorted((e[4], e[4] + e[5]) for e in events)
  total = 0
  for a, b in spans:
    covered_to = a
    for start, end in intervals:
      start, end = max(start, covered_to), min(end, b)
      if end > start:
        total += end - start
        covered_to = end
  return total


def kind(op):
  """'ffi_call.13' -> 'ffi_call'; 'wrapped_slice.1' -> 'wrapped_slice';
  XLA's loop fusions ('add_rsqrt_fusion.2') -> 'fusion'; XNNPACK's
  'ynn_fusion.8' -> 'ynn_fusion'."""
  name = re.sub(r'(\.\d+)*(\.clone)?$', '', op)
  if name.endswith('fusion') and name != 'ynn_fusion':
    return 'fusion'
  return name


def hlo_lines(hlo_text):
  """{instruction name: 'opcode shape [target [<- operand shapes]] (op_name
  tail)'}: a kernel's operand shapes (its operand_layout_constraints, without
  the layouts) tell which layer called it."""
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
      operands = _OPERANDS.search(line)
      if operands:
        desc += ' <- ' + _LAYOUT.sub('', operands.group(1))
    if op_name:
      desc += f' ({op_name.group(1).split("/")[-1]})'
    lines[name] = desc
  return lines


def _group(op, described):
  """What `by_operation` sums `op` under: a kernel call's HLO line (target,
  output and operand shapes: the calls of one kind of layer), else its
  kind."""
  desc = described.get(op, '')
  if ' <- ' in desc or kind(op) == 'ffi_call':
    return re.sub(r' \([^()]*\)$', '', desc) or kind(op)
  return kind(op)


def summarize(trace_dir, module, steps, window, hlo_text=None, top=10):
  """The step program's operations, per step.

  module: the HLO module name of the step ('jit_' + the jitted function's
  name); steps: the steps run inside the `window` annotation (the timed
  ones). Returns a dict: steps, ops_per_step, ms_per_step (self time, all
  threads), wall_ms_per_step (the window's length), busy_ms_per_step (the
  part of it in which an operation of the step runs on some thread),
  by_kind [(kind, ms/step, ops/step)], by_operation [(kernel calls of one
  HLO line, or another kind, ms/step, ops/step)] and slowest [(op, ms/step,
  HLO line)].
  """
  events, marks = operation_events(trace_file(trace_dir), window)
  if window not in marks:
    raise ValueError(f'the trace has no {window!r} annotation')
  own = self_times(events)
  spans = marks[window]
  step_events = [e for e in events if e[3] == module]
  per_op, count = collections.Counter(), collections.Counter()
  for e, t in zip(events, own):
    if e[3] == module:
      per_op[e[1]] += t
      count[e[1]] += 1
  if not per_op:
    raise ValueError(f'no operation of module {module} in the trace')
  described = hlo_lines(hlo_text)
  ms = lambda ns: ns / 1e6 / steps

  def summed_by(key):
    """[(key, ms/step, ops/step)] of the operations, most time first."""
    time, ops = collections.Counter(), collections.Counter()
    for op, t in per_op.items():
      time[key(op)] += t
      ops[key(op)] += count[op]
    return [(k, ms(t), ops[k] / steps) for k, t in time.most_common()]

  return {
      'steps': steps,
      'ops_per_step': sum(count.values()) / steps,
      'ms_per_step': ms(sum(per_op.values())),
      'wall_ms_per_step': ms(sum(b - a for a, b in spans)),
      'busy_ms_per_step': ms(busy_ns(step_events, spans)),
      'by_kind': summed_by(kind),
      'by_operation': summed_by(lambda op: _group(op, described)),
      'slowest': [(op, ms(t), described.get(op, ''))
                  for op, t in per_op.most_common(top)],
  }
