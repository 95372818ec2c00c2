"""tools/experiment_tables.py: the CLIs' tables (as their --json holds
them) picked for the results files, the tables no CLI prints, and the
figures named from them.

The CLIs' tables are made here by the CLIs' own formatters
(terraformer/cli/bench_format.py, eval.py, info.py, memory_bench.py,
topk_bench.py, terraformer/benchmarks/kernels.py) from reports in the
shapes the benchmarks return, and written as each CLI's --json writes them.
The bench report is a committed `terraformer-bench --json` file; its
expected cells are those the CLI's own text table printed in the same run
(quoted in tests/fixtures/bench_17b_int8.md). The other inputs are written
here in the shapes their makers write (terraformer-ood's ood_result.json,
terraformer-eval's summary, terraformer-memory-bench / -info / -topk-bench
reports, experiments/long_input_eval.py's line); their expected cells are
worked out by hand from those inputs.
"""
import json
import os
import sys
import types

import pytest

from terraformer.benchmarks import kernels as kernel_bench
from terraformer.cli import bench_format
from terraformer.cli import common
from terraformer.cli import eval as eval_cli
from terraformer.cli import info
from terraformer.cli import memory_bench
from terraformer.cli import topk_bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import experiment_tables as tables  # pylint: disable=wrong-import-position

BENCH_17B = os.path.join(ROOT, 'tests', 'fixtures', 'bench_17b_int8.json')
MIB = 2 ** 20


def _run(tmp_path, mode, *args):
  """(exit status, the table written or None, the figures file's lines)."""
  out, figures = tmp_path / 'table.json', tmp_path / 'figures.txt'
  code = tables.main([mode, f'--out={out}', f'--figures={figures}',
                      *map(str, args)])
  return (code, json.loads(out.read_text()) if out.exists() else None,
          figures.read_text().splitlines() if figures.exists() else None)


def _write(tmp_path, name, data):
  path = tmp_path / name
  path.write_text(json.dumps(data))
  return str(path)


def _cli_json(tmp_path, name, report, **made):
  """The --json of a CLI: its report and the tables its formatter made."""
  return _write(tmp_path, name, common.with_tables(report, made))


def _bench(tmp_path, name, report):
  """terraformer-bench --json of a run: its speed and memory tables."""
  made = {'speed': bench_format.speed_table(report)}
  if bench_format.memory_table(report):
    made['memory'] = bench_format.memory_table(report)
  return _cli_json(tmp_path, name, report, **made)


def _bench_17b():
  with open(BENCH_17B, encoding='utf-8') as f:
    return json.load(f)


def _one_line_error(capsys, says):
  err = capsys.readouterr().err
  assert says in err and err.count('\n') == 1, err
  return err


# ---------------------------------------------------------------------------
# terraformer-bench


def test_speed_table_has_the_clis_cells_and_labels(tmp_path, capsys):
  code, table, figures = _run(
      tmp_path, 'speed', _bench(tmp_path, 'b.json', _bench_17b()),
      '--label=17b_dense_kernels_int8=dense',
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
  assert figures == ['loss=10.39x']
  out = capsys.readouterr().out
  assert '| dense | 961.9 [780.1-1014.6] | 1.00x | 1.00x | 1x |' in out
  assert 'figure loss: 10.39x' in out


def test_speed_table_gives_each_models_own_bandwidth(tmp_path):
  data = _bench_17b()
  data['models'][1]['bandwidth_gbps'] = 12.345  # Its own rounds' probe.
  code, table, _ = _run(tmp_path, 'speed', _bench(tmp_path, 'b.json', data),
                        '--columns=model,GB/s')
  assert code == 0
  assert [row[1] for row in table['rows'][:2]] == [
      f"{data['models'][0]['bandwidth_gbps']:.1f}", '12.3']


def test_memory_rows_split_what_a_model_holds_in_gib(tmp_path, capsys):
  gib = 2 ** 30
  report = {'models': [{
      'name': 'm', 'memory_by_kind': {
          'KernelDense int8': 2 * gib, 'KernelSparseFF bfloat16': gib,
          'LayerNorm float32': gib // 2,
          'Embedding float32 (under tl.Cache)': gib,
          'KernelDense int8 (under tl.Cache)': gib // 4,
          'state (caches)': gib // 4}}]}
  path = _cli_json(tmp_path, 'bench.json', report,
                   memory=bench_format.memory_table(report))
  code, table, _ = _run(tmp_path, 'memory', path, '--label=m=model m')
  assert code == 0
  assert table['columns'] == bench_format.MEMORY_COLUMNS
  assert table['rows'] == [['model m', '3.00', '0.50', '1.25', '0.25', '5.00']]
  # A run whose models say nothing of memory holds no such table.
  report = {'models': [{'name': 'm'}]}
  assert bench_format.memory_table(report) is None
  path = _cli_json(tmp_path, 'old.json', report)
  assert _run(tmp_path, 'memory', path)[0] == 2
  _one_line_error(capsys, "no table 'memory'")


def test_sweep_rows_per_d_model_with_the_speedups_at_the_dense_bound(
    tmp_path):
  def row(d_model, dense_ms, sparse_ms, bound=None):
    sparse = {'ms_per_token': sparse_ms, 'speedup': dense_ms / sparse_ms,
              'speedup_per_block': 2.5}
    if bound is not None:
      sparse['speedup_vs_dense_bound'] = bound
    return {'d_model': d_model, 'models': {
        'dense': {'ms_per_token': dense_ms, 'speedup': 1.0},
        'sparse': sparse}}
  report = {'names': ['dense', 'sparse'],
            'rows': [row(512, 3.0, 2.0, 1.25), row(1024, 8.0, 2.0, 3.5)]}
  path = _cli_json(tmp_path, 'sweep.json', report,
                   sweep=bench_format.sweep_table(report))
  code, table, _ = _run(tmp_path, 'sweep', path)
  assert code == 0
  assert table['columns'] == ['d_model', 'dense ms/token', 'sparse ms/token',
                              'speedup', 'per block', 'vs dense bound']
  assert table['rows'] == [['512', '3.00', '2.00', '1.50x', '2.50x', '1.25x'],
                           ['1024', '8.00', '2.00', '4.00x', '2.50x', '3.50x']]
  report = {'names': ['dense', 'sparse'], 'rows': [row(512, 3.0, 2.0)]}
  path = _cli_json(tmp_path, 'old.json', report,
                   sweep=bench_format.sweep_table(report))
  code, table, _ = _run(tmp_path, 'sweep', path)
  assert table['columns'][-1] == 'per block'


def test_labels_rename_a_model_in_rows_and_in_the_columns_it_names(tmp_path):
  """--label renames a model in the rows' first cells and in the columns
  that start with its name (a sweep's of three models), not in others."""
  models = lambda: {n: {'ms_per_token': 2.0, 'speedup': 1.5,
                        'speedup_per_block': 2.0} for n in ('d', 'd2', 's')}
  report = {'names': ['d', 'd2', 's'],
            'rows': [{'d_model': 64, 'models': models()}]}
  path = _cli_json(tmp_path, 'sweep.json', report,
                   sweep=bench_format.sweep_table(report))
  code, table, _ = _run(tmp_path, 'sweep', path, '--label=d=dense',
                        '--label=s=sparse')
  assert code == 0
  assert table['columns'] == [
      'd_model', 'dense ms/token', 'd2 ms/token', 'sparse ms/token',
      'd2 speedup', 'd2 per block', 'sparse speedup', 'sparse per block']


def test_speeds_gives_a_labelled_row_per_run_of_one_model(tmp_path, capsys):
  """Runs of one model each (the same model under other bindings or input
  lengths): a row per run, in order, with its label."""
  bench = _bench_17b()
  runs = [_bench(tmp_path, f'run{i}.json',
                 dict(bench, models=[bench['models'][i]])) for i in (3, 0)]
  code, table, figures = _run(
      tmp_path, 'speeds', f'after={runs[0]}', f'before={runs[1]}',
      '--columns=model,ms/token [min-max]',
      '--figure=b=before:ms/token [min-max]')
  assert code == 0
  assert table['rows'] == [['after', '103.2 [98.7-105.1]'],
                           ['before', '961.9 [780.1-1014.6]']]
  assert figures == ['b=961.9 [780.1-1014.6]']
  two = _bench(tmp_path, 'two.json', dict(bench, models=bench['models'][:2]))
  (tmp_path / 'bad').mkdir()
  code, table, _ = _run(tmp_path / 'bad', 'speeds', f'x={two}')
  assert code == 2 and table is None
  _one_line_error(capsys, 'x: 2 rows in its table; takes tables of one row')


def test_speed_and_projection_show_the_dense_speedups_where_the_json_has_them(
    tmp_path):
  """A report made before the speedups over the dense model keeps its
  columns; a newer one adds them ('–' where a model has no dense model of
  its decode options)."""
  old = _bench_17b()
  code, table, _ = _run(tmp_path, 'speed', _bench(tmp_path, 'old.json', old))
  assert code == 0 and table['columns'] == (bench_format.SPEED_COLUMNS +
                                            bench_format.LAST_COLUMNS)
  new = json.loads(json.dumps(old))
  for m, (measured, bound, projected) in zip(new['models'], (
      (1.0, 0.42, 1.1), (4.0, 1.5, 3.0), (None, None, None))):
    m.update(speedup_vs_dense=measured, speedup_vs_dense_bound=bound,
             projected_speedup_vs_dense=projected,
             projected_speedup_vs_dense_bound=bound)
  code, table, _ = _run(tmp_path, 'speed', _bench(tmp_path, 'new.json', new),
                        '--columns=vs dense,vs dense bound')
  assert code == 0
  assert table['rows'][:3] == [
      ['1.00x', '0.42x'], ['4.00x', '1.50x'], ['–', '–']]
  for m in new['models']:
    m.update(projected_ms_per_token=m['ms_per_token'], ms_no_blocks=1.0,
             projected_bytes_per_token=m['bytes_per_token'],
             projected_speedup=m['speedup'])
    m.setdefault('ms_per_block', 1.0)
  new['settings']['fit_blocks'] = 1
  path = _cli_json(tmp_path, 'p.json', new,
                   projection=bench_format.projection_table(new))
  code, table, _ = _run(tmp_path, 'projection', path)
  assert code == 0 and table['columns'][-2:] == ['vs dense', 'vs dense bound']
  assert [r[-2:] for r in table['rows'][:3]] == [
      ['1.10x', '0.42x'], ['3.00x', '1.50x'], ['–', '–']]
  assert 'measured ms/token (1 block)' in table['columns']


def test_agreement_columns_chosen_and_renamed(tmp_path):
  """The docs' agreement table: the model's label under 'decode path',
  without the CLI's own decode path and first difference."""
  rows = [{'name': 'ref', 'decode_path': 'xla', 'tokens': 16,
           'max_abs_logit_delta': 0.0, 'greedy_agreement': 1.0,
           'first_difference': None},
          {'name': 'int8', 'decode_path': 'ffi (int8 weights)', 'tokens': 16,
           'max_abs_logit_delta': 0.01234, 'greedy_agreement': 0.9375,
           'first_difference': 7}]
  path = _cli_json(tmp_path, 'a.json', {'models': rows},
                   agreement=bench_format.agreement_table(rows))
  code, table, _ = _run(
      tmp_path, 'agreement', path, '--label=int8=kernels, int8 weights',
      '--columns=model,max |delta logit| vs the first,'
      'greedy agreement (16 tokens)', '--rename=model=decode path')
  assert code == 0
  assert table == {'columns': ['decode path',
                               'max |delta logit| vs the first',
                               'greedy agreement (16 tokens)'],
                   'rows': [['ref', '0', '1.000'],
                            ['kernels, int8 weights', '0.0123', '0.938']]}


def test_kernel_layers_row_per_layer_with_each_variants_ms_and_bound(
    tmp_path):
  row = lambda variant, ms, mb, x_bound, vs: {
      'case': '17b_loss', 'variant': variant, 'min_ms': ms, 'median_ms': ms,
      'bytes': mb * 1e6, 'x_bound': x_bound, 'vs_xla': vs}
  rows = [row('xla f32', 28.0, 296.1, 2.72, 1.0),
          row('ffi q8', 3.5, 74.2, 1.35, 8.0)]
  path = _cli_json(tmp_path, 'k.json', {'rows': rows},
                   layers=kernel_bench.layers_table(rows))
  code, table, figures = _run(tmp_path, 'kernel_layers', path,
                              '--label=17b_loss=17B sparse loss',
                              '--figure=x=17B sparse loss:ffi q8 vs xla f32')
  assert code == 0
  assert table['columns'] == ['layer', 'xla f32 ms (x bound)',
                              'ffi q8 ms (x bound)',
                              'MB read (xla f32 / ffi q8)',
                              'ffi q8 vs xla f32']
  assert table['rows'] == [['17B sparse loss', '28.00 (2.72)', '3.50 (1.35)',
                            '296.1 / 74.2', '8.00x']]
  assert figures == ['x=8.00x']


def _profile(tmp_path, results, operations=6):
  return _cli_json(tmp_path, 'p.json', {'models': results},
                   profile=bench_format.profile_table(results, operations))


def test_profile_rows_are_a_models_wall_time_then_its_costliest_operations(
    tmp_path):
  q8 = ('custom-call f32[1,1,9216]{2,1,0} tf_q8_matmul <- f32[1,1,9216], '
        's8[64,9216], f32[64], s8[9,2304,16,4], f32[144], f32[9216]')
  # Several outputs: a tuple shape.
  qkv = ('custom-call (f32[1,1,64]{2,1,0}, f32[1,2,4,16]{3,2,1,0}) '
         'tf_sparse_qkv <- f32[1,1,64], s8[4,64]')
  summary = {'ops_per_step': 250, 'wall_ms_per_step': 20.125,
             'busy_ms_per_step': 19.5,
             'by_operation': [[q8, 6.0, 12], [qkv, 2.0, 2],
                              ['fusion', 1.0, 300], ['copy', 0.25, 30],
                              ['stack', 0.125, 12]]}
  path = _profile(tmp_path, [{'name': 'tf_q8', 'summary': summary}], 3)
  code, table, figures = _run(tmp_path, 'profile', path,
                              '--label=tf_q8=Terraformer',
                              '--figure=wall=Terraformer:ms')
  assert code == 0
  assert table['rows'] == [
      ['Terraformer', 'wall (an operation running)', '250', '20.12 (19.50)'],
      ['', 'tf_q8_matmul (f32[1,1,9216], s8[64,9216], f32[64], '
       's8[9,2304,16,4], f32[144], f32[9216]) -> f32[1,1,9216]', '12', '6.00'],
      ['', 'tf_sparse_qkv (f32[1,1,64], s8[4,64]) -> (f32[1,1,64], '
       'f32[1,2,4,16])', '2', '2.00'],
      ['', 'fusion', '300', '1.00'],
      ['', 'the others', '42', '0.38']]
  assert figures == ['wall=20.12 (19.50)']


def test_profile_abbreviates_a_kernel_call_with_many_operands(tmp_path):
  """A call with more operands or results than a cell lists (a Terraformer
  block's 60) shows its first two shapes and how many there are; HLO
  comments in a tuple shape are dropped."""
  operands = ', '.join([f'f32[1,1,{i}]' for i in range(1, 31)])
  results = ', '.join([f'/*index={i}*/f32[{i},2]{{1,0}}' for i in range(30)])
  block = f'custom-call ({results}) tf_block <- {operands}'
  summary = {'ops_per_step': 10, 'wall_ms_per_step': 3.0,
             'busy_ms_per_step': 2.5, 'by_operation': [[block, 2.5, 2]]}
  code, table, _ = _run(tmp_path, 'profile', _profile(
      tmp_path, [{'name': 'm', 'summary': summary}]))
  assert code == 0
  assert table['rows'][1] == [
      '', 'tf_block (f32[1,1,1], f32[1,1,2], … 30 operands) -> (f32[0,2], '
      'f32[1,2], … 30 results)', '2', '2.50']


def test_markdown_figures_mean_and_difference(tmp_path):
  md = tmp_path / 'table.md'
  md.write_text('| run | 500 | 1000 |\n| --- | --- | --- |\n'
                '| A, seed 0 | 5.000 | 4.100 |\n| A, seed 1 | 5.200 | 4.200 |\n'
                '| B, seed 0 | 4.900 | 4.000 |\n')
  code, table, figures = _run(
      tmp_path, 'markdown', md, '--figure=a=A, seed 0|A, seed 1:1000',
      '--figure=d=B, seed 0:1000 - A, seed 0|A, seed 1:1000',
      '--figure=one=B, seed 0:500')
  assert code == 0
  assert table == {'columns': ['run', '500', '1000'],
                   'rows': [['A, seed 0', '5.000', '4.100'],
                            ['A, seed 1', '5.200', '4.200'],
                            ['B, seed 0', '4.900', '4.000']]}
  assert figures == ['a=4.150', 'd=-0.150', 'one=4.900']


# ---------------------------------------------------------------------------
# terraformer-eval, terraformer-info


def _eval_json(tmp_path, name, summary):
  return _cli_json(tmp_path, name, summary,
                   **eval_cli.summary_tables(summary))


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
  path = _eval_json(tmp_path, 'eval_test_step200.json', summary)
  code, table, _ = _run(tmp_path, 'rouge', path,
                        '--columns=F1 (%),ROUGE-1,ROUGE-2,ROUGE-L')
  assert code == 0
  assert table['columns'] == ['F1 (%)', 'ROUGE-1', 'ROUGE-2', 'ROUGE-L']
  assert table['rows'] == [
      ['model', '25.00', '1.50', '16.00'],
      ['lead-3', '27.00', '6.71', '15.00'],
      ['lead-k matched (mean k 4.7)', '31.87', '8.00', '16.47'],
      ['random 3 (seed 0)', '20.00', '3.00', '12.00']]


def test_settings_rows_with_fluency_then_references_and_yardsticks(tmp_path):
  def summary(rouge2, words, known, repeated):
    return {'rouge1': 0.25, 'rouge2': rouge2, 'rougeLsum': 0.2,
            'rougeL': 0.16, 'prediction_words': 90.14,
            'reference_words': 116.86, 'baseline_k': 3, 'baseline_seed': 0,
            'fluency': {'model': {'known_words': words,
                                  'known_trigrams': known,
                                  'repeated_trigrams': repeated},
                        'references': {'known_words': 0.9769,
                                       'known_trigrams': 0.2836,
                                       'repeated_trigrams': 0.01}},
            'baselines': {'lead_3': {'rouge1': 0.27, 'rouge2': 0.0671,
                                     'rougeL': 0.15, 'words': 83.8},
                          'random_3': {'rouge1': 0.2, 'rouge2': 0.03,
                                       'rougeL': 0.12, 'words': 60.0}}}
  sample = _eval_json(tmp_path, 'a.json',
                      summary(0.0173, 0.9234, 0.1763, 0.0832))
  greedy = _eval_json(tmp_path, 'b.json', summary(0.031, 0.9, 0.3, 0.0))
  code, table, figures = _run(
      tmp_path, 'settings', f'sample=T 0.5={sample}', f'greedy={greedy}',
      '--figure=best=greedy:ROUGE-2')
  assert code == 0
  assert table['columns'] == ['setting', 'ROUGE-1', 'ROUGE-2', 'ROUGE-L',
                              'words', 'known words (%)',
                              'known trigrams (%)', 'repeated trigrams (%)']
  assert table['rows'] == [
      ['sample=T 0.5', '25.00', '1.73', '16.00', '90.1', '92.3', '17.6',
       '8.3'],
      ['greedy', '25.00', '3.10', '16.00', '90.1', '90.0', '30.0', '0.0'],
      ['references', '–', '–', '–', '116.9', '97.7', '28.4', '1.0'],
      ['lead-3', '27.00', '6.71', '15.00', '83.8', '–', '–', '–'],
      ['random 3 (seed 0)', '20.00', '3.00', '12.00', '60.0', '–', '–', '–']]
  assert figures == ['best=3.10']


def test_plan_rows_in_gib(tmp_path):
  gib = 2 ** 30
  plan = {'devices': 8, 'weights_bytes_per_device': gib // 2,
          'slots_bytes_per_device': gib,
          'activation_bytes_per_device': gib // 4,
          'total_bytes_per_device': gib * 7 // 4}
  path = _cli_json(tmp_path, 'info.json', {'per_device': plan},
                   plan=info.plan_table('gin/x.gin', plan))
  code, table, _ = _run(tmp_path, 'plan', f'`x.gin`={path}')
  assert code == 0
  assert table['rows'] == [['`x.gin`', '8', '0.500', '1.000', '0.250',
                            '1.750']]


@pytest.mark.parametrize('total, text', [
    (775_400_000, '775.4M'), (16_880_000_000, '16.88B'), (1_124_032, '1.1M'),
    (52_224, '52,224')])
def test_parameters_are_written_as_the_docs_write_them(total, text):
  assert info.parameters(total) == text


def test_params_rows_keep_a_label_that_holds_an_equals_sign(tmp_path):
  count = types.SimpleNamespace(by_layer={}, total=684_400_000)
  path = _cli_json(tmp_path, 'i.json', {'by_layer': {}, 'total': count.total},
                   parameters=info.parameters_table('gin/c.gin', count))
  code, table, _ = _run(tmp_path, 'params', f'`c4_800m.gin`={path}',
                        f'`sparse_ff.gin` (N=64)={path}')
  assert code == 0
  assert table == {'columns': ['config', 'parameters'],
                   'rows': [['`c4_800m.gin`', '684.4M'],
                            ['`sparse_ff.gin` (N=64)', '684.4M']]}


# ---------------------------------------------------------------------------
# terraformer-ood


def _ood_run(path, seed, validation, ood, train_seconds, steps=3000,
             train_digits=(1, 16), eval_digits=(32, 37)):
  """A run directory holding an ood_result.json as terraformer-ood writes."""
  os.makedirs(path)
  scores = {}
  for split, (token, sequence) in (('validation', validation), ('ood', ood)):
    scores[split] = {'token_accuracy': token, 'sequence_accuracy': sequence}
  result = {'cell': 'copy_x', 'steps': steps, 'train_seconds': train_seconds,
            'eval_seconds': 1.0, 'scores': scores,
            'settings': {'seed': seed, 'train_digits': list(train_digits),
                         'eval_digits': list(eval_digits), 'steps': steps}}
  with open(os.path.join(path, tables.OOD_RESULT), 'w') as f:
    json.dump(result, f)
  return str(path)


def test_ood_row_gives_each_seed_token_then_sequence_accuracy(tmp_path):
  seed0 = _ood_run(tmp_path / 'a_seed0', 0, (0.991, 0.945), (0.221, 0.0),
                   1018.4)
  seed1 = _ood_run(tmp_path / 'a_seed1', 1, (0.996, 0.965), (0.18, 0.0),
                   310.6)
  one = _ood_run(tmp_path / 'b_seed0', 0, (1.0, 1.0), (0.109, 0.0), 1158)
  code, table, _ = _run(tmp_path, 'ood', f'A={seed0},{seed1}',
                        f'B (`b`)={one}')
  assert code == 0
  assert table['columns'] == ['model (cell)', 'seeds', 'steps',
                              'in distribution (1-16 digits)',
                              'OOD (32-37 digits)', 'train s']
  assert table['rows'] == [
      ['A', '0 / 1', '3000', '99.1% / 99.6% (94.5% / 96.5%)',
       '22.1% / 18.0% (0.0% / 0.0%)', '1018 / 311'],
      ['B (`b`)', '0', '3000', '100.0% (100.0%)', '10.9% (0.0%)', '1158']]


def test_ood_rows_of_other_lengths_or_unfinished_runs_are_errors(
    tmp_path, capsys):
  l16 = _ood_run(tmp_path / 'l16', 0, (1.0, 1.0), (0.1, 0.0), 1)
  l32 = _ood_run(tmp_path / 'l32', 0, (1.0, 1.0), (0.1, 0.0), 1,
                 train_digits=(1, 32), eval_digits=(64, 75))
  assert _run(tmp_path, 'ood', f'a={l16}', f'b={l32}')[:2] == (2, None)
  _one_line_error(capsys, 'one table per length')
  assert _run(tmp_path, 'ood', f'a={tmp_path / "missing"}')[:2] == (2, None)
  _one_line_error(capsys, 'has not finished')


# ---------------------------------------------------------------------------
# terraformer-memory-bench, terraformer-topk-bench, long_input_eval.py


def _lengths(tmp_path, name, report):
  return _cli_json(tmp_path, name, report,
                   lengths=memory_bench.lengths_table(report))


def test_lengths_joins_reports_and_adds_the_timed_models_ms(tmp_path):
  timed = {'batch_size': 1, 'target_len': 256, 'models': {'long_full': [
      {'input_len': 1024, 'memory': {'total': 137.2 * MIB}, 'step_ms': 25902.4},
      {'input_len': 4096, 'memory': {'total': 1140.8 * MIB}, 'step_ms': None},
  ]}}
  untimed = {'batch_size': 1, 'target_len': 256, 'models': {'long_cst': [
      {'input_len': 1024, 'memory': {'total': 93 * MIB}, 'step_ms': None}]}}
  code, table, _ = _run(tmp_path, 'lengths', '--label=long_full=full',
                        _lengths(tmp_path, 'a.json', timed),
                        _lengths(tmp_path, 'b.json', untimed))
  assert code == 0
  assert table['columns'] == ['input tokens', 'full', 'full ms', 'long_cst']
  code, table, _ = _run(tmp_path, 'lengths', '--label=long_full=full',
                        _lengths(tmp_path, 'a.json', timed),
                        _lengths(tmp_path, 'b.json', untimed),
                        '--columns=input tokens,full,long_cst,full ms')
  assert table['columns'] == ['input tokens', 'full', 'long_cst', 'full ms']
  assert table['rows'] == [['1024', '137.2', '93.0', '25902'],
                           ['4096', '1140.8', '–', '–']]


def test_lengths_rejects_a_model_measured_twice(tmp_path, capsys):
  report = {'models': {'full': [{'input_len': 256, 'memory': {'total': MIB},
                                 'step_ms': None}]}}
  path = _lengths(tmp_path, 'a.json', report)
  assert _run(tmp_path, 'lengths', path, path)[0] == 2
  _one_line_error(capsys, 'measured twice')


def test_depth_gives_totals_temporaries_and_the_ratio(tmp_path):
  row = {'layers': 8,
         'reversible': {'total': 286.2 * MIB, 'temp': 221.2 * MIB},
         'non_reversible': {'total': 966.1 * MIB, 'temp': 903.2 * MIB}}
  path = _cli_json(tmp_path, 'r.json', {'rows': [row]},
                   depth=memory_bench.depth_table([row]))
  code, table, _ = _run(tmp_path, 'depth', path)
  assert code == 0
  assert table['rows'] == [['8', '286.2', '221.2', '966.1', '903.2', '3.38']]


def test_topk_keeps_one_k_and_gives_no_ncss_for_the_exact_operator(
    tmp_path, capsys):
  report = {'methods': ['sh', 'goyal', 'hard'], 'rows': [
      {'n': 256, 'k': 128, 'sh': {'ms': 4.654, 'nccs': 0.9851},
       'goyal': {'ms': 25.04, 'nccs': 0.16}, 'hard': {'ms': 0.78, 'nccs': 1}},
      {'n': 16384, 'k': 128, 'sh': {'ms': 693.84, 'nccs': 0.853},
       'goyal': None, 'hard': {'ms': 4.04, 'nccs': 1}},
      {'n': 256, 'k': 8, 'sh': {'ms': 1, 'nccs': 1}, 'goyal': None,
       'hard': None}]}
  path = _cli_json(tmp_path, 't.json', report,
                   topk=topk_bench.topk_table(report))
  code, table, _ = _run(tmp_path, 'topk', '--k=128', path)
  assert code == 0
  assert table['columns'] == ['n', 'SH ms', 'Goyal ms', 'hard top-k ms',
                              'SH nCCS', 'Goyal nCCS']
  assert table['rows'] == [['256', '4.65', '25.0', '0.78', '0.985', '0.160'],
                           ['16384', '693.8', '–', '4.04', '0.853', '–']]
  assert _run(tmp_path / 'k', 'topk', path)[0] == 2
  _one_line_error(capsys, 'topk needs --k')


def test_recall_scores_and_the_pooling_columns_where_measured(tmp_path):
  plain = _write(tmp_path, 'a.json', {'output_dir': 'x', 'step': 2500,
                                      'examples': 256, 'exact_match': 1.0,
                                      'token_accuracy': 0.99987})
  pooled = _write(tmp_path, 'b.json', {
      'step': 16000, 'examples': 256, 'exact_match': 0.2421875,
      'token_accuracy': 0.765, 'first_pooling_keeps_facts': 1.0,
      'first_pooling_keeps_queries': 0.0, 'first_pooling_keeps_all': 0.0})
  code, table, _ = _run(tmp_path, 'recall', f'Full, seed 0={plain}',
                        f'Pyramidion={pooled}')
  assert code == 0
  assert table['columns'] == ['run', 'step', 'exact match', 'token accuracy',
                              'fact tokens kept', 'query tokens kept',
                              'examples keeping all']
  assert table['rows'] == [
      ['Full, seed 0', '2500', '1.000', '1.000', '–', '–', '–'],
      ['Pyramidion', '16000', '0.242', '0.765', '1.000', '0.000', '0.000']]


def test_recall_by_key_position_a_column_per_position_seen(tmp_path):
  one = _write(tmp_path, 'a.json', {
      'step': 16000, 'examples': 256, 'exact_match': 0.5,
      'token_accuracy': 0.75,
      'value_accuracy_by_key_position': {'0': 0.25, '12': 1.0}})
  two = _write(tmp_path, 'b.json', {
      'step': 16000, 'examples': 256, 'exact_match': 1.0,
      'token_accuracy': 1.0,
      'value_accuracy_by_key_position': {'2': 1.0, '12': 0.96875}})
  code, table, _ = _run(tmp_path, 'recall', f'seed 0={one}', f'seed 1={two}')
  assert code == 0
  assert table['columns'] == ['run', 'step', 'exact match', 'token accuracy',
                              'key at 0', 'key at 2', 'key at 12']
  assert table['rows'] == [
      ['seed 0', '16000', '0.500', '0.750', '0.250', '–', '1.000'],
      ['seed 1', '16000', '1.000', '1.000', '–', '1.000', '0.969']]


# ---------------------------------------------------------------------------
# Mistakes


@pytest.mark.parametrize('args, says', [
    (('speed', 'missing.json'), 'missing.json'),
    (('projection', 'BENCH'), "no table 'projection' (tables: speed, memory"),
    (('speed', BENCH_17B), "no table 'speed' (tables: none; a CLI run before"),
    (('recall', f'run={BENCH_17B}'), 'is not what recall reads'),
    (('speed', 'BENCH', 'BENCH'), 'takes one input, got 2'),
    (('plan', 'BENCH'), 'expected LABEL=PATH'),
    (('speed', 'BENCH', '--figure=x=17b_dense_kernels_int8:nope'),
     "no column 'nope'"),
    (('speed', 'BENCH', '--figure=x=nobody:speedup'), "no row 'nobody'"),
    (('speed', 'BENCH', '--columns=model,nope'), 'no column(s) nope'),
    (('nomode', 'BENCH'), "invalid choice: 'nomode'"),
])
def test_mistakes_are_one_line_and_exit_2(tmp_path, capsys, args, says):
  """BENCH: terraformer-bench --json of a run (speed and memory tables)."""
  bench = _bench(tmp_path, 'bench.json', _bench_17b())
  (tmp_path / 'out').mkdir()
  code, table, figures = _run(tmp_path / 'out', *[
      bench if a == 'BENCH' else a for a in args])
  assert (code, table, figures) == (2, None, None)
  assert _one_line_error(capsys, says).startswith(f'{tables.PROG}: error: ')


# ---------------------------------------------------------------------------
# pytest --junitxml


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.layers.test_a" name="test_one" time="1.0">
<system-out>--------------------------------- Captured Out ---------------------------------
step 1/3 | train loss 7.6102
dense: max |dlogit| 1.19e-06
</system-out></testcase>
<testcase classname="tests.layers.test_a" name="test_two" time="1.0">
<failure message="assert False">boom</failure></testcase>
<testcase classname="tests.layers.test_a" name="test_three" time="0.0">
<skipped message="no AMX" /></testcase>
<testcase classname="tests.models.test_b" name="test_c[x]" time="1.0"/>
<testcase classname="tests.models.test_b" name="test_d" time="1.0">
<error message="fixture">oops</error></testcase>
</testsuite></testsuites>
"""


def test_pytest_junit_is_a_row_per_test_file(tmp_path):
  path = tmp_path / 'junit.xml'
  path.write_text(JUNIT)
  code, table, figures = _run(tmp_path, 'pytest', path,
                              '--figure=a=tests/layers/test_a.py:passed')
  assert code == 0
  assert table == {
      'columns': ['tests', 'passed', 'failed', 'printed (measured)'],
      'rows': [['tests/layers/test_a.py', '1 of 2', 'test_two',
                'dense: max |dlogit| 1.19e-06'],
               ['tests/models/test_b.py', '1 of 2', 'test_d', '–']]}
  assert figures == ['a=1 of 2']


def test_pytest_junit_that_is_not_xml_is_one_line(tmp_path, capsys):
  path = tmp_path / 'junit.xml'
  path.write_text('not xml')
  assert _run(tmp_path, 'pytest', path)[0] == 2
  _one_line_error(capsys, 'not a JUnit XML file')
