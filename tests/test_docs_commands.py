"""Every shell command quoted in README.md, CONTRIBUTING.md and docs/*.md
names only what exists: files of the repository (scripts, experiments, gin
files, --config_file values, OOD cells), `terraformer-*` CLIs of setup.py,
the flags each CLI (or script) defines, and gin configurables with the
parameters a `--config=` binding sets (registered as the CLIs register them). Nothing is run but `--help` of the
CLIs (in-process) and one gin parse of the bindings (in a subprocess).

A command is a line of a fenced block, or an inline code span, that starts
(after `VAR=value` assignments) with `bash`, `sh`, `python`, `.venv/bin/...`,
`terraformer-...`, `scripts/...`, `tools/...` or `experiments/...`. Placeholders (`DIR`,
`<x>`, `$VAR`, `[...]`, `...`) are not checked; what is concrete around them is.
"""
import ast
import contextlib
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, p) for p in ('README.md', 'CONTRIBUTING.md')] + sorted(
    glob.glob(os.path.join(ROOT, 'docs', '*.md')))
# Folders of the repository whose paths a command may name as inputs.
REPO_DIRS = ('gin/', 'scripts/', 'tools/', 'experiments/', 'docs/',
             'results/', 'tests/', 'terraformer/', 'tensorboard_exports/')
# Flags whose value is written, not read: it need not exist.
OUTPUT_FLAGS = {'output_dir', 'out', 'plot', 'json', 'profile_dir',
                'work_dir', 'logdir'}
CELL_FLAGS = {'cells', 'cell'}  # Out-of-distribution cells: gin/ood/<cell>.gin.
SEPARATORS = {'&&', '||', ';', '|', '&', '(', ')'}
REDIRECTS = {'>', '>>', '<', '>&', '<&', '&>', '>|'}
# Words before a command: shell keywords, wrappers.
PREFIXES = {'time', 'nohup', 'env', 'exec', 'do', 'then', 'else', 'if',
            'while', 'until', '!', '{'}
START = re.compile(
    r'^(bash|sh|python3?|\.venv/bin/\S+|terraformer-[a-z-]+|scripts/\S+|'
    r'tools/\S+|experiments/\S+)$')
ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')
# `DIR`, `TRAX_RUN`, `K` of `K_bf16.gin`: a name the text stands in for.
PLACEHOLDER_WORD = re.compile(r'^[A-Z][A-Z0-9]*(_\w*)?$')


def console_scripts():
  """{name: module} of setup.py's console_scripts, read without running it."""
  with open(os.path.join(ROOT, 'setup.py'), encoding='utf-8') as f:
    text = f.read()
  return dict(re.findall(r"'(terraformer-[a-z-]+)=([\w.]+):main'", text))


# ---------------------------------------------------------------------------
# Extracting the commands.


def _tokens(text):
  lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  try:
    return list(lexer)
  except ValueError:  # Unbalanced quotes: a placeholder-ridden line.
    return text.split()


def _commands_of_line(text):
  """The simple commands of a shell line that start with a command word."""
  commands, current, skip = [], [], False
  for token in _tokens(text) + [';']:
    if skip:
      skip = False
    elif token in SEPARATORS:
      commands.append(current)
      current = []
    elif token in REDIRECTS or token == '<<' or re.fullmatch(r'\d*>+&?',
                                                               token):
      skip = True  # The redirection's target.
    else:
      current.append(token)
  found = []
  for words in commands:
    while words and (ASSIGNMENT.match(words[0]) or words[0] in PREFIXES):
      words = words[1:]
    if words and words[0] == 'timeout' and len(words) > 1:
      words = words[2:]
    if words and not START.match(words[0]):
      # A shell function wrapping a program (`once FILE .venv/bin/x ...`).
      words = next((words[i:] for i, w in enumerate(words)
                    if w.startswith('.venv/bin/')), [])
    if words and START.match(words[0]):
      found.append(words)
  return found


def extract(text, script=False):
  """[(line number, words)] of the commands quoted in a Markdown text (or,
  with script, of a bash script: all of it is one fenced block)."""
  found = []
  lines = text.split('\n')
  in_fence, heredoc, joined, start = script, None, '', 0
  for number, line in enumerate(lines, 1):
    if not script and re.match(r'^\s*```', line):
      in_fence, heredoc, joined = not in_fence, None, ''
      continue
    if in_fence:
      if heredoc is not None:
        if line.strip() == heredoc:
          heredoc = None
        continue
      if not joined:
        start = number
      joined += re.sub(r'^\s*\$ ', '', line)
      if joined.endswith('\\'):
        joined = joined[:-1] + ' '
        continue
      marker = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", joined)
      if marker:
        heredoc = marker.group(1)
      found += [(start, words) for words in _commands_of_line(joined)]
      joined = ''
    else:
      for span in re.findall(r'`([^`\n]+)`', line):
        span = span.replace('[', ' ').replace(']', ' ')
        found += [(number, words) for words in _commands_of_line(span)]
  return found


# ---------------------------------------------------------------------------
# What the CLIs define.


def cli_flags(prog, module):
  """The flags `prog --helpfull` lists (absl: `--[no]name` for booleans)."""
  mod = __import__(module, fromlist=['main'])
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code = mod.main([prog, '--helpfull'])
  assert code == 0, f'{prog} --helpfull exited {code}'
  names = set()
  for negatable, name in re.findall(r'^\s+--(\[no\])?([A-Za-z][\w-]*):',
                                    out.getvalue(), flags=re.M):
    names.add(name)
    if negatable:
      names.add('no' + name)
  return names


def script_flags(path):
  """The flags a Python script defines: absl's DEFINE_*('name', ...) calls
  and argparse's add_argument('--name'), read from its source (not run)."""
  with open(path, encoding='utf-8') as f:
    tree = ast.parse(f.read())
  names = set()
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    attr = func.attr if isinstance(func, ast.Attribute) else getattr(
        func, 'id', '')
    strings = [a.value for a in node.args
               if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if attr.startswith('DEFINE') and strings:
      names.add(strings[0])
      if attr == 'DEFINE_bool' or attr == 'DEFINE_boolean':
        names.add('no' + strings[0])
    elif attr == 'add_argument':
      names.update(s[2:] for s in strings if s.startswith('--'))
      names.update(s[2:].replace('-', '_') for s in strings
                   if s.startswith('--'))
  return names


# ---------------------------------------------------------------------------
# Checking one command.


def is_placeholder(value):
  """`DIR`, `OUR.gin`, `runs/<x>`, `$G/a.gin`, `64,...`: not concrete."""
  if re.search(r'[$<>{}*?]|\.\.\.|…', value):
    return True
  parts = [os.path.splitext(p)[0] for p in value.split('/') if p]
  return any(PLACEHOLDER_WORD.match(p) for p in parts)


def _binding(value):
  """A --config value with a placeholder value made concrete (None); None
  for a placeholder of the whole binding (`--config=BINDING`)."""
  lhs, sep, rhs = value.partition('=')
  if not sep:
    return None if is_placeholder(value.strip()) else value
  if is_placeholder(rhs.strip().strip("'\"")):
    rhs = 'None'
  return f'{lhs.strip()} = {rhs.strip()}'


class Checker:
  """Problems of commands; collects the gin bindings for one later parse."""

  def __init__(self, root=ROOT, scripts=None, flags_of=cli_flags):
    self.root = root
    self.scripts = console_scripts() if scripts is None else scripts
    self._flags_of = flags_of
    self._flags = {}
    self.bindings = []  # (where, binding)

  def flags(self, prog):
    if prog not in self._flags:
      self._flags[prog] = self._flags_of(prog, self.scripts[prog])
    return self._flags[prog]

  def _exists(self, path):
    return os.path.exists(os.path.join(self.root, path))

  def _need(self, path, problems, what='no file'):
    if not is_placeholder(path) and not os.path.isabs(path) and (
        not self._exists(path)):
      problems.append(f'{what} {path}')

  def check(self, words, where='?'):
    """Problems of one command (a list of words), as short strings."""
    problems = []
    if any(w.startswith('~/') or '=~/' in w for w in words):
      problems.append('a path outside the repository (~/...)')
    program, args = words[0], words[1:]
    name = program[len('.venv/bin/'):] if program.startswith(
        '.venv/bin/') else program
    cli_flags_ = None
    if name.startswith('terraformer-') and not is_placeholder(name):
      if name not in self.scripts:
        problems.append(f'no CLI {name} in setup.py console_scripts')
      else:
        cli_flags_ = self.flags(name)
    elif name in ('bash', 'sh'):
      script = next((a for a in args if not a.startswith('-')), None)
      if script:
        self._need(script, problems)
      args = []  # A script's own arguments are its business.
    elif name in ('python', 'python3'):
      if args[:1] == ['-m'] and len(args) > 1:
        import importlib.util  # pylint: disable=g-import-not-at-top
        if importlib.util.find_spec(args[1].split('.')[0]) is None:
          problems.append(f'no module {args[1]}')
        args = []
      elif args and args[0] != '-' and not args[0].startswith('-'):
        self._need(args[0], problems)
        if args[0].endswith('.py') and self._exists(args[0]):
          cli_flags_ = script_flags(os.path.join(self.root, args[0]))
        name, args = args[0], args[1:]
      else:
        args = []
    elif program.startswith(('scripts/', 'tools/', 'experiments/')):
      self._need(program, problems)
      if program.endswith('.py') and self._exists(program):
        cli_flags_ = script_flags(os.path.join(self.root, program))
      else:
        args = []  # A shell script's arguments are its own business.
    elif program.startswith('.venv/bin/') and name not in (
        'pytest', 'pip', 'tensorboard'):
      problems.append(f'no program {program} (not a console script)')
    for arg in args:
      if arg.startswith('--'):
        flag, sep, value = arg[2:].partition('=')
        if cli_flags_ is not None and not is_placeholder(flag) and (
            flag not in cli_flags_):
          problems.append(f'{name} has no flag --{flag}')
        if not sep:
          continue
        if flag == 'config' and _binding(value) is not None:
          self.bindings.append((where, _binding(value)))
        elif flag == 'config_file':
          self._need(value, problems)
        elif flag in CELL_FLAGS:
          for cell in value.split(','):
            if cell.endswith('.gin') or '/' in cell:
              self._need(cell, problems)
            elif cell and not is_placeholder(cell):
              self._need(f'gin/ood/{cell}.gin', problems, 'no OOD cell file')
        elif flag not in OUTPUT_FLAGS and value.startswith(REPO_DIRS):
          self._need(value, problems)
      elif arg.startswith(REPO_DIRS):
        self._need(arg, problems)
    return problems


GIN_CHECK = r'''
import json, sys
import gin
from terraformer.cli import common
common.setup()  # What every CLI registers before it parses gin.
errors = []
for binding in json.load(sys.stdin):
  gin.clear_config()
  try:
    gin.parse_config(binding)
  except Exception as e:  # gin: ValueError/KeyError naming what is unknown.
    errors.append(str(e).strip().splitlines()[0])
  else:
    errors.append(None)
print(json.dumps(errors))
'''


def gin_errors(bindings):
  """For each binding, None or gin's complaint (an unknown configurable or
  parameter), from one parse per binding in a fresh process."""
  if not bindings:
    return []
  run = subprocess.run([sys.executable, '-c', GIN_CHECK],
                       input=json.dumps(bindings), capture_output=True,
                       text=True, cwd=ROOT, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# The pages.


EXPERIMENTS = sorted(glob.glob(os.path.join(ROOT, 'experiments', '*.sh')))


def _commands(path):
  with open(path, encoding='utf-8') as f:
    return extract(f.read(), script=path.endswith('.sh'))


@pytest.fixture(scope='module')
def problems():
  """{file: [problem]} of every page and experiment script, the gin
  bindings of all of them parsed at once."""
  checker = Checker()
  found = {}
  for path in PAGES + EXPERIMENTS:
    rel = os.path.relpath(path, ROOT)
    found[rel] = []
    for number, words in _commands(path):
      where = f'{rel}:{number}'
      found[rel] += [f'{where}: {p}' for p in checker.check(words, where)]
  for (where, binding), error in zip(
      checker.bindings, gin_errors([b for _, b in checker.bindings])):
    if error:
      found[where.split(':')[0]].append(
          f'{where}: --config={binding!r}: {error}')
  return found


def test_the_pages_quote_commands():
  counts = {os.path.relpath(p, ROOT): len(_commands(p)) for p in PAGES}
  assert counts['README.md'] >= 2, counts
  assert sum(counts.values()) >= 20, counts


@pytest.mark.parametrize('page', [os.path.relpath(p, ROOT) for p in PAGES])
def test_commands_name_only_what_exists(problems, page):
  assert not problems[page], '\n'.join(problems[page])


@pytest.mark.parametrize('script', [os.path.relpath(p, ROOT)
                                    for p in EXPERIMENTS])
def test_experiments_call_only_what_exists(problems, script):
  """The programs an experiment runs with concrete arguments: files, CLIs,
  flags and gin bindings, checked as on the pages."""
  assert not problems[script], '\n'.join(problems[script])


# Work-log labels (a session, stop or issue followed by its number; a session
# also inside a folder's name) and one machine's run folders say nothing to a
# reader of a fresh clone; git keeps the history.
LABELS = re.compile('|'.join([r'(?<![a-z])sessions?[ _-]?[0-9]', r'\bstop [0-9]',
                              r'\bissues? [0-9]', '~' + '/runs']), re.I)
LABEL_PATHS = ('README.md', 'CONTRIBUTING.md', 'CHANGELOG.md', 'setup.py',
               'docs', 'gin', 'terraformer', 'tests', 'scripts', 'tools',
               'experiments', 'results', 'tensorboard_exports')
TEXT = ('.md', '.py', '.gin', '.sh', '.json', '.cc', '.txt', '.toml', '.ini',
        '.csv')
# The pages and the committed exports also name no folder of one machine
# (its temporary or home directories): a run is named by its folder under the
# repository (`runs/experiments/NAME/RUN`), as the experiment scripts write it.
MACHINE_PATHS = re.compile('|'.join('/' + d + '/' for d in
                                    ('tmp', 'root', 'home', 'Users')))
MACHINE_PATH_PATHS = ('README.md', 'docs', 'tensorboard_exports')


def _work_log_lines(tops=LABEL_PATHS, root=ROOT):
  """'path:line: text' of each line of the text files under `tops` that holds
  a work-log label, or one machine's folder where MACHINE_PATH_PATHS says."""
  found = []
  for top in tops:
    paths = [os.path.join(root, top)]
    if os.path.isdir(paths[0]):
      paths = [os.path.join(d, f) for d, _, files in os.walk(paths[0])
               for f in files if f.endswith(TEXT)]
    machine = top in MACHINE_PATH_PATHS
    for path in paths:
      if not os.path.isfile(path):
        continue
      with open(path, encoding='utf-8', errors='replace') as f:
        for number, line in enumerate(f, 1):
          if LABELS.search(line) or (machine and MACHINE_PATHS.search(line)):
            found.append(f'{os.path.relpath(path, root)}:{number}: '
                         f'{line.strip()[:100]}')
  return found


def test_no_work_log_labels_in_docs_code_or_configs():
  found = _work_log_lines()
  assert not found, '\n'.join(found)


def test_the_work_log_check_finds_labels_and_machine_folders(tmp_path):
  session = 'sess' + 'ion'  # Not a label of this file.
  folder = tmp_path / 'tensorboard_exports' / f'ood_{session}29'
  folder.mkdir(parents=True)
  (folder / 'README.md').write_text(
      f'Runs of {session} 35.\nMade in ' + '~' + '/runs/x.\nAll fine.\n')
  (folder / 'scalars.json').write_text('{"logdir": "/' + 'root/runs/x"}\n')
  (folder / 'scalars.csv').write_text(f'run,metric\n{session}-31 x,loss\n')
  (folder / 'table.md').write_text('| run | /' + 'home/x |\n')
  (folder / 'plot.png').write_text('/' + 'tmp/ is not read in a PNG')
  (folder.parent / 'README.md').write_text(f'`ood_{session}29/`: copy\n')
  (tmp_path / 'scripts').mkdir()  # Code may name a temporary folder.
  (tmp_path / 'scripts' / 'x.py').write_text("OUT = '/" + "tmp/x'\n")
  found = _work_log_lines(('tensorboard_exports', 'scripts'), str(tmp_path))
  inside = f'tensorboard_exports/ood_{session}29/'
  assert sorted(f.split(': ')[0] for f in found) == sorted([
      'tensorboard_exports/README.md:1', inside + 'README.md:1',
      inside + 'README.md:2', inside + 'scalars.json:1',
      inside + 'scalars.csv:2', inside + 'table.md:1'])


# ---------------------------------------------------------------------------
# The check itself.

PAGE = r"""
Run `bash scripts/main.sh` or `bash scripts/nowhere.sh` or `ls gin/nowhere`.

```bash
# a comment: bash scripts/gone.sh
OUT=runs/x .venv/bin/terraformer-train --config_file=gin/tiny/lm_sparse.gin \
  --config='terraformer.train.steps = 300' --output_dir=$OUT --bogus=1
terraformer-train --config_file=gin/tiny/missing.gin --config=terraformer.train.steps=N \
  --config='terraformer.train.no_such_parameter = 3' && terraformer-nope --x
terraformer-train: error: printed output, not a command
terraformer-ood --output_dir=~/out/x --cells=copy_transformer,copy_nothing --seeds=0,1 > log.txt
.venv/bin/python tools/results.py record x --table t=a.json --nope
.venv/bin/python - 3 <<'PY'
bash scripts/inside_the_heredoc.sh
PY
terraformer-decode --config_file=OUR.gin --output_dir=DIR --input='...' --no_such
tools/results.py --check --bogus
```
"""


def _fake_flags(prog, module):
  del prog
  return {'train': {'config_file', 'config', 'output_dir', 'steps'},
          'ood': {'config_file', 'config', 'output_dir', 'cells', 'seeds'},
          'decode': {'config_file', 'config', 'output_dir', 'input'},
          }[module]


def test_extract_finds_the_commands_of_fences_and_code_spans():
  found = extract(PAGE)
  assert [(n, w[0]) for n, w in found] == [
      (2, 'bash'), (2, 'bash'),
      (6, '.venv/bin/terraformer-train'), (8, 'terraformer-train'),
      (8, 'terraformer-nope'),
      (11, 'terraformer-ood'), (12, '.venv/bin/python'),
      (13, '.venv/bin/python'), (16, 'terraformer-decode'),
      (17, 'tools/results.py')]
  assert found[2][1] == [
      '.venv/bin/terraformer-train', '--config_file=gin/tiny/lm_sparse.gin',
      '--config=terraformer.train.steps = 300', '--output_dir=$OUT',
      '--bogus=1']
  assert found[5][1][-1] == '--seeds=0,1'  # The redirection's target dropped.


def test_the_check_finds_what_does_not_exist():
  checker = Checker(scripts={'terraformer-train': 'train',
                             'terraformer-ood': 'ood',
                             'terraformer-decode': 'decode'},
                    flags_of=_fake_flags)
  problems = [checker.check(words) for _, words in extract(PAGE)]
  assert problems == [
      [],
      ['no file scripts/nowhere.sh'],
      ['terraformer-train has no flag --bogus'],
      ['no file gin/tiny/missing.gin'],
      ['no CLI terraformer-nope in setup.py console_scripts'],
      ['a path outside the repository (~/...)',
       'no OOD cell file gin/ood/copy_nothing.gin'],
      ['tools/results.py has no flag --nope'],
      [],
      ['terraformer-decode has no flag --no_such'],
      ['tools/results.py has no flag --bogus']]
  assert [b for _, b in checker.bindings] == [
      'terraformer.train.steps = 300', 'terraformer.train.steps = None',
      'terraformer.train.no_such_parameter = 3']


def test_gin_names_unknown_configurables_and_parameters():
  errors = gin_errors(['terraformer.train.steps = None',
                       'terraformer.train.no_such_parameter = 3',
                       'terraformer.no_such_configurable.x = 1',
                       "INIT_CHECKPOINT = 'runs/x'"])
  assert errors[0] is None and errors[3] is None
  assert 'no_such_parameter' in errors[1]
  assert 'no_such_configurable' in errors[2]


def test_the_flags_of_a_cli_and_of_a_script():
  train = cli_flags('terraformer-train',
                    console_scripts()['terraformer-train'])
  assert {'config_file', 'config', 'output_dir', 'steps'} <= train
  assert 'no_such_flag' not in train
  info = cli_flags('terraformer-info', console_scripts()['terraformer-info'])
  assert {'json', 'nojson'} <= info
  results = script_flags(os.path.join(ROOT, 'tools', 'results.py'))
  assert {'check', 'root', 'table', 'figure', 'caption'} <= results
