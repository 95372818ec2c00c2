"""terraformer.evaluation.export: TensorBoard scalars -> CSV, JSON, PNG."""
import csv
import functools
import json
import os
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from trax import jaxboard

from terraformer.evaluation import export
from terraformer.errors import TerraformerError

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'

# What each test run writes: folder -> tag -> [(step, value)].
V2_RUN = {  # tf.summary (summary v2: scalars stored as tensors).
    'train': {'metrics/loss': [(1, 3.5), (2, 2.25), (3, 1.125)]},
    'eval': {'metrics/log_perplexity': [(1, 3.25), (3, 1.5)]},
}
V1_RUN = {  # Trax's jaxboard (summary v1: simple_value), as Loop writes.
    'eval': {'metrics/log_perplexity': [(1, 3.0), (2, 2.0), (3, 1.0)],
             'metrics/accuracy': [(1, 0.1), (3, 0.7)]},
}


def write_v2(logdir, run):
  for folder, tags in run.items():
    writer = tf.summary.create_file_writer(os.path.join(logdir, folder))
    with writer.as_default():
      for tag, points in tags.items():
        for step, value in points:
          tf.summary.scalar(tag, value, step=step)
      tf.summary.text('gin_config', 'not a scalar', step=0)
    writer.close()


def write_v1(logdir, run):
  for folder, tags in run.items():
    writer = jaxboard.SummaryWriter(os.path.join(logdir, folder))
    for tag, points in tags.items():
      for step, value in points:
        writer.scalar(tag, value, step=step)
    writer.text('gin_config', 'not a scalar', step=0)
    writer.close()


def expected_metrics(run):
  return {f'{folder}/{tag}': [(s, float(np.float32(v))) for s, v in points]
          for folder, tags in run.items() for tag, points in tags.items()}


@pytest.fixture
def runs(tmp_path):
  v2, v1 = str(tmp_path / 'dense'), str(tmp_path / 'sparse')
  write_v2(v2, V2_RUN)
  write_v1(v1, V1_RUN)
  return v2, v1


def test_read_scalars_of_both_summary_versions(runs):
  for logdir, run in zip(runs, (V2_RUN, V1_RUN)):
    metrics = export.read_scalars(logdir)
    assert {m: [(s, v) for s, v, _ in points]
            for m, points in metrics.items()} == expected_metrics(run)
    for points in metrics.values():
      assert all(t > 1e9 for _, _, t in points)  # Wall times, in seconds.


def test_export_writes_csv_json_and_one_png_per_metric(runs, tmp_path,
                                                      monkeypatch):
  monkeypatch.chdir(tmp_path)
  out = tmp_path / 'out'
  result = export.export(runs, str(out), labels=['Dense', 'Sparse FF'])
  expected = {'Dense': expected_metrics(V2_RUN),
              'Sparse FF': expected_metrics(V1_RUN)}

  with open(out / 'scalars.csv') as f:
    rows = list(csv.DictReader(f))
  assert tuple(rows[0]) == export.CSV_FIELDS
  from_csv = {}
  for row in rows:
    from_csv.setdefault(row['run'], {}).setdefault(row['metric'], []).append(
        (int(row['step']), float(row['value'])))
  assert from_csv == expected

  with open(out / 'scalars.json') as f:
    data = json.load(f)
  assert [r['label'] for r in data['runs']] == ['Dense', 'Sparse FF']
  assert [r['logdir'] for r in data['runs']] == ['dense', 'sparse']
  from_json = {r['label']: {m: [(p['step'], p['value']) for p in points]
                            for m, points in r['metrics'].items()}
               for r in data['runs']}
  assert from_json == expected

  metrics = sorted(set(expected['Dense']) | set(expected['Sparse FF']))
  pngs = sorted(p for p in os.listdir(out) if p.endswith('.png'))
  assert pngs == sorted(m.replace('/', '_') + '.png' for m in metrics)
  for png in pngs:
    with open(out / png, 'rb') as f:
      content = f.read()
    assert content.startswith(PNG_MAGIC) and len(content) > 5000
  assert sorted(result['files']) == sorted(
      str(out / name) for name in pngs + ['scalars.csv', 'scalars.json'])


def test_metric_filter_and_default_labels(runs, tmp_path):
  out = tmp_path / 'out'
  export.export(runs, str(out), metrics='log_perplexity$')
  with open(out / 'scalars.json') as f:
    data = json.load(f)
  assert [r['label'] for r in data['runs']] == ['dense', 'sparse']
  assert all(list(r['metrics']) == ['eval/metrics/log_perplexity']
             for r in data['runs'])
  assert sorted(os.listdir(out)) == ['eval_metrics_log_perplexity.png',
                                     'scalars.csv', 'scalars.json']
  assert export.default_labels(['/a/x/run', '/b/y/run']) == ['x/run', 'y/run']


def test_scalars_json_names_run_folders_without_absolute_paths(
    runs, tmp_path, monkeypatch):
  """A run folder under the current directory is written relative to it;
  one elsewhere by its base name: no one machine's paths in an export."""
  monkeypatch.chdir(tmp_path)
  assert export.portable_logdir(os.path.join(str(tmp_path), 'runs', 'x')) == (
      'runs/x')
  assert export.portable_logdir('runs/x/') == 'runs/x'
  assert export.portable_logdir('/elsewhere/runs/s1/full_s0') == 'full_s0'
  assert export.portable_logdir(str(tmp_path)) == tmp_path.name
  monkeypatch.chdir(tmp_path.parent)
  out = tmp_path / 'out'
  result = export.export(runs, str(out))
  with open(out / 'scalars.json') as f:
    data = json.load(f)
  assert [r['logdir'] for r in data['runs']] == [
      f'{tmp_path.name}/dense', f'{tmp_path.name}/sparse']
  assert [r['logdir'] for r in result['runs']] == list(runs)  # As given.


def test_a_repeated_step_keeps_its_last_value(tmp_path):
  """A resumed run logs some steps again: the last value wins."""
  logdir = str(tmp_path / 'run')
  write_v1(logdir, {'eval': {'metrics/loss': [(1, 5.0), (2, 4.0)]}})
  time.sleep(1.1)  # Event file names hold the time in seconds.
  write_v1(logdir, {'eval': {'metrics/loss': [(2, 3.0), (3, 2.0)]}})
  assert len(os.listdir(os.path.join(logdir, 'eval'))) == 2
  points = export.read_scalars(logdir)['eval/metrics/loss']
  assert [(s, v) for s, v, _ in points] == [(1, 5.0), (2, 3.0), (3, 2.0)]


def test_errors(runs, tmp_path):
  no_events = tmp_path / 'no_events'
  no_events.mkdir()
  (no_events / 'notes.txt').write_text('not an event file')
  with pytest.raises(TerraformerError, match='no TensorBoard event files'):
    export.read_scalars(str(no_events))
  with pytest.raises(TerraformerError, match='is not a directory'):
    export.read_scalars(str(tmp_path / 'missing'))
  text_only = tmp_path / 'text_only'
  writer = jaxboard.SummaryWriter(str(text_only))
  writer.text('gin_config', 'text', step=0)
  writer.close()
  with pytest.raises(TerraformerError, match='no scalar summaries'):
    export.read_scalars(str(text_only))
  with pytest.raises(TerraformerError, match='1 label.* for 2 logdir'):
    export.export(runs, str(tmp_path / 'o'), labels=['one'])
  with pytest.raises(TerraformerError, match='labels must be unique'):
    export.export(runs, str(tmp_path / 'o'), labels=['a', 'a'])
  with pytest.raises(TerraformerError, match='no metric matches'):
    export.export(runs, str(tmp_path / 'o'), metrics='nothing')
  assert not (tmp_path / 'o').exists()


def test_export_of_a_real_training_run(tmp_path):
  """A 3-step Loop run: the exported eval metrics are its history's."""
  from trax.supervised import lr_schedules  # pylint: disable=g-import-not-at-top
  from terraformer.training import loop as training  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), 'training'))
  import test_loop as test_training  # pylint: disable=g-import-not-at-top
  loop = training.train(
      str(tmp_path / 'run'), model=test_training.tiny_lm,
      train_stream=test_training.counting_stream(),
      eval_stream=test_training.counting_stream(seed=1), steps=3,
      lr_schedule_fn=functools.partial(lr_schedules.constant, 0.01),
      eval_every=1, eval_batches=1, checkpoint_every=3, random_seed=0)
  metrics = export.read_scalars(str(tmp_path / 'run'))
  for name in ('loss', 'accuracy', 'log_perplexity'):
    history = loop.history.get('eval', f'metrics/{name}')
    assert [s for s, _ in history] == [1, 2, 3]
    exported = metrics[f'eval/metrics/{name}']
    assert [s for s, _, _ in exported] == [1, 2, 3]
    np.testing.assert_allclose([v for _, v, _ in exported],
                               [v for _, v in history], rtol=1e-6)
  assert [s for s, _, _ in metrics['train/metrics/loss']] == [1, 2, 3]
