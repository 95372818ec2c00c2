"""experiments/cli_tables.py: terraformer-bench / -eval / -export / -info
output as the docs' tables, and the figures named from them.

The bench input is a committed `terraformer-bench --json` file; its expected
cells are those the CLI's own text table printed in the same run (quoted in
tensorboard_exports/decode_17b_int8/README.md). The other inputs are written
here in the CLIs' shapes, their expected cells worked out by hand.
"""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location(
    'cli_tables', os.path.join(ROOT, 'experiments', 'cli_tables.py'))
cli_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli_tables)

BENCH_17B = os.path.join(ROOT, 'tensorboard_exports', 'decode_17b_int8',
                         'bench_s28.json')


def _run(tmp_path, *args):
  out = tmp_path / 'table.json'
  code = cli_tables.main([args[0], f'--out={out}', *args[1:]])
  return code, (json.loads(out.read_text()) if out.exists() else None)


def test_speed_table_has_the_clis_cells_and_labels(tmp_path, capsys):
  code, table = _run(
      tmp_path, 'speed', BENCH_17B, '--label=17b_dense_kernels_int8=dense',
      '--columns=model,ms/token [min-max],speedup,per block',
      '--paper=17b_dense_kernels_int8=1x',
      '--figure=loss=17b_sparse_ff_qkv_loss_kernels_int8:speedup')
  assert code == 0
  assert table['columns'] == ['model', 'ms/token [min-max]', 'speedup',
                              'per block', 'paper']
  assert table['rows'][0] == ['dense', '961.9 [780.1-1014.6]', '1.00x',
                              '1.00x', '1x']
  assert table['rows'][3] == ['17b_sparse_ff_qkv_kernels_int8',
                              '103.2 [98.7-105.1]', '9.32x', '14.09x', '–']
  assert capsys.readouterr().out == 'loss=10.39x\n'


def test_markdown_figures_mean_and_difference(tmp_path, capsys):
  md = tmp_path / 'table.md'
  md.write_text('| run | 500 | 1000 |\n| --- | --- | --- |\n'
                '| A, seed 0 | 5.000 | 4.100 |\n| A, seed 1 | 5.200 | 4.200 |\n'
                '| B, seed 0 | 4.900 | 4.000 |\n')
  code, table = _run(tmp_path, 'markdown', str(md),
                     '--figure=a=A, seed 0|A, seed 1:1000',
                     '--figure=d=B, seed 0:1000 - A, seed 0|A, seed 1:1000',
                     '--figure=one=B, seed 0:500')
  assert code == 0
  assert table == {'columns': ['run', '500', '1000'],
                   'rows': [['A, seed 0', '5.000', '4.100'],
                            ['A, seed 1', '5.200', '4.200'],
                            ['B, seed 0', '4.900', '4.000']]}
  assert capsys.readouterr().out == 'a=4.150\nd=-0.150\none=4.900\n'


def test_rouge_table_puts_the_model_beside_its_yardsticks(tmp_path):
  summary = {'rouge1': 0.25, 'rouge2': 0.015, 'rougeLsum': 0.2,
             'rougeL': 0.16, 'baseline_k': 3, 'baseline_seed': 0,
             'baselines': {
                 'lead_3': {'rouge1': 0.27, 'rouge2': 0.0671,
                            'rougeL': 0.15, 'sentences': 3},
                 'lead_matched': {'rouge1': 0.3187, 'rouge2': 0.08,
                                  'rougeL': 0.1647, 'sentences': 4.74},
                 'random_3': {'rouge1': 0.2, 'rouge2': 0.03, 'rougeL': 0.12,
                              'sentences': 3}}}
  path = tmp_path / 'eval_test_step200.json'
  path.write_text(json.dumps(summary))
  code, table = _run(tmp_path, 'rouge', str(path))
  assert code == 0
  assert table['columns'] == ['F1 (%)', 'ROUGE-1', 'ROUGE-2', 'ROUGE-L']
  assert table['rows'] == [
      ['model', '25.00', '1.50', '16.00'],
      ['lead-3', '27.00', '6.71', '15.00'],
      ['lead-k matched (mean k 4.7)', '31.87', '8.00', '16.47'],
      ['random 3 (seed 0)', '20.00', '3.00', '12.00']]


def test_plan_rows_in_gib(tmp_path):
  gib = 2 ** 30
  info = {'per_device': {
      'devices': 8, 'weights_bytes_per_device': gib // 2,
      'slots_bytes_per_device': gib, 'activation_bytes_per_device': gib // 4,
      'total_bytes_per_device': gib * 7 // 4}}
  path = tmp_path / 'info.json'
  path.write_text(json.dumps(info))
  code, table = _run(tmp_path, 'plan', f'`x.gin`={path}')
  assert code == 0
  assert table['rows'] == [['`x.gin`', '8', '0.500', '1.000', '0.250',
                            '1.750']]


@pytest.mark.parametrize('args, says', [
    (('speed', 'missing.json'), 'missing.json'),
    (('projection', BENCH_17B), 'is not what projection reads'),
    (('speed', BENCH_17B, '--figure=x=dense:nope'), "no column 'nope'"),
    (('speed', BENCH_17B, '--figure=x=nobody:speedup'), "no row 'nobody'"),
    (('speed', BENCH_17B, '--columns=model,nope'), 'no column(s) nope'),
])
def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys, args, says):
  code, table = _run(tmp_path, *args)
  err = capsys.readouterr().err
  assert code == 2 and table is None
  assert says in err and err.count('\n') == 1
