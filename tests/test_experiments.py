"""experiments/*.sh: scripts that parse, say what they cost and how to run
them short, and record what their results file holds; experiments/lib.sh's
helpers run in a copy of its repository layout with stub CLIs (nothing is
trained): a finished step is skipped on a rerun, a failed one is not, and
the results file is written by the full version only.
"""
import datetime
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, 'tools'))
import experiment_tables  # pylint: disable=wrong-import-position
import results  # pylint: disable=wrong-import-position

# Sourced or run by the experiments, or running them; not experiments
# themselves.
HELPERS = ('lib.sh', 'sparse_vs_dense_queue.sh', 'decode_all.sh')
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, 'experiments', '*.sh')))
EXPERIMENTS = [os.path.basename(p)[:-3] for p in SCRIPTS
               if os.path.basename(p) not in HELPERS]
SOURCE_LIB = 'source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"'


def _text(name):
  with open(os.path.join(ROOT, 'experiments', f'{name}.sh'),
            encoding='utf-8') as f:
    return f.read()


def _header(text):
  """The comment under the shebang, its lines joined and spaces collapsed."""
  lines = []
  for line in text.split('\n')[1:]:
    if not line.startswith('#'):
      break
    lines.append(line[1:])
  return ' '.join(' '.join(lines).split())


def _calls(text, function):
  """The words of each call of a lib.sh function, continuation lines
  joined."""
  joined = text.replace('\\\n', ' ')
  return [shlex.split(line.strip())
          for line in joined.split('\n')
          if re.match(rf'\s*{function} ', line)]


@pytest.mark.parametrize('script', [os.path.relpath(p, ROOT)
                                    for p in SCRIPTS])
def test_every_script_parses(script):
  run = subprocess.run(['bash', '-n', script], cwd=ROOT, capture_output=True,
                       text=True, check=False)
  assert run.returncode == 0, run.stderr


def test_every_results_file_but_the_readme_names_an_experiment():
  names = {os.path.basename(p)[:-5]
           for p in glob.glob(os.path.join(ROOT, 'results', '*.json'))}
  scripts = {os.path.basename(p)[:-3] for p in glob.glob(
      os.path.join(ROOT, 'experiments', '*.*'))}
  assert names - scripts == {'readme'}
  assert set(EXPERIMENTS) <= names


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_an_experiment_sets_its_name_sources_lib_and_states_its_header(name):
  text = _text(name)
  lines = text.split('\n')
  assert lines[0] == '#!/usr/bin/env bash'
  at = lines.index(f'NAME={name}')  # `record` writes results/NAME.json.
  assert lines[at + 1] == SOURCE_LIB
  assert not any(l.startswith('source ') for l in lines[at + 2:])
  header = _header(text)
  assert f'bash experiments/{name}.sh [OUT]' in header
  assert f'(OUT: runs/experiments/{name})' in header
  cost = re.search(r'Cost: (.+?) on the 2-core CPU', header)
  assert cost, f'{name}: no "Cost: ... on the 2-core CPU" in the header'

  # What the results file says of the experiment is what the header says.
  with open(os.path.join(ROOT, 'results', f'{name}.json'),
            encoding='utf-8') as f:
    data = json.load(f)
  assert data['command'] == f'bash experiments/{name}.sh'
  assert data['cost'].startswith(f'{cost.group(1)} on the 2-core CPU'), (
      data['cost'], cost.group(1))
  short = f'SHORT=1 bash experiments/{name}.sh'
  if data.get('short_command'):
    assert data['short_command'] == short
    assert short in header
  else:
    assert 'Short version: none' in header


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_tables_and_records_use_only_what_the_scripts_take(name):
  """`tabulate MODE ID ...` names a mode and flags of
  tools/experiment_tables.py; `record` flags of `results.py record`."""
  text = _text(name)
  tabulate = experiment_tables._parser()  # pylint: disable=protected-access
  known = {a.dest for a in tabulate._actions}  # pylint: disable=protected-access
  record = {a.dest for a in results._parser_record()._actions}  # pylint: disable=protected-access
  for words in _calls(text, 'tabulate'):
    assert words[1] in {**experiment_tables.TABLES,
                        **experiment_tables.MODES}, words
    for word in words[3:]:
      if word.startswith('--'):
        assert word[2:].partition('=')[0] in known - {'out', 'figures'}, words
  for words in _calls(text, 'record'):
    for word in words[1:]:
      if word.startswith('--'):
        assert word[2:].partition('=')[0] in record - {'root'}, words
  if re.search(r'^\s*tabulate ', text, re.M):
    assert re.search(r'^\s*record\b', text, re.M), 'tables never recorded'


# ---------------------------------------------------------------------------
# lib.sh, run.

DEMO = r'''#!/usr/bin/env bash
NAME=demo
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
banner "train"
once "$out/run/train.done" stub-cli train "$out/run"
into "$out/table.md" stub-cli table
timed bench 8 stub-cli bench
mkdir -p "$out/first/cell_seed0" "$out/first/cell_seed1"
resume_ood "$out/first" "$out/later" cell 0,1 --config=x.steps=2
echo "dirs: $(run_dirs "$out/first" cell 0,1)"
tabulate markdown steps "$out/table.md" --figure=last='a:2'
record --caption=steps='two steps'
'''

STUB = r'''#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$STUB_CALLS"
[[ -z "${STUB_FAIL:-}" ]] || exit 3
case "${1:-}" in
  train) mkdir -p "$2"; echo weights > "$2/weights" ;;
  table) printf '| run | 1 | 2 |\n| --- | --- | --- |\n| a | 5.0 | 4.5 |\n' ;;
  bench) echo "a table of $*" ;;
esac
'''


def _executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  path.chmod(0o755)


@pytest.fixture
def demo(tmp_path):
  """A copy of the repository's layout: experiments/lib.sh (the real one)
  and experiments/demo.sh, tools/results.py and experiment_tables.py (the
  real ones), scripts/env.sh and the CLIs (stubs that log their calls)."""
  repo = tmp_path / 'repo'
  (repo / 'experiments').mkdir(parents=True)
  (repo / 'tools').mkdir()
  shutil.copy(os.path.join(ROOT, 'experiments', 'lib.sh'),
              repo / 'experiments')
  for script in ('results.py', 'experiment_tables.py'):
    shutil.copy(os.path.join(ROOT, 'tools', script), repo / 'tools')
  (repo / 'experiments' / 'demo.sh').write_text(DEMO)
  calls = tmp_path / 'calls.log'
  _executable(repo / 'scripts' / 'env.sh',
              f'#!/usr/bin/env bash\necho env.sh >> "{calls}"\n')
  _executable(repo / '.venv' / 'bin' / 'python',
              f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n')
  _executable(repo / '.venv' / 'bin' / 'terraformer-ood', STUB)
  _executable(tmp_path / 'bin' / 'stub-cli', STUB)
  env = {k: v for k, v in os.environ.items()
         if k not in ('SHORT', 'NAME') and not k.startswith('TERRAFORMER_RUN_')}
  env.update(PATH=f'{tmp_path / "bin"}:{os.environ["PATH"]}',
             STUB_CALLS=str(calls))

  def run(*args, **extra):  # From outside: lib.sh goes to the repository.
    done = subprocess.run(['bash', 'repo/experiments/demo.sh', *args],
                          cwd=tmp_path, env={**env, **extra},
                          capture_output=True, text=True, timeout=60,
                          check=False)
    log = calls.read_text().splitlines() if calls.exists() else []
    calls.unlink(missing_ok=True)
    return done, [c for c in log if c != 'env.sh'], 'env.sh' in log

  return repo, run


def test_lib_runs_each_step_once_and_records_the_full_version(demo):
  repo, run = demo
  out = 'runs/experiments/demo'
  done, calls, env_sh = run()
  assert done.returncode == 0, done.stderr
  assert env_sh
  assert calls == [
      f'stub-cli train {out}/run', 'stub-cli table',
      f'stub-cli bench --tokens=8 --repeats=3 --json={out}/bench.json',
      f'terraformer-ood --output_dir={out}/later --cells=cell --seeds=0,1 '
      '--config=x.steps=2']
  # resume_ood: each seed's run copied before terraformer-ood trains on.
  assert sorted(os.listdir(repo / out / 'later')) == ['cell_seed0',
                                                      'cell_seed1']
  assert f'dirs: {out}/first/cell_seed0,{out}/first/cell_seed1' in done.stdout
  with open(repo / 'results' / 'demo.json', encoding='utf-8') as f:
    recorded = json.load(f)
  assert recorded['command'] == 'bash experiments/demo.sh'
  assert recorded['measured']['date'] == datetime.date.today().isoformat()
  assert recorded['tables'] == {'steps': {
      'caption': 'two steps', 'columns': ['run', '1', '2'],
      'rows': [['a', '5.0', '4.5']], 'figures': ['last']}}
  assert recorded['figures'] == {'last': '4.5'}
  # Its provenance: what lib.sh took when the run started (no git here).
  provenance = recorded['provenance']
  assert provenance['kind'] == 'recorded'
  assert provenance['commit'] == 'unknown'
  assert provenance['command'] == 'bash experiments/demo.sh'
  assert 0 <= provenance['wall_s'] < 60

  # A rerun skips every finished step (terraformer-ood, which resumes by
  # itself, runs again) and copies no run over the one trained on.
  (repo / out / 'later' / 'cell_seed0' / 'trained').write_text('on')
  (repo / 'results' / 'demo.json').unlink()
  done, calls, _ = run()
  assert done.returncode == 0, done.stderr
  assert [c.split()[0] for c in calls] == ['terraformer-ood']
  assert f'(done before: {out}/run/train.done)' in done.stdout
  assert f'(done before: {out}/table.md; delete it to rerun)' in done.stdout
  assert os.listdir(repo / out / 'later' / 'cell_seed0') == ['trained']
  assert (repo / 'results' / 'demo.json').exists()


def test_lib_retries_a_failed_step_and_writes_nothing_for_it(demo):
  repo, run = demo
  done, calls, _ = run(STUB_FAIL='1')
  assert done.returncode == 3
  assert calls == ['stub-cli train runs/experiments/demo/run']
  assert not (repo / 'runs/experiments/demo/run/train.done').exists()
  assert not (repo / 'results').exists()
  done, calls, _ = run()
  assert done.returncode == 0, done.stderr
  assert calls[0] == 'stub-cli train runs/experiments/demo/run'


def test_lib_short_version_has_its_own_folder_and_records_nothing(demo):
  repo, run = demo
  done, calls, _ = run(SHORT='1')
  assert done.returncode == 0, done.stderr
  out = 'runs/experiments/demo_short'
  assert f'stub-cli train {out}/run' in calls
  assert f'stub-cli bench --tokens=2 --repeats=1 --json={out}/bench.json' in (
      calls)
  assert (repo / out / 'steps.json').exists()
  assert '(short version: results/demo.json not written)' in done.stdout
  assert not (repo / 'results').exists()
  assert not (repo / 'runs/experiments/demo').exists()


def test_lib_takes_the_output_folder_as_first_argument(demo):
  repo, run = demo
  done, calls, _ = run('elsewhere')
  assert done.returncode == 0, done.stderr
  assert calls[0] == 'stub-cli train elsewhere/run'
  assert (repo / 'elsewhere' / 'run' / 'train.done').exists()
