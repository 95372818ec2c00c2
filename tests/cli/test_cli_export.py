"""terraformer-export: runs' TensorBoard scalars to CSV, JSON and PNG."""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest
from trax import jaxboard

from terraformer.cli import export as export_cli
from terraformer.errors import TerraformerError
from terraformer.evaluation import export

# folder -> tag -> [(step, value)], as Trax's Loop writes them.
RUNS = {
    'dense': {'eval': {'metrics/log_perplexity': [(1, 7.5), (200, 6.25)]},
              'train': {'metrics/loss': [(1, 7.75), (200, 6.5)]}},
    'sparse': {'eval': {'metrics/log_perplexity': [(1, 7.25), (200, 6.0)]}},
}


@pytest.fixture
def logdirs(tmp_path):
  paths = []
  for name, folders in RUNS.items():
    for folder, tags in folders.items():
      writer = jaxboard.SummaryWriter(str(tmp_path / name / folder))
      for tag, points in tags.items():
        for step, value in points:
          writer.scalar(tag, value, step=step)
      writer.close()
    paths.append(str(tmp_path / name))
  return paths


def _run(capsys, *args):
  code = export_cli.main(['terraformer-export', *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_exports_runs_with_labels(logdirs, tmp_path, capsys):
  out_dir = tmp_path / 'exports' / 'cmp'
  code, out, err = _run(capsys, f'--logdir={logdirs[0]}',
                        f'--logdir={logdirs[1]}', '--label=Dense',
                        '--label=Sparse FF', f'--out={out_dir}')
  assert code == 0, err
  assert out.splitlines() == [
      f'Dense: 2 metrics from {logdirs[0]}',
      f'Sparse FF: 1 metrics from {logdirs[1]}',
      f'Wrote 4 files to {out_dir}']
  assert sorted(os.listdir(out_dir)) == [
      'eval_metrics_log_perplexity.png', 'scalars.csv', 'scalars.json',
      'train_metrics_loss.png']
  with open(out_dir / 'scalars.csv') as f:
    rows = [(r['run'], r['metric'], int(r['step']), float(r['value']))
            for r in csv.DictReader(f)]
  expected = [(label, f'{folder}/{tag}', step, value)
              for label, name in (('Dense', 'dense'), ('Sparse FF', 'sparse'))
              for folder, tags in sorted(RUNS[name].items())
              for tag, points in tags.items() for step, value in points]
  assert sorted(rows) == sorted(expected)


def test_metrics_filter(logdirs, tmp_path, capsys):
  code, _, _ = _run(capsys, f'--logdir={logdirs[0]}', '--metrics=^train/',
                    f'--out={tmp_path / "o"}')
  assert code == 0
  assert sorted(os.listdir(tmp_path / 'o')) == [
      'scalars.csv', 'scalars.json', 'train_metrics_loss.png']


def test_table(logdirs, tmp_path, capsys):
  """--table prints the metric at the steps, one row per run, '–' where a
  run has no value there; table.md holds the same."""
  code, out, err = _run(capsys, f'--logdir={logdirs[0]}',
                        f'--logdir={logdirs[1]}', '--label=Dense',
                        '--label=Sparse FF', f'--out={tmp_path / "o"}',
                        '--table=eval/metrics/log_perplexity',
                        '--table_steps=200,1,300')
  assert code == 0, err
  table = ('| run | 200 | 1 | 300 |\n'
           '| --- | --- | --- | --- |\n'
           '| Dense | 6.250 | 7.500 | – |\n'
           '| Sparse FF | 6.000 | 7.250 | – |\n')
  assert out.splitlines()[2:] == table.splitlines() + [
      f'Wrote 5 files to {tmp_path / "o"}']
  assert (tmp_path / 'o' / 'table.md').read_text() == table


def test_table_minutes():
  """At equal wall-clock: the last value at or before each minute since the
  run's first point, with its step; '–' past the run's last point."""
  runs = [{'label': 'fast', 'metrics': {'m': [(1, 7.0, 100.0),
                                              (250, 5.0, 160.0),
                                              (500, 4.0, 220.0)]}},
          {'label': 'slow', 'metrics': {'m': [(250, 5.5, 1000.0),
                                              (1, 7.5, 900.0)]}},
          {'label': 'other', 'metrics': {'n': [(1, 1.0, 0.0)]}}]
  assert export.markdown_table(runs, 'm', minutes=[0, 1, 2, 1.5]) == (
      '| run \\ minutes | 0 | 1 | 2 | 1.5 |\n'
      '| --- | --- | --- | --- | --- |\n'
      '| fast | 7.000 (1) | 5.000 (250) | 4.000 (500) | 5.000 (250) |\n'
      '| slow | 7.500 (1) | 7.500 (1) | – | 7.500 (1) |\n'
      '| other | – | – | – | – |\n')
  with pytest.raises(TerraformerError, match='either steps or minutes'):
    export.markdown_table(runs, 'm', steps=[1], minutes=[1])


def test_from_export_extends_an_earlier_export(logdirs, tmp_path, capsys):
  """An export's runs come back from its scalars.json (the run folders may be
  gone): a new logdir run is added after them, and one with an earlier
  label replaces that run in its place; the table covers them all."""
  earlier = tmp_path / 'earlier'
  code, _, err = _run(capsys, f'--logdir={logdirs[0]}',
                      f'--logdir={logdirs[1]}', '--label=Dense',
                      '--label=Sparse FF', f'--out={earlier}')
  assert code == 0, err
  with open(earlier / 'scalars.csv') as f:
    dense_rows = [r for r in csv.DictReader(f) if r['run'] == 'Dense']
  code, out, err = _run(
      capsys, f'--from_export={earlier}', f'--logdir={logdirs[1]}',
      f'--logdir={logdirs[0]}', '--label=Sparse FF', '--label=Dense again',
      f'--out={tmp_path / "o"}', '--table=eval/metrics/log_perplexity',
      '--table_steps=1,200')
  assert code == 0, err
  assert out.splitlines()[:3] == [  # The earlier run's folder as written.
      f'Dense: 2 metrics from {export.portable_logdir(logdirs[0])}',
      f'Sparse FF: 1 metrics from {logdirs[1]}',
      f'Dense again: 2 metrics from {logdirs[0]}']
  assert (tmp_path / 'o' / 'table.md').read_text() == (
      '| run | 1 | 200 |\n| --- | --- | --- |\n'
      '| Dense | 7.500 | 6.250 |\n| Sparse FF | 7.250 | 6.000 |\n'
      '| Dense again | 7.500 | 6.250 |\n')
  with open(tmp_path / 'o' / 'scalars.csv') as f:
    rows = list(csv.DictReader(f))
  assert [r for r in rows if r['run'] == 'Dense'] == dense_rows  # Exact.
  assert len([r for r in rows if r['run'] == 'Sparse FF']) == 2  # Not 4.
  # Labels repeated across earlier exports are ambiguous; a file that is not
  # an export's is one clear error.
  code, _, err = _run(capsys, f'--from_export={earlier}',
                      f'--from_export={earlier}', f'--out={tmp_path / "p"}')
  assert code == 2 and 'the earlier exports repeat a run label' in err
  (tmp_path / 'bad').mkdir()
  (tmp_path / 'bad' / 'scalars.json').write_text('{"rows": []}')
  code, _, err = _run(capsys, f'--from_export={tmp_path / "bad"}',
                      f'--out={tmp_path / "p"}')
  assert code == 2 and 'is not a terraformer-export scalars.json' in err
  assert not (tmp_path / 'p').exists()


def test_errors_are_one_line(logdirs, tmp_path, capsys):
  empty = tmp_path / 'empty'
  empty.mkdir()
  cases = [
      ([f'--out={tmp_path / "o"}'], '--logdir or --from_export is required'),
      ([f'--from_export={empty}', f'--out={tmp_path / "o"}'],
       f"no earlier export at '{empty}' (no {empty}/scalars.json)"),
      ([f'--logdir={logdirs[0]}'], '--out is required'),
      ([f'--logdir={empty}', f'--out={tmp_path / "o"}'],
       f"no TensorBoard event files (*tfevents*) under '{empty}'"),
      ([f'--logdir={logdirs[0]}', '--label=a', '--label=b',
        f'--out={tmp_path / "o"}'],
       '2 label(s) for 1 logdir(s); give one label per logdir, or none'),
      ([f'--logdir={logdirs[0]}', f'--out={tmp_path / "o"}', 'extra'],
       'unexpected argument(s): extra'),
      ([f'--logdir={logdirs[0]}', f'--out={tmp_path / "o"}',
        '--table=eval/metrics/log_perplexity'],
       '--table goes with one of --table_steps, --table_minutes'),
      ([f'--logdir={logdirs[0]}', f'--out={tmp_path / "o"}',
        '--table=eval/metrics/log_perplexity', '--table_steps=1',
        '--table_minutes=5'],
       '--table goes with one of --table_steps, --table_minutes'),
      ([f'--logdir={logdirs[0]}', f'--out={tmp_path / "o"}',
        '--table=eval/metrics/log_perplexity', '--table_steps=1,2k'],
       '--table_steps must be numbers, got 1,2k'),
      ([f'--logdir={logdirs[0]}', f'--out={tmp_path / "o"}',
        '--metrics=^train/', '--table=eval/metrics/log_perplexity',
        '--table_steps=1'],
       "table metric 'eval/metrics/log_perplexity' is not among the exported "
       "metrics ['train/metrics/loss']"),
  ]
  for args, message in cases:
    code, out, err = _run(capsys, *args)
    assert code == 2 and not out
    assert err == f'terraformer-export: error: {message}\n'
  assert not (tmp_path / 'o').exists()


def test_help(capsys):
  code, out, _ = _run(capsys, '--help')
  assert code == 0 and '--logdir' in out and '--label' in out


def test_installed_entry_point(logdirs, tmp_path):
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-export')
  result = subprocess.run(
      [exe, f'--logdir={logdirs[1]}', f'--out={tmp_path / "o"}'],
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stderr == ''  # TensorFlow's import notices are hidden.
  assert 'Wrote 3 files' in result.stdout
  with open(tmp_path / 'o' / 'scalars.csv') as f:
    values = [float(r['value']) for r in csv.DictReader(f)]
  np.testing.assert_array_equal(values, [7.25, 6.0])
