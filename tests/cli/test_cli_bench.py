"""terraformer-bench: one model per --config_file, errors, JSON, sweep."""
import json
import os
import re
import subprocess
import sys

import pytest

from terraformer.cli import bench as bench_cli
from terraformer.cli import bench_format

from bench_models import LM_GIN, SPARSE_GIN  # tests/bench_models.py

HERE = os.path.dirname(os.path.abspath(__file__))


def _configs(tmp_path):
  dense = tmp_path / 'dense.gin'
  dense.write_text(LM_GIN)
  sparse = tmp_path / 'sparse.gin'    # composed with dense.gin via '+'
  sparse.write_text(SPARSE_GIN)
  return str(dense), str(sparse)


def _run(capsys, *args):
  code = bench_cli.main(['terraformer-bench', *args])
  out, err = capsys.readouterr()
  return code, out, err


def _one_line_error(err, *parts):
  lines = [l for l in err.splitlines() if l.startswith('terraformer-bench')]
  assert len(lines) == 1, err
  assert lines[0].startswith('terraformer-bench: error: ')
  for part in parts:
    assert part in lines[0], lines[0]
  assert 'Traceback' not in err


def test_split_config_files():
  argv = ['prog', '--config_file=a.gin', '--tokens=3', '--config_file',
          'b.gin+c.gin', '--config=X.y = 1']
  rest, models = bench_cli.split_config_files(argv)
  assert rest == ['prog', '--tokens=3', '--config=X.y = 1']
  assert models == [['a.gin'], ['b.gin', 'c.gin']]
  taken = set()
  assert [bench_cli.model_name(m, taken) for m in
          (['x/a.gin'], ['b.gin', 'c.gin'], ['y/a.gin'])] == [
              'a', 'b+c', 'a#2']


@pytest.mark.parametrize('args, parts', [
    (['--config_file=nope.gin'], ["config file 'nope.gin' not found"]),
    (['--config_file={dense}+nope.gin'], ["'nope.gin' not found"]),
    ([], ['at least one --config_file']),
    (['--config_file={dense}', '--config=NoSuch.x = 1'], ['bad gin config',
                                                          'NoSuch']),
    (['--config_file={dense}', '--json={tmp}/no/such/dir/r.json'],
     ['--json', 'does not exist']),
    (['--config_file={dense}', '--sweep'], ['--sweep needs two or more']),
    (['--config_file={dense}', '--config_file={dense}', '--sweep',
      '--sweep_d_models=32,big'], ['--sweep_d_models']),
    (['--config_file={dense}', '--tokens=0'], ['tokens']),
    (['--config_file={sparse}'], ['no model configured']),
    (['--config_file={dense}', '--agreement'],
     ['--agreement needs two or more']),
    (['--config_file={dense}', '--config_file={dense}', '--agreement',
      "--config=bench_weights.created = 'stored'"],
     ['--agreement: dense', "bench_weights.created = 'stored'"]),
    (['--config_file={dense}', "--config=bench_weights.created = 'int4'"],
     ['bench_weights.created must be one of']),
])
def test_errors(tmp_path, capsys, args, parts):
  dense, sparse = _configs(tmp_path)
  args = [a.format(dense=dense, sparse=sparse, tmp=tmp_path) for a in args]
  code, out, err = _run(capsys, *args)
  assert code == 2
  assert out == ''
  _one_line_error(err, *parts)


def test_help(capsys):
  code, out, _ = _run(capsys, '--help')
  assert code == 0
  assert 'compare_trax' in out and 'sweep_d_models' in out
  assert 'EACH --config_file is one model' in out


def test_agreement_table_and_json(tmp_path, capsys):
  dense, sparse = _configs(tmp_path)
  bf16 = tmp_path / 'bf16.gin'
  bf16.write_text("decode_options.kernels = 'ffi'\n"
                  "decode_options.weights = 'bfloat16'\n")
  path = tmp_path / 'agreement.json'
  code, out, err = _run(capsys, '--agreement',
                        f'--config_file={dense}+{sparse}',
                        f'--config_file={dense}+{sparse}+{bf16}',
                        '--tokens=4', '--prompt_len=3', f'--json={path}')
  assert code == 0, err
  rows = out.splitlines()
  assert rows[0].split()[:3] == ['model', 'decode', 'path']
  assert rows[2].split()[0] == 'dense+sparse+bf16'
  report = json.loads(path.read_text())
  assert [r['max_abs_logit_delta'] == 0 for r in report] == [True, False]
  assert 'bfloat16' in report[1]['decode_path']


def test_table_and_json(tmp_path, capsys):
  dense, sparse = _configs(tmp_path)
  path = tmp_path / 'bench.json'
  code, out, err = _run(capsys, f'--config_file={dense}',
                        f'--config_file={dense}+{sparse}', '--tokens=2',
                        '--prompt_len=3', '--repeats=2', f'--json={path}')
  assert code == 0, err
  rows = out.splitlines()
  assert rows[0].split()[0] == 'model'
  assert [r.split()[0] for r in rows[1:3]] == ['dense', 'dense+sparse']
  report = json.loads(path.read_text())
  models = report['models']
  assert [m['name'] for m in models] == ['dense', 'dense+sparse']
  for m in models:
    for key in ('ms_per_token', 'ms_per_block', 'bytes_per_token',
                'bound_ms_per_token'):
      assert m[key] > 0 or key == 'ms_per_block', (key, m[key])
    assert m['bound_ms_per_token'] == pytest.approx(
        1e3 * m['bytes_per_token'] / (report['bandwidth_gbps'] * 1e9))
    # The table shows the same numbers.
    row = rows[1 + models.index(m)].split()
    assert float(row[1]) == pytest.approx(m['ms_per_token'], abs=0.051)
    assert float(row[4]) == pytest.approx(m['bytes_per_token'] / 1e6,
                                          abs=0.051)
  assert models[1]['bytes_per_token'] < models[0]['bytes_per_token']
  assert report['settings']['tokens'] == 2
  # Memory held per model (weights by layer kind, caches) and peak RSS.
  for m in models:
    held = sum(m['memory_by_kind'].values())
    assert held >= sum(v for k, v in m['memory_by_kind'].items()
                       if k != 'state (caches)') > 0
  assert [r.split(':')[0] for r in rows if r.startswith('memory ')] == [
      'memory dense', 'memory dense+sparse']
  assert report['peak_rss_bytes'] > held
  assert f"{report['peak_rss_bytes'] / 2**30:.2f} GiB" in rows[-1]


def test_plot_sweep_writes_png(tmp_path):
  rows = []
  for d, speedup in ((32, 1.5), (64, 2.0)):
    rows.append({'d_model': d, 'models': {
        'dense': {'speedup': 1.0, 'speedup_per_block': 1.0},
        'sparse': {'speedup': speedup, 'speedup_per_block': 2 * speedup}}})
  path = tmp_path / 'sweep.png'
  bench_format.plot_sweep({'names': ['dense', 'sparse'], 'rows': rows},
                          str(path))
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_sweep_writes_plot_and_json(tmp_path, capsys):
  dense, sparse = _configs(tmp_path)
  plot, path = tmp_path / 'sweep.png', tmp_path / 'sweep.json'
  code, out, err = _run(capsys, f'--config_file={dense}',
                        f'--config_file={dense}+{sparse}', '--sweep',
                        '--sweep_d_models=32,64', '--tokens=2',
                        '--prompt_len=3', '--repeats=1', f'--plot={plot}',
                        f'--json={path}')
  assert code == 0, err
  assert plot.read_bytes()[:4] == b'\x89PNG'
  report = json.loads(path.read_text())
  assert [row['d_model'] for row in report['rows']] == [32, 64]
  for row in report['rows']:
    assert row['models']['dense']['speedup'] == 1.0
    assert row['models']['dense+sparse']['bytes_per_token'] < (
        row['models']['dense']['bytes_per_token'])
  assert len([l for l in out.splitlines() if l.startswith('d_model')]) == 4


def test_console_script(tmp_path):
  dense, _ = _configs(tmp_path)
  exe = os.path.join(os.path.dirname(sys.executable), 'terraformer-bench')
  done = subprocess.run([exe, f'--config_file={dense}', '--tokens=2',
                         '--prompt_len=2', '--repeats=1'],
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.splitlines()[1].split()[0] == 'dense'


def test_project_layers_with_compare_trax_is_one_line_error(tmp_path, capsys):
  dense, _ = _configs(tmp_path)
  code, _, err = _run(capsys, f'--config_file={dense}', '--compare_trax',
                      '--project_layers=6')
  assert code == 2
  _one_line_error(err, '--project_layers and --compare_trax')


def test_profile_dir_writes_a_trace_per_model(tmp_path, capsys):
  dense, _ = _configs(tmp_path)
  code, out, err = _run(capsys, f'--config_file={dense}', '--tokens=2',
                        '--prompt_len=3', f'--profile_dir={tmp_path / "p"}')
  assert code == 0, err
  assert 'trace of 2 steps' in out
  traces = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / 'p' /
                                                          'dense')
            for f in files if f.endswith('.xplane.pb')]
  assert traces and all(os.path.getsize(t) > 0 for t in traces)
  # The summary of the trace: the 2 timed steps' operations, by kind, and
  # the slowest ones, each found in the compiled step's HLO.
  assert 'dense: 2 steps, ' in out
  lines = out.splitlines()
  by_kind = next(l for l in lines if l.startswith('  by kind: '))
  assert 'fusion' in by_kind
  slowest = lines[lines.index('  slowest (ms/step):') + 1:]
  assert len(slowest) >= 5
  for line in slowest[:5]:
    parts = line.split(maxsplit=2)  # ms, operation, its HLO line
    assert len(parts) == 3 and float(parts[0]) >= 0, line
    assert re.match(r'\(?[a-z]+\d*\[', parts[2].split()[1]), line  # a shape


def test_profile_dir_must_be_a_folder(tmp_path, capsys):
  dense, _ = _configs(tmp_path)
  code, _, err = _run(capsys, f'--config_file={dense}',
                      f'--profile_dir={dense}')
  assert code != 0
  _one_line_error(err, '--profile_dir', 'is not a folder')
