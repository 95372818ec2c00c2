"""experiments/long_input_cst_lm.py: how far each CST LM row trains (equal
wall time by the bench's step times) and its table at equal steps and equal
time. Inputs in the shapes their makers write (terraformer-memory-bench
--json, terraformer-export's scalars.json); expected values worked out by
hand."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'experiments'))
import long_input_cst_lm as cst_lm  # pylint: disable=wrong-import-position


def _bench(path, ms):
  models = {name: [{'input_len': 256, 'step_ms': value,
                    'memory': {'argument': 1, 'output': 1, 'temp': 1,
                               'total': 3 * 2 ** 20}}]
            for name, value in ms.items()}
  path.write_text(json.dumps({'batch_size': 8, 'target_len': 256,
                              'models': models}))
  return str(path)


def _export(folder, runs):
  """runs: {label: (log-ppl points, steps-per-second points)}."""
  folder.mkdir()
  data = {'runs': [
      {'label': label, 'logdir': label, 'metrics': {
          cst_lm.LOG_PPL: [{'step': s, 'value': v, 'wall_time': 0.0}
                           for s, v in ppl],
          cst_lm.STEPS_PER_S: [{'step': s, 'value': v, 'wall_time': 0.0}
                               for s, v in rates]}}
      for label, (ppl, rates) in runs.items()]}
  (folder / 'scalars.json').write_text(json.dumps(data))
  return str(folder)


def test_faster_rows_train_to_full_attentions_time(tmp_path):
  times = cst_lm.bench(_bench(tmp_path / 'b.json', {
      'full': 100.0, 'cst': 40.0, 'cst_b': 60.0, 'slow': 120.0}))
  got = cst_lm.targets(times, ['full', 'cst', 'cst_b', 'slow'], 2000, 250)
  # 2000 * 100 / 40 = 5000; 2000 * 100 / 60 = 3333 -> 3500; slower: 2000.
  assert got == {'full': 2000, 'cst': 5000, 'cst_b': 3500, 'slow': 2000}
  assert cst_lm.targets(times, ['cst', 'slow'], 2000, 250) == {
      'cst': 2000, 'slow': 2000}  # Without full: equal steps only.


def test_value_at_is_linear_between_evaluations_and_none_past_them():
  points = [(1, 8.0), (250, 6.0), (500, 5.0)]
  assert cst_lm.value_at(points, 375) == 5.5
  assert cst_lm.value_at(points, 250) == 6.0
  assert cst_lm.value_at(points, 500) == 5.0
  assert cst_lm.value_at(points, 501) is None


def test_table_at_equal_steps_and_at_full_attentions_time(tmp_path, capsys):
  bench = _bench(tmp_path / 'b.json', {'full': 100.0, 'cst': 40.0})
  # Full reaches step 500 in 500 * 100 ms: CST makes 1250 steps then.
  export = _export(tmp_path / 'export', {
      'full_s0': ([(1, 8.0), (250, 6.0), (500, 5.0)],
                  [(1, 0.05), (250, 9.0), (500, 10.0)]),
      'full_s1': ([(1, 8.0), (250, 6.2), (500, 5.2)],
                  [(1, 0.05), (250, 9.0), (500, 5.0)]),
      'cst_s0': ([(1, 8.0), (250, 6.5), (500, 5.5), (1000, 5.0), (1250, 4.8)],
                 [(1, 0.05), (250, 9.0), (500, 25.0), (1250, 25.0)]),
      'cst_s1': ([(1, 8.0), (250, 6.7), (500, 5.7), (1000, 5.2), (1500, 4.6)],
                 [(1, 0.05), (250, 9.0), (500, 20.0), (1500, 25.0)]),
  })
  out = tmp_path / 't.json'
  assert cst_lm.main(['table', f'--export={export}', f'--bench={bench}',
                      '--steps=250,500', f'--out={out}',
                      'Full=full:full_s0,full_s1',
                      'CST=cst:cst_s0,cst_s1']) == 0
  table = json.loads(out.read_text())
  assert table['columns'] == [
      'row', 'log-ppl at 250', 'log-ppl at 500', 'vs full at 500', 'step ms',
      'speed vs full', 'MiB', 'log ms/step', "steps in full's time",
      "log-ppl in full's time", "vs full in full's time"]
  full, cst = table['rows']
  assert full == ['Full', '6.100 (6.000, 6.200)', '5.100 (5.000, 5.200)',
                  '+0.000', '100', '1.00x', '3', '150', '500',
                  '5.100 (5.000, 5.200)', '+0.000']
  # Seed 1 at 1250: 5.2 + (4.6 - 5.2) * 250 / 500 = 4.9. Logged ms: 40,
  # 40 (s0), 50, 40 (s1): median 40.
  assert cst == ['CST', '6.600 (6.500, 6.700)', '5.600 (5.500, 5.700)',
                 '+0.500', '40', '2.50x', '3', '40', '1250',
                 '4.850 (4.800, 4.900)', '-0.250']
  assert '| CST | 6.600 (6.500, 6.700) |' in capsys.readouterr().out


def test_a_run_short_of_full_attentions_time_has_no_equal_time_cell(tmp_path):
  bench = _bench(tmp_path / 'b.json', {'full': 100.0, 'cst': 40.0})
  export = _export(tmp_path / 'export', {
      'full_s0': ([(250, 6.0), (500, 5.0)], []),
      'cst_s0': ([(250, 6.5), (500, 5.5)], []),
  })
  columns, rows = cst_lm.table(cst_lm._runs(export), cst_lm.bench(bench),  # pylint: disable=protected-access
                               [('Full', 'full', ['full_s0']),
                                ('CST', 'cst', ['cst_s0'])], [500])
  cells = dict(zip(columns, rows[1]))
  assert cells['log-ppl at 500'] == '5.500'
  assert cells["log-ppl in full's time"] == cst_lm.MISSING
  assert cells["vs full in full's time"] == cst_lm.MISSING
  assert cells['log ms/step'] == cst_lm.MISSING


def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys):
  bench = _bench(tmp_path / 'b.json', {'full': 100.0})
  export = _export(tmp_path / 'export', {'full_s0': ([(500, 5.0)], [])})
  args = ['table', f'--export={export}', f'--bench={bench}', '--steps=500',
          f'--out={tmp_path / "t.json"}']
  assert cst_lm.main(args + ['Full=full:full_s0', 'CST=cst:cst_s0']) == 2
  assert cst_lm.main(args + ['CST=cst:full_s0']) == 2  # No full row.
  assert cst_lm.main(['targets', f'--bench={tmp_path / "none.json"}',
                      '--steps=10', '--every=5', 'full']) == 2
  errors = capsys.readouterr().err.strip().split('\n')
  assert len(errors) == 3
  assert all(e.startswith('long_input_cst_lm.py: error: ') for e in errors)
