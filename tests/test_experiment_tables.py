"""scripts/experiment_tables.py: the CLIs' JSON as the docs' tables.

The inputs are written here in the shapes the CLIs write (terraformer-ood's
ood_result.json, terraformer-memory-bench / -info / -topk-bench --json); the
expected cells are worked out by hand from those inputs.
"""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'scripts', 'experiment_tables.py')

_spec = importlib.util.spec_from_file_location('experiment_tables', SCRIPT)
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

MIB = 2 ** 20


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
  with open(os.path.join(path, 'ood_result.json'), 'w') as f:
    json.dump(result, f)
  return str(path)


def _write(tmp_path, name, data):
  path = tmp_path / name
  path.write_text(json.dumps(data))
  return str(path)


def _run(argv):
  return tables.main([str(a) for a in argv])


def test_ood_row_gives_each_seed_token_then_sequence_accuracy(tmp_path):
  seed0 = _ood_run(tmp_path / 'a_seed0', 0, (0.991, 0.945), (0.221, 0.0),
                   1018.4)
  seed1 = _ood_run(tmp_path / 'a_seed1', 1, (0.996, 0.965), (0.18, 0.0),
                   310.6)
  one = _ood_run(tmp_path / 'b_seed0', 0, (1.0, 1.0), (0.109, 0.0), 1158)
  out = tmp_path / 'table.json'
  assert _run(['ood', f'--out={out}', f'--row=A=' + f'{seed0},{seed1}',
               f'--row=B (`b`)={one}']) == 0
  table = json.loads(out.read_text())
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
  out = tmp_path / 't.json'
  assert _run(['ood', f'--out={out}', f'--row=a={l16}',
               f'--row=b={l32}']) == 2
  assert 'one table per length' in capsys.readouterr().err
  assert _run(['ood', f'--out={out}', f'--row=a={tmp_path / "missing"}']) == 2
  err = capsys.readouterr().err
  assert 'has not finished' in err and err.count('\n') == 1
  assert not out.exists()


def test_lengths_merges_reports_and_adds_the_timed_models_ms(tmp_path):
  timed = {'batch_size': 1, 'target_len': 256, 'models': {'long_full': [
      {'input_len': 1024, 'memory': {'total': 137.2 * MIB}, 'step_ms': 25902.4},
      {'input_len': 4096, 'memory': {'total': 1140.8 * MIB}, 'step_ms': None},
  ]}}
  untimed = {'batch_size': 1, 'target_len': 256, 'models': {'long_cst': [
      {'input_len': 1024, 'memory': {'total': 93 * MIB}, 'step_ms': None}]}}
  out = tmp_path / 'm.json'
  assert _run(['lengths', f'--out={out}', '--label=long_full=full',
               _write(tmp_path, 'a.json', timed),
               _write(tmp_path, 'b.json', untimed)]) == 0
  table = json.loads(out.read_text())
  assert table['columns'] == ['input tokens', 'full', 'long_cst', 'full ms']
  assert table['rows'] == [['1024', '137.2', '93.0', '25902'],
                           ['4096', '1140.8', '–', '–']]


def test_lengths_rejects_a_model_measured_twice_and_unknown_labels(
    tmp_path, capsys):
  report = {'models': {'full': [{'input_len': 256, 'memory': {'total': MIB},
                                 'step_ms': None}]}}
  path = _write(tmp_path, 'a.json', report)
  out = tmp_path / 'm.json'
  assert _run(['lengths', f'--out={out}', path, path]) == 2
  assert 'measured twice' in capsys.readouterr().err
  assert _run(['lengths', f'--out={out}', '--label=lsh=LSH', path]) == 2
  assert 'unmeasured model' in capsys.readouterr().err


def test_depth_gives_totals_temporaries_and_the_ratio(tmp_path):
  row = {'layers': 8,
         'reversible': {'total': 286.2 * MIB, 'temp': 221.2 * MIB},
         'non_reversible': {'total': 966.1 * MIB, 'temp': 903.2 * MIB}}
  out = tmp_path / 'd.json'
  assert _run(['depth', f'--out={out}',
               _write(tmp_path, 'r.json', {'rows': [row]})]) == 0
  table = json.loads(out.read_text())
  assert table['rows'] == [['8', '286.2', '221.2', '966.1', '903.2', '3.38']]


@pytest.mark.parametrize('total, text', [
    (775_400_000, '775.4M'), (16_880_000_000, '16.88B'), (1_124_032, '1.1M'),
    (52_224, '52,224')])
def test_parameters_are_written_as_the_docs_write_them(total, text):
  assert tables.parameters(total) == text


def test_params_table_reads_terraformer_info_json(tmp_path):
  info = _write(tmp_path, 'i.json', {'by_layer': {}, 'total': 684_400_000})
  out = tmp_path / 'p.json'
  assert _run(['params', f'--out={out}', f'--row=`c4_800m.gin`={info}']) == 0
  assert json.loads(out.read_text())['rows'] == [['`c4_800m.gin`', '684.4M']]


def test_topk_keeps_one_k_and_gives_no_ncss_for_the_exact_operator(tmp_path):
  report = {'methods': ['sh', 'goyal', 'hard'], 'rows': [
      {'n': 256, 'k': 128, 'sh': {'ms': 4.654, 'nccs': 0.9851},
       'goyal': {'ms': 25.04, 'nccs': 0.16}, 'hard': {'ms': 0.78, 'nccs': 1}},
      {'n': 16384, 'k': 128, 'sh': {'ms': 693.84, 'nccs': 0.853},
       'goyal': None, 'hard': {'ms': 4.04, 'nccs': 1}},
      {'n': 256, 'k': 8, 'sh': {'ms': 1, 'nccs': 1}, 'goyal': None,
       'hard': None}]}
  out = tmp_path / 'k.json'
  assert _run(['topk', '--k=128', f'--out={out}',
               _write(tmp_path, 't.json', report)]) == 0
  table = json.loads(out.read_text())
  assert table['columns'] == ['n', 'SH ms', 'Goyal ms', 'hard top-k ms',
                              'SH nCCS', 'Goyal nCCS']
  assert table['rows'] == [['256', '4.65', '25.0', '0.78', '0.985', '0.160'],
                           ['16384', '693.8', '–', '4.04', '0.853', '–']]


def test_recall_scores_and_the_pooling_columns_where_measured(tmp_path):
  plain = _write(tmp_path, 'a.json', {'output_dir': 'x', 'step': 2500,
                                      'examples': 256, 'exact_match': 1.0,
                                      'token_accuracy': 0.99987})
  pooled = _write(tmp_path, 'b.json', {
      'step': 16000, 'examples': 256, 'exact_match': 0.2421875,
      'token_accuracy': 0.765, 'first_pooling_keeps_facts': 1.0,
      'first_pooling_keeps_queries': 0.0, 'first_pooling_keeps_all': 0.0})
  out = tmp_path / 'r.json'
  assert _run(['recall', f'--out={out}', f'--row=Full, seed 0={plain}',
               f'--row=Pyramidion={pooled}']) == 0
  table = json.loads(out.read_text())
  assert table['columns'] == ['run', 'step', 'exact match', 'token accuracy',
                              'fact tokens kept', 'query tokens kept',
                              'examples keeping all']
  assert table['rows'] == [
      ['Full, seed 0', '2500', '1.000', '1.000', '–', '–', '–'],
      ['Pyramidion', '16000', '0.242', '0.765', '1.000', '0.000', '0.000']]
