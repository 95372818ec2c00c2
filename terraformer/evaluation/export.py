"""Exports TensorBoard scalars of training runs as CSV, JSON and PNG plots.

Trax's Loop writes event files under `output_dir/train` and
`output_dir/eval`; each folder under a run's logdir that holds event files is
read with TensorBoard's `EventAccumulator`, and its scalars are named
`<folder>/<tag>`, e.g. `eval/metrics/log_perplexity`. Scalars may be stored
as summary-v1 `simple_value`s (Trax) or as summary-v2 scalar tensors
(`tf.summary.scalar`); both are read. A step logged twice (e.g. after a
resume) keeps its last value.

Outputs in `out_dir`: `scalars.csv` (one row per run, metric and step),
`scalars.json` (the same, nested by run and metric; each run's folder as
`portable_logdir` names it) and one PNG per metric
with every run on the same axes (like the paper's Figures 1, 3 and 5).
"""
import csv
import json
import os
import re

from terraformer.errors import TerraformerError

_EVENT_FILE = 'tfevents'
CSV_FIELDS = ('run', 'metric', 'step', 'value', 'wall_time')


def _event_dirs(logdir):
  """Folders under `logdir` (itself included) that hold event files."""
  found = []
  for folder, _, files in sorted(os.walk(logdir)):
    if any(_EVENT_FILE in f for f in files):
      found.append(folder)
  return found


def _tensor_scalar(event):
  """The float of a scalar tensor event, or None if it is not a scalar."""
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  value = tensor_util.make_ndarray(event.tensor_proto)
  if value.shape != () or value.dtype.kind not in 'fiub':
    return None
  return float(value)


def _read_folder(folder):
  """{tag: {step: (value, wall_time)}} of the scalars in one folder."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  # Keep every event (no purge of steps logged again after a restart): the
  # last value of a step wins below.
  accumulator = event_accumulator.EventAccumulator(
      folder, size_guidance={event_accumulator.SCALARS: 0,
                             event_accumulator.TENSORS: 0},
      purge_orphaned_data=False)
  accumulator.Reload()
  tags = accumulator.Tags()
  scalars = {}
  for tag in tags.get(event_accumulator.SCALARS, []):
    for event in accumulator.Scalars(tag):
      scalars.setdefault(tag, {})[event.step] = (float(event.value),
                                                 event.wall_time)
  for tag in tags.get(event_accumulator.TENSORS, []):
    plugin = accumulator.SummaryMetadata(tag).plugin_data.plugin_name
    if plugin != 'scalars':  # Text (e.g. Trax's gin config), histograms...
      continue
    for event in accumulator.Tensors(tag):
      value = _tensor_scalar(event)
      if value is not None:
        scalars.setdefault(tag, {})[event.step] = (value, event.wall_time)
  return scalars


def read_scalars(logdir):
  """{metric: [(step, value, wall_time), ...] sorted by step} of one run.

  Raises TerraformerError if `logdir` is missing or has no scalar events.
  """
  logdir = os.path.expanduser(logdir)
  if not os.path.isdir(logdir):
    raise TerraformerError(f'logdir {logdir!r} is not a directory')
  folders = _event_dirs(logdir)
  if not folders:
    raise TerraformerError(
        f'no TensorBoard event files (*tfevents*) under {logdir!r}')
  metrics = {}
  for folder in folders:
    prefix = os.path.relpath(folder, logdir).replace(os.sep, '/')
    for tag, by_step in _read_folder(folder).items():
      name = tag if prefix == '.' else f'{prefix}/{tag}'
      metrics[name] = [(step, value, wall_time) for step, (value, wall_time)
                       in sorted(by_step.items())]
  if not metrics:
    raise TerraformerError(f'no scalar summaries in the event files under '
                           f'{logdir!r}')
  return dict(sorted(metrics.items()))


def read_export(out_dir):
  """The runs of an earlier export: [{'label', 'logdir', 'metrics'}] from
  `out_dir/scalars.json`, metrics as in `read_scalars`.

  So a committed export can be extended after its run folders are gone.
  Raises TerraformerError if the file is missing or not an export's.
  """
  path = os.path.join(os.path.expanduser(out_dir), 'scalars.json')
  try:
    with open(path) as f:
      data = json.load(f)
    runs = [{'label': run['label'], 'logdir': run['logdir'],
             'metrics': {m: [(p['step'], p['value'], p['wall_time'])
                             for p in points]
                         for m, points in run['metrics'].items()}}
            for run in data['runs']]
  except FileNotFoundError:
    raise TerraformerError(f'no earlier export at {out_dir!r} (no '
                           f'{path})') from None
  except (ValueError, KeyError, TypeError) as e:
    raise TerraformerError(f'{path} is not a terraformer-export '
                           f'scalars.json: {e!r}') from None
  if not runs:
    raise TerraformerError(f'{path} holds no runs')
  return runs


def portable_logdir(logdir):
  """How `scalars.json` names a run's folder: its path relative to the
  current directory when it lies under it, else its base name, so that a
  committed export holds no one machine's absolute paths."""
  path = os.path.normpath(os.path.abspath(os.path.expanduser(logdir)))
  relative = os.path.relpath(path, os.getcwd())
  if relative == os.curdir or relative.split(os.sep)[0] == os.pardir:
    return os.path.basename(path)
  return relative.replace(os.sep, '/')


def default_labels(logdirs):
  """Run labels: each logdir's base name, made unique with its parents."""
  paths = [os.path.normpath(os.path.abspath(os.path.expanduser(d)))
           for d in logdirs]
  depth = 1
  while True:
    labels = ['/'.join(p.split(os.sep)[-depth:]) for p in paths]
    if len(set(labels)) == len(labels) or depth > max(
        len(p.split(os.sep)) for p in paths):
      return labels
    depth += 1


def _file_name(metric):
  return re.sub(r'[^A-Za-z0-9_.-]+', '_', metric).strip('_') or 'metric'


def _plot(metric, runs, path):
  """One PNG: `metric` against step, one line per run."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  try:
    for label, points in runs:
      steps = [p[0] for p in points]
      values = [p[1] for p in points]
      ax.plot(steps, values, marker='o' if len(points) < 30 else None,
              markersize=3, label=label)
    ax.set_xlabel('Number of steps')
    ax.set_ylabel(metric.split('/')[-1].replace('_', ' '))
    ax.set_title(metric)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
  finally:
    plt.close(fig)


def _cell_at_minute(points, minute, digits):
  """The last (step, value) at or before `minute` since the first point;
  '–' with no point or past the last one."""
  if not points:
    return '–'
  start = min(t for _, _, t in points)
  if max(t for _, _, t in points) - start < 60 * minute:
    return '–'
  step, value = [(s, v) for s, v, t in points if t - start <= 60 * minute][-1]
  return f'{value:.{digits}f} ({step})'


def markdown_table(runs, metric, steps=None, minutes=None, digits=3):
  """`metric` as a Markdown table, one row per run: the tables of docs/.

  Columns are either `steps` (the value at that step, '–' where the run has
  none) or `minutes` of wall-clock since the run's first point of `metric`
  (the last value at or before then, with its step: "4.331 (2750)"; '–'
  past the run's last point), for comparisons at equal training time of
  runs that ran under the same load.
  """
  if (steps is None) == (minutes is None):
    raise TerraformerError('give the table either steps or minutes')
  columns = steps if minutes is None else minutes
  head = 'run' if minutes is None else 'run \\ minutes'
  lines = [f'| {head} | ' + ' | '.join(f'{c:g}' if minutes else str(c)
                                       for c in columns) + ' |',
           '| --- |' + ' --- |' * len(columns)]
  for run in runs:
    points = sorted(run['metrics'].get(metric, ()))
    if minutes is None:
      values = {s: v for s, v, _ in points}
      cells = [f'{values[c]:.{digits}f}' if c in values else '–'
               for c in columns]
    else:
      cells = [_cell_at_minute(points, c, digits) for c in columns]
    lines.append(f'| {run["label"]} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def export(logdirs, out_dir, labels=None, metrics=None, table=None,
           earlier=()):
  """Writes scalars.csv, scalars.json and one PNG per metric to `out_dir`.

  Args:
    logdirs: run directories (e.g. `terraformer-train --output_dir`s).
    earlier: folders of earlier exports whose runs (`read_export`) come
      first, in order; a logdir run with the label of an earlier run
      replaces it in its place (the same run read again, further on).
    out_dir: output folder (created).
    labels: one label per run; default: the logdirs' base names.
    metrics: regular expression; only matching metrics are exported
      (default: all).
    table: optional (metric, steps, minutes): also writes `table.md`, that
      metric at those steps or minutes (`markdown_table`).

  Returns:
    {'runs': [{'label', 'logdir', 'metrics': {...}}], 'files': [paths],
     'table': the Markdown table or None}.
  """
  logdirs = list(logdirs)
  earlier_runs = [run for folder in earlier for run in read_export(folder)]
  if not logdirs and not earlier_runs:
    raise TerraformerError('no logdir given')
  if labels:
    labels = list(labels)
    if len(labels) != len(logdirs):
      raise TerraformerError(
          f'{len(labels)} label(s) for {len(logdirs)} logdir(s); give one '
          'label per logdir, or none')
    if len(set(labels)) != len(labels):
      raise TerraformerError(f'labels must be unique, got {labels}')
  else:
    labels = default_labels(logdirs) if logdirs else []
  try:
    pattern = re.compile(metrics) if metrics else None
  except re.error as e:
    raise TerraformerError(f'bad metrics pattern {metrics!r}: {e}') from None
  earlier_labels = [run['label'] for run in earlier_runs]
  if len(set(earlier_labels)) != len(earlier_labels):
    raise TerraformerError(
        f'the earlier exports repeat a run label: {earlier_labels}')
  runs = list(earlier_runs)
  for label, logdir in zip(labels, logdirs):
    run = {'label': label, 'logdir': logdir, 'metrics': read_scalars(logdir)}
    if label in earlier_labels:  # In its place.
      runs[earlier_labels.index(label)] = run
    else:
      runs.append(run)
  if pattern:
    for run in runs:
      run['metrics'] = {m: v for m, v in run['metrics'].items()
                        if pattern.search(m)}
  names = sorted({m for run in runs for m in run['metrics']})
  if not names:
    raise TerraformerError(f'no metric matches {metrics!r}')
  if table and table[0] not in names:
    raise TerraformerError(f'table metric {table[0]!r} is not among the '
                           f'exported metrics {names}')

  os.makedirs(out_dir, exist_ok=True)
  files = []
  csv_path = os.path.join(out_dir, 'scalars.csv')
  with open(csv_path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(CSV_FIELDS)
    for run in runs:
      for metric, points in run['metrics'].items():
        for step, value, wall_time in points:
          writer.writerow([run['label'], metric, step, repr(value),
                           repr(wall_time)])
  files.append(csv_path)

  json_path = os.path.join(out_dir, 'scalars.json')
  with open(json_path, 'w') as f:
    json.dump({'runs': [
        {'label': run['label'], 'logdir': portable_logdir(run['logdir']),
         'metrics': {m: [{'step': s, 'value': v, 'wall_time': t}
                         for s, v, t in points]
                     for m, points in run['metrics'].items()}}
        for run in runs]}, f, indent=1)
  files.append(json_path)

  for metric in names:
    path = os.path.join(out_dir, _file_name(metric) + '.png')
    _plot(metric, [(run['label'], run['metrics'][metric]) for run in runs
                   if metric in run['metrics']], path)
    files.append(path)
  text = None
  if table:
    metric, steps, minutes = table
    text = markdown_table(runs, metric, steps=steps, minutes=minutes)
    path = os.path.join(out_dir, 'table.md')
    with open(path, 'w') as f:
      f.write(text)
    files.append(path)
  return {'runs': runs, 'files': files, 'table': text}
