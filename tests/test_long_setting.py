"""experiments/long_setting.py: when the long setting's pretraining and
fine-tuning stop, and its points of ROUGE against CPU-hours; the `curve`
table of tools/experiment_tables.py made from them.

The inputs are written here in the shapes their makers write (Trax's
jaxboard events, terraformer-eval's summaries, /usr/bin/time's lines); the
expected values are worked out by hand from them.
"""
import json
import os
import sys

import pytest
from trax import jaxboard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
sys.path.insert(0, os.path.join(ROOT, 'experiments'))
import experiment_tables as tables  # pylint: disable=wrong-import-position
import long_setting  # pylint: disable=wrong-import-position


def _events(logdir, points):
  writer = jaxboard.SummaryWriter(os.path.join(logdir, 'eval'))
  for step, value in points:
    writer.scalar('metrics/log_perplexity', value, step=step)
  writer.close()


def _summary(folder, split, step, rouge2, lead3=0.07):
  data = {'rouge1': rouge2 + 0.2, 'rouge2': rouge2, 'rougeL': rouge2 + 0.1,
          'log_perplexity': 5.0 - step / 1000,
          'baselines': {'lead_3': {'rouge1': 0.28, 'rouge2': lead3,
                                   'rougeL': 0.15},
                        'random_3': {'rouge1': 0.21, 'rouge2': 0.03,
                                     'rougeL': 0.12}},
          'fluency': {'model': {'known_trigrams': 0.25}}}
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, f'eval_{split}_step{step}.json'), 'w') as f:
    json.dump(data, f)


def test_plateau_when_the_drop_over_the_window_is_below_the_threshold(
    tmp_path, capsys):
  logdir = str(tmp_path / 'pretrain')
  _events(logdir, [(1, 7.5), (1000, 5.0), (2000, 4.5), (3000, 4.47)])
  args = ['plateau', f'--logdir={logdir}', '--window=1000', '--min_drop=0.05']
  assert long_setting.main(args + ['--step=2000']) == 1  # Fell by 0.5.
  assert 'still falling' in capsys.readouterr().out
  assert long_setting.main(args + ['--step=3000']) == 0  # Fell by 0.03.
  assert 'plateau (drop 0.0300' in capsys.readouterr().out
  assert long_setting.main(args + ['--step=2500']) == 2  # Not evaluated.
  assert 'no evaluation at step 2500' in capsys.readouterr().err
  assert long_setting.main(['plateau', f'--logdir={tmp_path / "none"}',
                            '--step=1000']) == 2


def test_early_stop_counts_evaluations_since_the_best(tmp_path, capsys):
  folder = str(tmp_path / 'finetune')
  args = ['early_stop', f'--dir={folder}', '--patience=3']
  assert long_setting.main(args) == 1  # Nothing evaluated yet.
  for step, r2 in ((100, 0.03), (200, 0.05), (300, 0.05), (400, 0.04)):
    _summary(folder, 'validation', step, r2)
  _summary(folder, 'test', 500, 0.0)  # Test scores never decide.
  assert long_setting.main(args) == 1
  # The earliest of equal scores is the best: 200, two evaluations since.
  assert 'ROUGE-2 5.00 at step 200, 2 evaluation(s)' in capsys.readouterr().out
  _summary(folder, 'validation', 500, 0.045)
  assert long_setting.main(args) == 0


def test_curve_adds_the_pretraining_cpu_and_chooses_on_validation(tmp_path):
  cpu = tmp_path / 'cpu_seconds.txt'
  cpu.write_text('pretrain 1000 100.0 90.0 10.0\n'
                 'Command exited with non-zero status 1\n'
                 'pretrain 2000 50.0 40.0 5.0\n'
                 'pretrain 2000 110.0 100.0 8.0\n'
                 'finetune_seed0 100 40.0 30.0 6.0\n'
                 'finetune_seed0 200 40.0 34.0 2.0\n'
                 'finetune_other 100 999.0 999.0 0.0\n'
                 'finetune_scratch 100 9.0 7.0 1.0\n')
  folder = str(tmp_path / 'finetune_seed0')
  for step, val, test in ((100, 0.04, 0.06), (200, 0.03, 0.08)):
    _summary(folder, 'validation', step, val, lead3=0.075)
    _summary(folder, 'test', step, test)
  _summary(folder, 'validation', 300, 0.09)  # No test score: not a point.
  scratch = str(tmp_path / 'finetune_scratch')
  _summary(scratch, 'validation', 100, 0.01)
  _summary(scratch, 'test', 100, 0.01)
  out = tmp_path / 'points.json'
  assert long_setting.main(['curve', f'--cpu={cpu}', f'--out={out}',
                            f'--csv={tmp_path / "p.csv"}',
                            f'--run=seed 0={folder}', f'--run=s={scratch}',
                            '--from_scratch=s']) == 0
  points = json.loads(out.read_text())
  pretrain_s = 90 + 10 + 40 + 5 + 100 + 8
  assert points['pretrain_steps'] == 2000
  assert points['pretrain_cpu_hours'] == pytest.approx(pretrain_s / 3600)
  run, scratch_run = points['runs']
  # Without pretraining: only the run's own CPU.
  assert scratch_run['points'][0]['cpu_hours'] == pytest.approx(8 / 3600)
  assert long_setting.main(['curve', f'--cpu={cpu}', f'--out={out}',
                            f'--run=s={scratch}', '--from_scratch=t']) == 2
  assert [p['step'] for p in run['points']] == [100, 200]
  assert [p['cpu_hours'] for p in run['points']] == pytest.approx(
      [(pretrain_s + 36) / 3600, (pretrain_s + 72) / 3600])
  assert [p['chosen'] for p in run['points']] == [True, False]
  assert run['points'][1]['test']['rouge2'] == 0.08
  assert points['yardsticks']['validation']['lead-3']['rouge2'] == 0.075
  assert points['yardsticks']['test']['lead-3']['rouge2'] == 0.07
  csv_lines = (tmp_path / 'p.csv').read_text().splitlines()
  assert len(csv_lines) == 4 and csv_lines[1].startswith('seed 0,100,')

  table = tmp_path / 'table.json'
  figures = tmp_path / 'figures.txt'
  assert tables.main(['curve', str(out), f'--out={table}',
                      f'--figures={figures}', '--figure=chosen=seed 0, '
                      'chosen on validation:test ROUGE-2']) == 0
  rows = json.loads(table.read_text())['rows']
  assert rows[0][:5] == ['seed 0, step 100', '100',
                         f'{(pretrain_s + 36) / 3600:.2f}', '24.00', '4.00']
  assert rows[3][0] == 'seed 0, chosen on validation'
  assert rows[3][7] == '6.00'
  assert rows[5] == ['lead-3', '–', '–', '28.00', '7.50', '–', '28.00',
                     '7.00', '–']
  assert figures.read_text() == 'chosen=6.00\n'


def test_curve_without_evaluated_steps_is_one_line(tmp_path, capsys):
  cpu = tmp_path / 'cpu_seconds.txt'
  cpu.write_text('')
  assert long_setting.main(['curve', f'--cpu={cpu}', f'--out={tmp_path}/p',
                            f'--run=a={tmp_path}']) == 2
  assert 'no step evaluated on both splits' in capsys.readouterr().err
