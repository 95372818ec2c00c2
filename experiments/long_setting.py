#!/usr/bin/env python3
"""The main job's long setting (experiments/main_job_long.sh): when to stop,
and its curve of ROUGE against CPU-hours.

  long_setting.py plateau --logdir=D --step=N [--window=1000] [--min_drop=0.05]
      exit 0 when the run's validation log-perplexity (Trax's
      eval/metrics/log_perplexity events) at step N is less than MIN_DROP
      below its value WINDOW steps earlier (the pretraining has reached its
      plateau), exit 1 while it still falls.
  long_setting.py early_stop --dir=D [--patience=3]
      exit 0 when the best validation ROUGE-2 of D's terraformer-eval
      summaries (eval_validation_step<N>.json) is PATIENCE or more
      evaluations old (stop fine-tuning), exit 1 otherwise.
  long_setting.py curve --run=LABEL=DIR[:STAGE] ... [--from_scratch=LABEL ...]
      --cpu=FILE --out=P.json [--plot=P.png] [--csv=P.csv]
      the points of each fine-tuning run DIR: every step evaluated on both
      splits, with the CPU-hours of its training so far (FILE: lines
      `STAGE STEPS WALL USER SYS` of /usr/bin/time, one per training
      command; the pretraining's lines count towards every run but those
      named by --from_scratch, a run's own lines are those of STAGE, default
      the folder's name), the step chosen on validation (best ROUGE-2) and
      the yardsticks of both splits.

The points JSON is what `experiment_tables.py curve` tabulates. A mistake
(a missing file, a run without evaluations) is one line on stderr, exit 2.
"""
import argparse
import glob
import json
import os
import re
import sys

EXIT_USAGE = 2
PRETRAIN = 'pretrain'
SPLITS = ('validation', 'test')
YARDSTICKS = (('lead_3', 'lead-3'), ('lead_matched', 'lead-k matched'),
              ('random_3', 'random-3 (seed 0)'))


class Error(Exception):
  pass


def _load(path):
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise Error(f'{path}: {e}') from None


def summaries(folder, split):
  """{step: terraformer-eval summary} of `folder` for `split`."""
  found = {}
  for path in glob.glob(os.path.join(folder, f'eval_{split}_step*.json')):
    match = re.search(r'_step(\d+)\.json$', path)
    if match:
      found[int(match.group(1))] = _load(path)
  return dict(sorted(found.items()))


def best_step(by_step):
  """The step of the highest ROUGE-2 (the earliest of equals)."""
  return max(by_step, key=lambda step: (by_step[step]['rouge2'], -step))


def plateau(logdir, step, window, min_drop):
  sys.path.insert(0, os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  from terraformer.evaluation import export  # pylint: disable=g-import-not-at-top
  from terraformer.errors import TerraformerError  # pylint: disable=g-import-not-at-top
  try:
    points = export.read_scalars(logdir).get('eval/metrics/log_perplexity')
  except TerraformerError as e:
    raise Error(str(e)) from None
  if not points:
    raise Error(f'{logdir}: no eval/metrics/log_perplexity events')
  value = {s: v for s, v, _ in points}
  if step not in value or step - window not in value:
    raise Error(f'{logdir}: no evaluation at step {step} and '
                f'{step - window} (evaluate every {window} steps or a '
                'divisor)')
  drop = value[step - window] - value[step]
  print(f'validation log-perplexity {value[step - window]:.4f} at step '
        f'{step - window}, {value[step]:.4f} at {step}: '
        f'{"plateau" if drop < min_drop else "still falling"} '
        f'(drop {drop:.4f}, threshold {min_drop})')
  return drop < min_drop


def early_stop(folder, patience):
  by_step = summaries(folder, 'validation')
  if not by_step:
    return False
  best = best_step(by_step)
  since = sum(step > best for step in by_step)
  print(f'best validation ROUGE-2 {100 * by_step[best]["rouge2"]:.2f} at '
        f'step {best}, {since} evaluation(s) since (patience {patience})')
  return since >= patience


def cpu_seconds(path):
  """[(stage, steps, user + sys seconds)] of /usr/bin/time's lines."""
  rows = []
  try:
    with open(path, encoding='utf-8') as f:
      for line in f:
        parts = line.split()
        if len(parts) == 5 and not line.startswith('Command'):
          rows.append((parts[0], int(parts[1]),
                       float(parts[3]) + float(parts[4])))
  except OSError as e:
    raise Error(f'{path}: {e.strerror}') from None
  return rows


def _scores(summary):
  keys = ('rouge1', 'rouge2', 'rougeL')
  out = {k: summary[k] for k in keys}
  out['log_perplexity'] = summary.get('log_perplexity')
  out['known_trigrams'] = summary['fluency']['model']['known_trigrams']
  return out


def curve(runs, cpu_file, from_scratch=()):
  timed = cpu_seconds(cpu_file)
  pretrain_s = sum(s for stage, _, s in timed if stage == PRETRAIN)
  pretrain_steps = max([n for stage, n, _ in timed if stage == PRETRAIN],
                       default=0)
  out = {'pretrain_steps': pretrain_steps,
         'pretrain_cpu_hours': pretrain_s / 3600, 'runs': [],
         'yardsticks': {}}
  for label, folder, stage in runs:
    by_split = {split: summaries(folder, split) for split in SPLITS}
    steps = sorted(set(by_split['validation']) & set(by_split['test']))
    if not steps:
      raise Error(f'{folder}: no step evaluated on both splits')
    own = [(n, s) for st, n, s in timed if st == stage]
    start_s = 0.0 if label in from_scratch else pretrain_s
    chosen = best_step({s: by_split['validation'][s] for s in steps})
    points = []
    for step in steps:
      # A command trains up to its step count: its CPU counts towards the
      # steps it reached (commands of the same count: retries).
      spent = start_s + sum(s for n, s in own if n <= step)
      points.append({'step': step, 'cpu_hours': spent / 3600,
                     'chosen': step == chosen,
                     **{split: _scores(by_split[split][step])
                        for split in SPLITS}})
    out['runs'].append({'label': label, 'dir': folder,
                        'pretrained': label not in from_scratch,
                        'points': points})
    for split in SPLITS:
      base = by_split[split][steps[0]].get('baselines') or {}
      out['yardsticks'].setdefault(split, {
          name: {k: base[key][k] for k in ('rouge1', 'rouge2', 'rougeL')}
          for key, name in YARDSTICKS if key in base})
  return out


def plot(points, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
  try:
    for ax, split in zip(axes, SPLITS):
      for run in points['runs']:
        xs = [p['cpu_hours'] for p in run['points']]
        ys = [100 * p[split]['rouge2'] for p in run['points']]
        line, = ax.plot(xs, ys, marker='o', markersize=3, label=run['label'])
        for p in run['points']:
          if p['chosen']:
            ax.plot([p['cpu_hours']], [100 * p[split]['rouge2']], marker='*',
                    markersize=12, color=line.get_color())
      for i, (name, scores) in enumerate(points['yardsticks'][split].items()):
        ax.axhline(100 * scores['rouge2'], linestyle='--', linewidth=1,
                   color=f'C{i + 5}', label=name)
      ax.set_title(f'{split} papers')
      ax.set_xlabel('CPU-hours of training (pretraining included)')
      ax.grid(True, alpha=0.3)
    axes[0].set_ylabel('ROUGE-2 F1 (%)')
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
  finally:
    plt.close(fig)


def write_csv(points, path):
  lines = ['run,step,cpu_hours,chosen,' + ','.join(
      f'{split}_{k}' for split in SPLITS
      for k in ('rouge1', 'rouge2', 'rougeL', 'log_perplexity',
                'known_trigrams'))]
  for run in points['runs']:
    for p in run['points']:
      cells = [run['label'], str(p['step']), f'{p["cpu_hours"]:.4f}',
               str(p['chosen']).lower()]
      for split in SPLITS:
        for k in ('rouge1', 'rouge2', 'rougeL', 'log_perplexity',
                  'known_trigrams'):
          v = p[split][k]
          cells.append('' if v is None else f'{v:.6f}')
      lines.append(','.join(cells))
  with open(path, 'w', encoding='utf-8') as f:
    f.write('\n'.join(lines) + '\n')


def _run_arg(value):
  label, sep, rest = value.rpartition('=')
  if not sep or not label:
    raise Error(f'--run: expected LABEL=DIR[:STAGE], got {value!r}')
  folder, _, stage = rest.partition(':')
  return label, folder, stage or os.path.basename(os.path.normpath(folder))


def main(argv=None):
  parser = argparse.ArgumentParser(
      prog='long_setting.py', description=__doc__.split('\n')[0])
  sub = parser.add_subparsers(dest='command', required=True)
  p = sub.add_parser('plateau')
  p.add_argument('--logdir', required=True)
  p.add_argument('--step', type=int, required=True)
  p.add_argument('--window', type=int, default=1000)
  p.add_argument('--min_drop', type=float, default=0.05)
  p = sub.add_parser('early_stop')
  p.add_argument('--dir', required=True)
  p.add_argument('--patience', type=int, default=3)
  p = sub.add_parser('curve')
  p.add_argument('--run', action='append', required=True)
  p.add_argument('--from_scratch', action='append', default=[])
  p.add_argument('--cpu', required=True)
  p.add_argument('--out', required=True)
  p.add_argument('--plot')
  p.add_argument('--csv')
  args = parser.parse_args(argv)
  try:
    if args.command == 'plateau':
      return 0 if plateau(args.logdir, args.step, args.window,
                          args.min_drop) else 1
    if args.command == 'early_stop':
      return 0 if early_stop(args.dir, args.patience) else 1
    runs = [_run_arg(r) for r in args.run]
    unknown = set(args.from_scratch) - {label for label, _, _ in runs}
    if unknown:
      raise Error(f'--from_scratch names no --run: {sorted(unknown)}')
    points = curve(runs, args.cpu, args.from_scratch)
    with open(args.out, 'w', encoding='utf-8') as f:
      json.dump(points, f, indent=1)
    if args.plot:
      plot(points, args.plot)
    if args.csv:
      write_csv(points, args.csv)
    print(f'(written to {args.out})')
    return 0
  except Error as e:
    print(f'long_setting.py: error: {e}', file=sys.stderr)
    return EXIT_USAGE


if __name__ == '__main__':
  sys.exit(main())
