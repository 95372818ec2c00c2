"""Soak test of crash-safe training: kill -9 a run at random moments, resume.

  python -m terraformer.training.soak --work_dir=DIR [--kills=50] [--steps=200]
      [--checkpoint_every=5] [--max_delay=4] [--seed=0]
      [--config_file=gin/tiny/soak.gin] [--random_draws] [--config=BINDING]

First trains `--steps` steps uninterrupted (the reference). Then trains the
same config in another directory, SIGKILLs it a random time (uniform in
[0, max_delay] s) after its first progress line (once compiled), `--kills` times (mid-save included:
a tiny model spends much of its time saving), restarting it after each kill,
and checks every restart:

  * it resumed from the newest committed checkpoint on disk at the kill;
  * at most one checkpoint interval of steps was lost;
  * no run printed a traceback;
and, once the run completes, that its weights and optimizer slots
(`model.pkl.gz`) are bit-identical to the reference, which never resumed,
and so is its last progress line (train loss and eval metrics). Prints one
line per kill and a summary; exits 0 only if every check passed.

The default config (tiny/soak.gin: a dense LM without dropout) draws no
random numbers while training, so it cannot show a resume that restores the
wrong rng (as when the checkpoint of an eval step held the rng of before
the evals). `--random_draws` soaks the same LM with sparse FF, QKV and loss
and dropout 0.1 (`RANDOM_DRAWS`): every step then draws from the loop's rng.
`--config` adds gin bindings (repeatable), to both runs.
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from terraformer import config
from terraformer.checkpoint import format as checkpoint_format
from terraformer.checkpoint import store as checkpoints

_GIN_DIR = config.GIN_DIR
_PROGRESS = re.compile(r'^step (\d+)/')
_RESUMED = re.compile(r'^Resuming from checkpoint at step (\d+)')
# --random_draws: the soak LM with layers that draw from the rng every step.
RANDOM_DRAWS = ('ScalingTransformerLM.ff_sparsity = 16',
                'ScalingTransformerLM.attention_sparsity = 4',
                'ScalingTransformerLM.loss_sparsity = 4',
                'ScalingTransformerLM.dropout = 0.1')


class _Run:
  """A terraformer-train child process whose stdout is read as it comes."""

  def __init__(self, args, output_dir):
    self.process = subprocess.Popen(
        [sys.executable, '-m', 'terraformer.cli.train', *args,
         f'--output_dir={output_dir}'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED='1'))
    self.lines, self.err = [], []
    self.training = threading.Event()  # Set at the first progress line.
    self._threads = [threading.Thread(target=self._read, args=(s, l))
                     for s, l in ((self.process.stdout, self.lines),
                                  (self.process.stderr, self.err))]
    for thread in self._threads:
      thread.start()

  def _read(self, stream, lines):
    for line in stream:
      lines.append(line.rstrip('\n'))
      if _PROGRESS.match(line):  # Compiled: steps now take milliseconds.
        self.training.set()
    if stream is self.process.stdout:
      self.training.set()  # Ended without training (e.g. already done).

  def wait(self):
    self.process.wait()
    for thread in self._threads:
      thread.join()
    return self.process.returncode

  def last(self, pattern):
    """The int of the last stdout line matching `pattern`, or None."""
    found = [int(m.group(1)) for m in map(pattern.match, self.lines) if m]
    return found[-1] if found else None


def _leftovers(output_dir):
  """Whether an interrupted save left files (the kill was mid-save)."""
  folder = os.path.join(output_dir, checkpoints.CHECKPOINTS)
  names = os.listdir(folder) if os.path.isdir(folder) else []
  return (any(not os.path.isfile(os.path.join(folder, n, checkpoints.MARKER))
              for n in names)
          or any('.tmp-' in n for n in os.listdir(output_dir)))


def _same_weights(dir_a, dir_b):
  a, b = (checkpoint_format.read_trax_checkpoint(
      os.path.join(d, 'model.pkl.gz')) for d in (dir_a, dir_b))
  flat = lambda c: list(c['flat_weights']) + [
      s for slots in c['slots_per_task'] for s in slots]
  return (a['step'] == b['step'] and len(flat(a)) == len(flat(b)) and
          all(np.array_equal(x, y) for x, y in zip(flat(a), flat(b))))


def _check_no_traceback(run, what, failures):
  if any('Traceback' in line for line in run.err):
    failures.append(f'{what}: traceback on stderr: '
                    + ' | '.join(run.err[-3:]))


def _last_progress(run):
  """The last progress line without its speed (`... | N steps/s`)."""
  lines = [l for l in run.lines if _PROGRESS.match(l)]
  return lines[-1].rsplit(' | ', 1)[0] if lines else None


def soak(work_dir, kills, steps, checkpoint_every, max_delay, seed,
         config_file, bindings=()):
  """Runs the soak; returns (summary line, list of failures)."""
  rng = random.Random(seed)
  args = [f'--config_file={config_file}', f'--steps={steps}',
          f'--config=terraformer.train.checkpoint_every = {checkpoint_every}']
  args += [f'--config={binding}' for binding in bindings]
  reference, soaked = (os.path.join(work_dir, n) for n in ('reference', 'run'))
  for folder in (reference, soaked):
    shutil.rmtree(folder, ignore_errors=True)
  failures = []
  run = _Run(args, reference)
  if run.wait() != 0:
    raise SystemExit('soak: the reference run failed: ' + ' | '.join(
        run.err[-3:]))
  reference_line = _last_progress(run)
  print(f'reference: {steps} steps uninterrupted in {reference}: '
        f'{reference_line}', flush=True)

  n_kills = n_mid_save = n_clean = 0
  lost = []
  run = _Run(args, soaked)
  while True:
    run.training.wait()
    if n_kills < kills and run.process.poll() is None:
      time.sleep(rng.uniform(0, max_delay))
    if n_kills >= kills or run.process.poll() is not None:
      code = run.wait()
      _check_no_traceback(run, 'final run', failures)
      if code != 0:
        failures.append(f'final run exited {code}: ' + ' | '.join(
            run.err[-3:]))
      break
    run.process.send_signal(signal.SIGKILL)
    run.wait()
    n_kills += 1
    reached = run.last(_PROGRESS) or 0
    committed = (checkpoints.committed_steps(soaked) or [0])[0]
    mid_save = _leftovers(soaked)
    n_mid_save += mid_save
    _check_no_traceback(run, f'kill {n_kills}', failures)
    run = _Run(args, soaked)
    run.training.wait()
    resumed = run.last(_RESUMED) or 0
    problems = []
    if resumed != committed:
      problems.append(f'resumed from {resumed}, newest committed {committed}')
    if reached - resumed > checkpoint_every:
      problems.append(f'lost {reached - resumed} > {checkpoint_every} steps')
    lost.append(max(0, reached - resumed))
    n_clean += not problems
    failures += [f'kill {n_kills}: {p}' for p in problems]
    print(f'kill {n_kills}/{kills}: reached step {reached}, newest committed '
          f'{committed}{" (killed mid-save)" if mid_save else ""} -> resumed '
          f'from {resumed}: {"; ".join(problems) or "ok"}', flush=True)
  equal = (os.path.isfile(os.path.join(soaked, 'model.pkl.gz')) and
           _same_weights(reference, soaked))
  if not equal:
    failures.append('final weights differ from the uninterrupted run')
  final_line = _last_progress(run)
  if final_line != reference_line:
    failures.append(f'final progress line {final_line!r} differs from the '
                    f'uninterrupted run\'s {reference_line!r}')
  summary = (f'soak: {n_kills} kills ({n_mid_save} mid-save), {n_clean} clean '
             f'resumes, steps lost max {max(lost, default=0)} mean '
             f'{np.mean(lost) if lost else 0:.1f} (checkpoint interval '
             f'{checkpoint_every}), final weights and slots '
             f'{"bit-identical to" if equal else "DIFFERENT from"} the '
             'uninterrupted run (never resumed), final eval line '
             f'{"equal" if final_line == reference_line else "DIFFERENT"}, '
             f'{len(failures)} failure(s)')
  return summary, failures


def main(argv=None):
  parser = argparse.ArgumentParser(prog='terraformer-soak',
                                   description=__doc__.split('\n')[0])
  parser.add_argument('--work_dir', required=True)
  parser.add_argument('--kills', type=int, default=50)
  parser.add_argument('--steps', type=int, default=200)
  parser.add_argument('--checkpoint_every', type=int, default=5)
  parser.add_argument('--max_delay', type=float, default=4.0)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--config_file',
                      default=os.path.join(_GIN_DIR, 'tiny', 'soak.gin'))
  parser.add_argument('--random_draws', action='store_true',
                      help='sparse layers and dropout: every step draws '
                      'from the rng (RANDOM_DRAWS)')
  parser.add_argument('--config', action='append', default=[],
                      help='a gin binding for both runs (repeatable)')
  flags = parser.parse_args(argv)
  bindings = (list(RANDOM_DRAWS) if flags.random_draws else []) + flags.config
  summary, failures = soak(flags.work_dir, flags.kills, flags.steps,
                           flags.checkpoint_every, flags.max_delay, flags.seed,
                           flags.config_file, bindings)
  for failure in failures:
    print(f'FAILED {failure}', flush=True)
  print(summary, flush=True)
  return 1 if failures else 0


if __name__ == '__main__':
  sys.exit(main())
