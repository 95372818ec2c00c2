"""The package's layout (CONTRIBUTING.md): imports only point down, no circles;
outside it, scripts/ holds the entry points only and tools/ needs nothing
beyond the standard library.

Reads each module's `terraformer` imports (top-level and inside functions,
and the module names written as strings in `importlib.import_module('...')`
and `__import__('...')` calls) with `ast`; nothing is imported or run.
"""
import ast
import os
import sys

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'terraformer')

# Floor of each room (a folder or a top-level module); a room imports only
# rooms on lower floors, or itself. The table of CONTRIBUTING.md.
FLOORS = {
    'cli': 8,
    'benchmarks': 7, 'evaluation': 7, '__init__': 7,
    'training': 6, 'runtime': 6,
    'trax_bridge': 5, 'loading': 5,
    'decoding': 4, 'data': 4,
    'checkpoint': 3, 'models': 3, 'kernels': 3,
    'layers': 2, 'config': 2, 'distributed': 2,
    'errors': 1, 'supervisor': 1,
}
# Files that stand below their folder's floor: what lower floors may import.
FILE_FLOORS = {'trax_bridge/compat': 1}


# Calls that import the module named by their first argument.
STRING_IMPORTS = ('import_module', '__import__')


def _imported_names(tree):
  """Dotted names that the module `tree` imports (statements and strings)."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield from (f'{node.module}.{a.name}' for a in node.names)
    elif isinstance(node, ast.Call) and node.args:
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else getattr(
          func, 'id', None)
      first = node.args[0]
      if (called in STRING_IMPORTS and isinstance(first, ast.Constant)
          and isinstance(first.value, str)):
        yield first.value


def _modules(package=PACKAGE):
  """{'dir/file' (no .py): set of imported 'dir/file' of this package}."""
  modules = {}
  for folder, _, files in os.walk(package):
    for name in files:
      if not name.endswith('.py'):
        continue
      path = os.path.join(folder, name)
      key = os.path.relpath(path, package)[:-3]
      with open(path) as f:
        tree = ast.parse(f.read())
      imported = set()
      for full in _imported_names(tree):
        parts = full.split('.')
        if parts[0] != 'terraformer':
          continue
        for n in range(len(parts), 1, -1):  # Longest existing module.
          candidate = '/'.join(parts[1:n])
          if os.path.isfile(os.path.join(package, candidate + '.py')):
            imported.add(candidate)
            break
          if os.path.isdir(os.path.join(package, candidate)):
            imported.add(candidate + '/__init__')
            break
      modules[key] = imported - {key}
  return modules


def _floor(module):
  if module in FILE_FLOORS:
    return FILE_FLOORS[module]
  room = module.split('/')[0]
  if room not in FLOORS:
    pytest.fail(f'terraformer/{module}.py has no floor in FLOORS')
  return FLOORS[room]


def _upward(modules):
  """'module (floor) -> imported (floor)' of each import that does not point
  down."""
  up = []
  for module, imported in sorted(modules.items()):
    for other in sorted(imported):
      same_room = module.split('/')[0] == other.split('/')[0]
      if other.endswith('__init__') and not same_room:
        continue  # A package's face (hands names on); its files are checked.
      if not same_room and _floor(other) >= _floor(module):
        up.append(f'{module} ({_floor(module)}) -> {other} ({_floor(other)})')
  return up


def test_imports_only_point_down():
  up = _upward(_modules())
  assert not up, 'imports that do not point down:\n' + '\n'.join(up)


def test_no_import_circles():
  modules = _modules()
  state, circles = {}, []

  def visit(module, stack):
    state[module] = 'open'
    for other in sorted(modules.get(module, ())):
      if state.get(other) == 'open':
        circles.append(' -> '.join(stack[stack.index(other):] + [other]))
      elif other not in state:
        visit(other, stack + [other])
    state[module] = 'done'

  for module in sorted(modules):
    if module not in state:
      visit(module, [module])
  assert not circles, 'import circles:\n' + '\n'.join(circles)


def test_the_checks_see_an_upward_import_and_a_circle(monkeypatch):
  """The rules can fail: a layer importing the trainer is caught, twice."""
  real = _modules()
  monkeypatch.setitem(
      globals(), '_modules',
      lambda: dict(real, **{'layers/ops': {'training/loop'}}))
  with pytest.raises(AssertionError, match='layers/ops'):
    test_imports_only_point_down()
  with pytest.raises(AssertionError, match='import circles'):
    test_no_import_circles()  # loop -> ... -> layers/ops -> loop.


@pytest.mark.parametrize('line', [
    "importlib.import_module('terraformer.training.loop')",
    "import_module('terraformer.training.loop')",
    "__import__('terraformer.training.loop')",
])
def test_a_module_imported_by_its_name_is_an_import(tmp_path, line):
  """An import written as a string (e.g. a list of modules to register)
  points up as much as an import statement does."""
  for path, text in (('layers/ops.py', f'import importlib\n{line}\n'),
                     ('training/loop.py', '')):
    (tmp_path / path).parent.mkdir(exist_ok=True)
    (tmp_path / path).write_text(text)
  modules = _modules(str(tmp_path))
  assert modules['layers/ops'] == {'training/loop'}
  assert _upward(modules) == ['layers/ops (2) -> training/loop (6)']


# Outside the package (CONTRIBUTING.md): scripts/ holds the entry points
# only; tools/ the results toolchain, which any Python 3 runs (stdlib only).
ROOT = os.path.dirname(PACKAGE)
ENTRY_POINTS = {'env.sh', 'main.sh', 'test.sh'}


def test_scripts_holds_the_entry_points_only():
  found = set(os.listdir(os.path.join(ROOT, 'scripts'))) - {'__pycache__'}
  assert found == ENTRY_POINTS, (
      'scripts/ holds the entry points only; the results toolchain goes to '
      'tools/, an analysis of one experiment beside it in experiments/: '
      f'{sorted(found - ENTRY_POINTS)}')


def test_the_toolchain_imports_only_the_standard_library_and_itself():
  tools = os.path.join(ROOT, 'tools')
  own = {f[:-3] for f in os.listdir(tools) if f.endswith('.py')}
  assert {'results', 'experiment_tables'} <= own
  other = []
  for name in sorted(own):
    with open(os.path.join(tools, name + '.py'), encoding='utf-8') as f:
      tree = ast.parse(f.read())
    other += [f'tools/{name}.py: {full}' for full in _imported_names(tree)
              if full.split('.')[0] not in own | sys.stdlib_module_names]
  assert not other, 'imports outside the standard library:\n' + '\n'.join(
      other)
