"""tools/results.py: the pages' results blocks come from results/*.json.

The committed README.md and docs/*.md must be what `tools/results.py`
renders from the committed results files (test_the_committed_pages_...).
"""
import datetime
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, 'tools', 'results.py')

_spec = importlib.util.spec_from_file_location('results_script', SCRIPT)
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)

OOD = {
    'experiment': 'ood',
    'command': 'bash experiments/ood.sh',
    'short_command': 'SHORT=1 bash experiments/ood.sh',
    'cost': 'about 6 core-hours on the 2-core CPU',
    'measured': {'date': '2026-11-25', 'machine': '2-core AMD EPYC',
                 'isa': 'avx2'},
    'provenance': {'kind': 'recorded', 'commit': 'abc1234def5678',
                   'command': 'bash experiments/ood.sh', 'wall_s': 3600},
    'tables': {'copy': {'caption': 'copy, 3000 steps, 2 seeds',
                        'figures': ['copy_ood'],
                        'columns': ['model', 'in distribution', 'OOD'],
                        'rows': [['Transformer', '99.4% / 99.8%',
                                  '6.4% / 6.8%'],
                                 ['a|b', '1%', '2%']]},
               'old': {'caption': '',
                       'columns': ['model', 'OOD'],
                       'rows': [['Terraformer', '13.5%']],
                       'measured': {'date': '2026-11-20',
                                    'machine': '2-core AMD EPYC',
                                    'isa': 'unknown'},
                       'provenance': {'kind': 'transcribed',
                                      'from': 'a log of 2026-11-20'}}},
    'figures': {'copy_ood': '6.4%'},
}
README_ROWS = [{'result': 'Table 4 copy OOD', 'ours': 'ood/copy_ood',
                'paper': '79.8% (Table 4)', 'page': 'docs/ood.md#copy'}]

COPY_BODY = """copy, 3000 steps, 2 seeds

| model | in distribution | OOD |
| --- | --- | --- |
| Transformer | 99.4% / 99.8% | 6.4% / 6.8% |
| a\\|b | 1% | 2% |

Recorded by `bash experiments/ood.sh` at commit abc1234 on 2026-11-25, a 2-core AMD EPYC (avx2), in 60 min (about 6 core-hours on the 2-core CPU; short version: `SHORT=1 bash experiments/ood.sh`).
"""
OLD_BODY = """| model | OOD |
| --- | --- |
| Terraformer | 13.5% |

Transcribed from a log of 2026-11-20, not written by its script `bash experiments/ood.sh`: measured 2026-11-20 on a 2-core AMD EPYC (ISA unknown) (about 6 core-hours on the 2-core CPU; short version: `SHORT=1 bash experiments/ood.sh`).
"""
README_BODY = """| result | ours | paper | page |
| --- | --- | --- | --- |
| Table 4 copy OOD | 6.4% | 79.8% (Table 4) | [ood](docs/ood.md#copy) |

Generated from `results/*.json` by `.venv/bin/python tools/results.py`.
"""


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(text)


def _read(path):
  with open(path, encoding='utf-8') as f:
    return f.read()


@pytest.fixture
def repo(tmp_path):
  """A hand-made repository: results files, README.md and one docs page."""
  _write(str(tmp_path / 'results' / 'ood.json'), json.dumps(OOD))
  _write(str(tmp_path / 'results' / 'readme.json'), json.dumps(README_ROWS))
  _write(str(tmp_path / 'README.md'),
         '# x\n\n<!-- results:readme -->\n<!-- /results -->\nafter\n')
  _write(str(tmp_path / 'docs' / 'ood.md'),
         '# OOD\n\nProse before.\n<!-- results:ood/copy -->\nstale text\n'
         '<!-- /results -->\nProse between.\n<!-- results:ood/old -->\n'
         '<!-- /results -->\n')
  return tmp_path


def test_render_fills_every_block_and_keeps_the_prose(repo, capsys):
  assert results.main(['--root', str(repo)]) == 0
  assert _read(str(repo / 'docs' / 'ood.md')) == (
      '# OOD\n\nProse before.\n<!-- results:ood/copy -->\n' + COPY_BODY +
      '<!-- /results -->\nProse between.\n<!-- results:ood/old -->\n' +
      OLD_BODY + '<!-- /results -->\n')
  assert _read(str(repo / 'README.md')) == (
      '# x\n\n<!-- results:readme -->\n' + README_BODY +
      '<!-- /results -->\nafter\n')
  assert '3 blocks rendered, 3 changed' in capsys.readouterr().out


def test_check_fails_on_a_changed_block_and_passes_after_render(repo, capsys):
  assert results.main(['render', '--root', str(repo)]) == 0
  assert results.main(['--check', '--root', str(repo)]) == 0
  page = repo / 'docs' / 'ood.md'
  rendered = _read(str(page))
  _write(str(page), rendered.replace('6.4% / 6.8%', '6.5% / 6.8%'))
  capsys.readouterr()
  assert results.main(['--check', '--root', str(repo)]) == 1
  out = capsys.readouterr().out
  assert 'docs/ood.md: results:ood/copy' in out
  assert 'results:ood/old' not in out and 'README' not in out
  assert '6.5%' in _read(str(page))  # --check writes nothing
  # The results file changes: the README block is stale too.
  OOD2 = json.loads(json.dumps(OOD))
  OOD2['figures']['copy_ood'] = '7.0%'
  _write(str(repo / 'results' / 'ood.json'), json.dumps(OOD2))
  assert results.main(['--check', '--root', str(repo)]) == 1
  assert 'README.md: results:readme' in capsys.readouterr().out
  assert results.main(['--root', str(repo)]) == 0
  assert results.main(['--check', '--root', str(repo)]) == 0
  assert '| Table 4 copy OOD | 7.0% |' in _read(str(repo / 'README.md'))
  assert _read(str(page)) == rendered


def test_render_and_check_of_some_pages_only(repo, capsys):
  page, readme = repo / 'docs' / 'ood.md', repo / 'README.md'
  before = _read(str(readme))
  assert results.main(['render', '--root', str(repo), 'docs/ood.md']) == 0
  assert _read(str(readme)) == before and COPY_BODY in _read(str(page))
  assert results.main(['--check', '--root', str(repo), 'docs/ood.md']) == 0
  assert results.main(['--check', '--root', str(repo)]) == 1
  capsys.readouterr()
  assert results.main(['--root', str(repo), 'docs/nope.md']) == 2
  assert capsys.readouterr().err.startswith(
      'results.py: error: not README.md or docs/*.md: ')


@pytest.mark.parametrize('block,message', [
    ('ood/nope', "unknown results block 'ood/nope': results/ood.json has "
                 'tables copy, old'),
    ('gone/copy', "unknown results block 'gone/copy': no results/gone.json"),
])
def test_an_unknown_block_is_one_line_and_exit_2(repo, capsys, block,
                                                 message):
  page = repo / 'docs' / 'ood.md'
  before = _read(str(page)) + f'<!-- results:{block} -->\n<!-- /results -->\n'
  _write(str(page), before)
  for argv in (['--root', str(repo)], ['--check', '--root', str(repo)]):
    assert results.main(argv) == 2
    err = capsys.readouterr().err
    assert err == f'results.py: error: docs/ood.md: {message}\n'
  assert _read(str(page)) == before


def test_an_unknown_figure_an_unclosed_block_and_bad_json_exit_2(repo,
                                                                 capsys):
  rows = [dict(README_ROWS[0], ours='ood/nope')]
  _write(str(repo / 'results' / 'readme.json'), json.dumps(rows))
  assert results.main(['--root', str(repo)]) == 2
  assert capsys.readouterr().err == (
      "results.py: error: README.md: unknown figure 'ood/nope': "
      'results/ood.json has figures copy_ood\n')
  _write(str(repo / 'results' / 'readme.json'), json.dumps(README_ROWS))
  _write(str(repo / 'docs' / 'ood.md'), '<!-- results:ood/copy -->\nx\n')
  assert results.main(['--root', str(repo)]) == 2
  assert 'results:ood/copy has no <!-- /results -->' in capsys.readouterr().err
  _write(str(repo / 'results' / 'ood.json'), '{"tables": ')
  assert results.main(['--check', '--root', str(repo)]) == 2
  err = capsys.readouterr().err
  assert 'ood.json: not JSON' in err and err.count('\n') == 1


CPUINFO = ('processor\t: 0\nmodel name\t: AMD EPYC 7B13\n'
           'flags\t\t: fpu sse2 avx2 fma\n\nprocessor\t: 1\n'
           'model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2 fma\n')


@pytest.mark.parametrize('flags,isa', [('fpu sse2 avx2 fma', 'avx2'),
                                       ('avx2 avx512f avx512_vnni',
                                        'avx512-vnni'),
                                       ('fpu sse2', 'unknown')])
def test_machine_reads_the_model_and_the_isa(tmp_path, flags, isa):
  path = tmp_path / 'cpuinfo'
  path.write_text(CPUINFO.replace('fpu sse2 avx2 fma', flags))
  found = results.machine(str(path))
  assert found['isa'] == isa
  assert found['machine'].endswith('-core AMD EPYC 7B13')


def test_record_builds_a_results_file_from_cli_json(tmp_path, capsys):
  # terraformer-ood's ood_table.json: a list of objects.
  ood_table = tmp_path / 'ood_table.json'
  ood_table.write_text(json.dumps([
      {'cell': 'copy_transformer', 'in_distribution': 0.994, 'ood': 0.064,
       'steps': 3000},
      {'cell': 'copy_terraformer', 'in_distribution': 1.0, 'ood': 0.173,
       'steps': 6000, 'note': None}]))
  table = tmp_path / 'table.json'
  table.write_text(json.dumps({'columns': ['n', 'ms'],
                               'rows': [[64, 1.5], [4096, 16729.0]]}))
  run = {'kind': 'recorded', 'commit': 'c0ffee0', 'command': None,
         'started': '2026-11-28T10:00:00Z', 'wall_s': 61}
  path = results.record(
      str(tmp_path), 'ood', {'copy': str(ood_table), 'speed': str(table)},
      figures={'copy:copy_ood': '6.4%', 'speed:n_max': '4096'},
      captions={'copy': 'copy, 2 seeds'},
      columns={'copy': 'cell,ood'}, today=datetime.date(2026, 11, 28),
      this_machine={'machine': '2-core AMD EPYC', 'isa': 'avx2'},
      provenance=run)
  assert path == str(tmp_path / 'results' / 'ood.json')
  data = json.loads(_read(path))
  assert data == {
      'experiment': 'ood',
      'command': 'bash experiments/ood.sh',
      'short_command': 'SHORT=1 bash experiments/ood.sh',
      'cost': 'unknown',
      'tables': {
          'copy': {'caption': 'copy, 2 seeds', 'columns': ['cell', 'ood'],
                   'rows': [['copy_transformer', '0.064'],
                            ['copy_terraformer', '0.173']],
                   'figures': ['copy_ood']},
          'speed': {'caption': '', 'columns': ['n', 'ms'],
                    'rows': [['64', '1.5'], ['4096', '16729']],
                    'figures': ['n_max']}},
      'figures': {'copy_ood': '6.4%', 'n_max': '4096'},
      'measured': {'date': '2026-11-28', 'machine': '2-core AMD EPYC',
                   'isa': 'avx2'},
      'provenance': {**run, 'command': 'bash experiments/ood.sh'}}
  assert results.provenance_problems({'ood': data}) == []
  # Rerecording one table: it and the file get today's date and this run's
  # provenance; the other table keeps those it was measured with; the
  # rerun table's old figures go (copy_ood), its new ones come; a figure
  # without TABLE: belongs to the one table recorded.
  results.record(
      str(tmp_path), 'ood', {'copy': str(ood_table)},
      figures={'copy_id': '100%'}, cost='about 1 core-hour',
      today=datetime.date(2026, 12, 1),
      this_machine={'machine': '16-core Xeon', 'isa': 'avx512-vnni'},
      provenance={'kind': 'recorded', 'commit': 'beef123+dirty',
                  'command': 'bash experiments/ood.sh'})
  data = json.loads(_read(path))
  assert data['provenance']['commit'] == 'beef123+dirty'
  assert data['tables']['speed']['provenance']['commit'] == 'c0ffee0'
  assert 'provenance' not in data['tables']['copy']
  assert data['measured'] == {'date': '2026-12-01', 'machine': '16-core Xeon',
                              'isa': 'avx512-vnni'}
  assert data['cost'] == 'about 1 core-hour'
  assert data['tables']['speed']['measured']['date'] == '2026-11-28'
  assert 'measured' not in data['tables']['copy']
  assert data['tables']['copy'] == {
      'caption': 'copy, 2 seeds',
      'columns': ['cell', 'in_distribution', 'ood', 'steps', 'note'],
      'rows': [['copy_transformer', '0.994', '0.064', '3000', ''],
               ['copy_terraformer', '1', '0.173', '6000', 'null']],
      'figures': ['copy_id']}
  assert data['figures'] == {'n_max': '4096', 'copy_id': '100%'}
  assert results.provenance_problems({'ood': data}) == []
  # The file renders: a page block over the recorded table.
  _write(str(tmp_path / 'docs' / 'p.md'),
         '<!-- results:ood/speed -->\n<!-- /results -->\n')
  capsys.readouterr()
  assert results.main(['--root', str(tmp_path)]) == 0
  assert ('| 4096 | 16729 |\n\nRecorded by `bash experiments/ood.sh` at '
          'commit c0ffee0 on 2026-11-28, a 2-core AMD EPYC (avx2), in 1 min '
          '(about 1 core-hour; short version: `SHORT=1 bash '
          'experiments/ood.sh`).\n<!-- /results -->'
          ) in _read(str(tmp_path / 'docs' / 'p.md'))


def test_a_results_file_takes_its_cost_from_the_script_header(tmp_path):
  table = tmp_path / 'table.json'
  table.write_text(json.dumps({'columns': ['n'], 'rows': [[1]]}))
  _write(str(tmp_path / 'experiments' / 'sweep.sh'), '\n'.join([
      '#!/usr/bin/env bash', '# What it measures.', '#',
      '# Cost: about 0.4 core-hours on the 2-core CPU (8 minutes per seed on',
      '# one core); no timing, any machine.', '# Short version: none',
      'NAME=sweep', '# Cost: not this one.']))
  path = results.record(str(tmp_path), 'sweep', {'t': str(table)})
  assert json.loads(_read(path))['cost'] == (
      'about 0.4 core-hours on the 2-core CPU (8 minutes per seed on one '
      'core); no timing, any machine')
  # Without a script (or a Cost sentence): 'unknown'.
  path = results.record(str(tmp_path), 'other', {'t': str(table)})
  assert json.loads(_read(path))['cost'] == 'unknown'
  # A rerun after the header changed: the header's new cost.
  script = tmp_path / 'experiments' / 'sweep.sh'
  script.write_text(script.read_text().replace('about 0.4', 'about 0.2'))
  path = results.record(str(tmp_path), 'sweep', {'t': str(table)})
  assert json.loads(_read(path))['cost'].startswith('about 0.2 core-hours')


def test_record_refuses_what_it_cannot_read(tmp_path, capsys):
  bad = tmp_path / 'bad.json'
  bad.write_text(json.dumps({'speedup': 2.85}))
  argv = ['record', 'x', '--table', f't={bad}', '--root', str(tmp_path)]
  assert results.main(argv) == 2
  assert capsys.readouterr().err.startswith(
      f'results.py: error: {bad}: expected {{"columns", "rows"}}')
  assert results.main(['record', 'x', '--table', 'no_equals_sign',
                       '--root', str(tmp_path)]) == 2
  assert '--table needs ID=VALUE' in capsys.readouterr().err
  good = tmp_path / 'good.json'
  good.write_text(json.dumps([{'a': 1}]))
  assert results.main(['record', 'x', '--table', f't={good}', '--columns',
                       't=a,b', '--root', str(tmp_path)]) == 2
  assert 'no key(s) b' in capsys.readouterr().err
  assert not (tmp_path / 'results' / 'x.json').exists()


def test_the_script_runs_on_its_own(tmp_path):
  """It needs no terraformer import: a bare interpreter runs it."""
  run = subprocess.run([sys.executable, '-I', SCRIPT, '--check', '--root',
                        str(tmp_path)], capture_output=True, text=True,
                       check=False)
  assert (run.returncode, run.stdout, run.stderr) == (
      0, '0 blocks match results/*.json\n', '')


def test_the_committed_pages_are_what_the_results_files_render(capsys):
  """README.md's table and the docs' tables differ from results/*.json:
  run `.venv/bin/python tools/results.py` and commit the pages."""
  code = results.main(['--check', '--root', ROOT])
  out, err = capsys.readouterr()
  assert code == 0, out + err


def test_the_readme_has_its_results_table():
  text = _read(os.path.join(ROOT, 'README.md'))
  assert '<!-- results:readme -->' in text
  with open(os.path.join(ROOT, 'results', 'readme.json'),
            encoding='utf-8') as f:
    rows = json.load(f)
  assert 0 < len(rows) <= 12


def test_a_run_provenance_comes_from_what_the_experiment_exported(tmp_path):
  env = {'TERRAFORMER_RUN_COMMIT': 'abc+dirty',
         'TERRAFORMER_RUN_COMMAND': 'bash experiments/x.sh',
         'TERRAFORMER_RUN_STARTED': '1764547200'}  # 2025-12-01T00:00:00Z
  assert results.run_provenance(str(tmp_path), env, now=1764547200 + 90) == {
      'kind': 'recorded', 'commit': 'abc+dirty',
      'command': 'bash experiments/x.sh', 'started': '2025-12-01T00:00:00Z',
      'wall_s': 90}
  # By hand, outside a git checkout: no start, an unknown commit.
  assert results.run_provenance(str(tmp_path), {}) == {
      'kind': 'recorded', 'commit': 'unknown', 'command': None}


def test_a_figure_of_several_tables_needs_its_table(tmp_path, capsys):
  table = tmp_path / 't.json'
  table.write_text(json.dumps({'columns': ['n'], 'rows': [[1]]}))
  argv = ['record', 'x', '--table', f'a={table}', '--table', f'b={table}',
          '--figure', 'f=1', '--root', str(tmp_path)]
  assert results.main(argv) == 2
  assert 'name its table (TABLE:f=...)' in capsys.readouterr().err
  argv[argv.index('f=1')] = 'c:f=1'
  assert results.main(argv) == 2
  assert "table 'c' is not recorded" in capsys.readouterr().err
  assert not (tmp_path / 'results' / 'x.json').exists()


def test_check_fails_on_missing_provenance_stray_figures_and_readme_rows(
    repo, capsys):
  assert results.main(['--root', str(repo)]) == 0
  bad = json.loads(json.dumps(OOD))
  del bad['provenance']  # the copy table has none now; old keeps its own
  bad['figures']['stale'] = '69'
  bad['tables']['old']['figures'] = ['copy_ood', 'gone']
  _write(str(repo / 'results' / 'ood.json'), json.dumps(bad))
  capsys.readouterr()
  assert results.main(['--check', '--root', str(repo)]) == 1
  out = capsys.readouterr().out
  for line in ['results/ood.json: table copy has no provenance',
               'figure copy_ood is listed by tables copy and old',
               'table old lists figure gone, which the file lacks',
               'figure stale is in no table']:
    assert line in out, out
  assert 'table old has no provenance' not in out
  # A README row may show recorded figures only.
  rows = [{'result': 'r', 'ours': 'ood/t', 'paper': '-', 'page': ''}]
  data = json.loads(json.dumps(OOD))
  data['figures']['t'] = '13.5%'
  data['tables']['old']['figures'] = ['t']
  problems = results.provenance_problems({'ood': data}, rows)
  assert problems == [
      "README row 'r': its figure ood/t comes from a transcribed table; the "
      'README shows recorded figures only']
  data['tables']['old']['provenance'] = {'kind': 'recorded',
                                         'command': 'x'}
  assert results.provenance_problems({'ood': data}, rows) == [
      'results/ood.json: table old: recorded without its command and commit']


def test_every_committed_results_file_has_provenance():
  committed = results.load_results(ROOT)
  with open(os.path.join(ROOT, 'results', 'readme.json'),
            encoding='utf-8') as f:
    rows = json.load(f)
  assert results.provenance_problems(committed, rows) == []
  kinds = {(results.provenance_of(d, t) or {}).get('kind')
           for d in committed.values() for t in d['tables'].values()}
  assert kinds <= {'recorded', 'transcribed'}


def test_a_history_table_gains_a_row_per_run_and_its_median(tmp_path):
  table = tmp_path / 't.json'
  table.write_text(json.dumps({'columns': ['model', 'vs dense'],
                               'rows': [['sparse', '16.09x']]}))
  history = {'caption': 'runs', 'columns': results.HISTORY_COLUMNS +
                                          ['speedup'],
             'rows': [['2026-11-28', 'aaaaaaa', 'CPU', 'avx512-vnni',
                       '9.65x'],
                      ['2026-11-28', 'bbbbbbb', 'CPU', 'avx2', '7.00x']],
             'figures': [],
             'history': {'figures': ['speedup'],
                         'summaries': {'speedup_runs': 'speedup'}},
             'provenance': {'kind': 'recorded', 'command': 'x',
                            'commit': 'per row'}}
  _write(str(tmp_path / 'results' / 'd.json'), json.dumps(
      {'experiment': 'd', 'command': 'x', 'tables': {'runs': history},
       'figures': {}}))
  for value in ('15.46x', '10.55x'):
    table.write_text(json.dumps({'columns': ['model', 'vs dense'],
                                 'rows': [['sparse', value]]}))
    results.record(str(tmp_path), 'd', {'models': str(table)},
                   figures={'speedup': value},
                   today=datetime.date(2026, 12, 1),
                   this_machine={'machine': 'CPU', 'isa': 'avx512-vnni'},
                   provenance={'kind': 'recorded', 'commit': 'c0ffee00',
                               'command': 'x'})
  data = json.loads(_read(str(tmp_path / 'results' / 'd.json')))
  runs = data['tables']['runs']
  assert runs['rows'][2:] == [
      ['2026-12-01', 'c0ffee0', 'CPU', 'avx512-vnni', '15.46x'],
      ['2026-12-01', 'c0ffee0', 'CPU', 'avx512-vnni', '10.55x']]
  # The median of the 3 runs on this ISA (the avx2 run is left out).
  assert data['figures']['speedup_runs'] == '10.55x [9.65x-15.46x] (3 runs)'
  assert runs['figures'] == ['speedup_runs']
  assert 'measured' not in runs  # a row per run, not one run's table
  assert results.provenance_problems(data and {'d': data}) == []
  assert results.history_summary(runs, 'speedup', 'avx2') == (
      '7.00x [7.00x-7.00x] (1 run)')
  assert results.history_summary(runs, 'speedup', 'amx') is None
