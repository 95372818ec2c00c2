"""The test tiers (tests/conftest.py): SLOW names tests that exist, and the
fast tier touches every module; the conftest's CPU report adds up right.

`bash scripts/test.sh --fast` runs every test that SLOW does not name. Every
module of the package must be imported, directly or through the package's
own imports, by a file of that tier (a test file with a fast test, a
conftest.py, or a helper module they import), so that no module is left to
the slow tier alone. Imports are read with `ast` (statements, also inside
functions, and module names in strings: `python -m terraformer.cli.train`,
`importlib.import_module('...')`, gin's `import terraformer....`).
"""
import ast
import os
import re

import pytest

import test_layout

TESTS = os.path.dirname(os.path.abspath(__file__))
MODULE_NAME = re.compile(r'\bterraformer(?:\.\w+)+')


def _tree(path):
  with open(path) as f:
    return ast.parse(f.read())


def _test_names(tree):
  return [n.name for n in tree.body
          if isinstance(n, ast.FunctionDef) and n.name.startswith('test')]


def _is_fast(rel, tree, slow):
  """Whether the test file `rel` (relative to tests/) has a test that no
  SLOW entry covers whole (an entry of one parametrized case does not)."""
  return any(not any(e in (rel, f'{rel}::{name}') for e in slow)
             for name in _test_names(tree))


def _fast_files(slow):
  """Paths of the fast tier's files (relative to tests/, no .py)."""
  files, helpers = set(), set()
  for folder, _, names in os.walk(TESTS):
    for name in names:
      if not name.endswith('.py'):
        continue
      rel = os.path.relpath(os.path.join(folder, name), TESTS)
      rel = rel.replace(os.sep, '/')
      if name == 'conftest.py' or (
          name.startswith('test_') and _is_fast(rel, _tree(
              os.path.join(TESTS, rel)), slow)):
        files.add(rel[:-3])
      elif not name.startswith('test_'):
        helpers.add(rel[:-3])
  by_name = {h.split('/')[-1]: h for h in helpers}
  todo = list(files)
  while todo:  # Helper modules (tiny_lm, peak_rss, ...) they import.
    for name in test_layout._imported_names(_tree(os.path.join(  # pylint: disable=protected-access
        TESTS, todo.pop() + '.py'))):
      helper = by_name.get(name.split('.')[0])
      if helper and helper not in files:
        files.add(helper)
        todo.append(helper)
  return files


def _package_modules(tree, graph):
  """The package modules ('dir/file' keys of `graph`) that `tree` names."""
  names = set(test_layout._imported_names(tree))  # pylint: disable=protected-access
  names |= {m for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            for m in MODULE_NAME.findall(node.value)}
  found = set()
  for full in names:
    parts = full.split('.')
    if parts[0] != 'terraformer':
      continue
    for n in range(len(parts), 0, -1):  # Longest module of the name.
      key = '/'.join(parts[1:n]) or '__init__'
      key = key if key in graph else key + '/__init__'
      if key in graph:
        found.add(key)
        break
  return found


def untouched_modules(slow):
  """Package modules that no fast-tier file imports, directly or through
  the package's own imports (sorted)."""
  graph = test_layout._modules()  # pylint: disable=protected-access
  reached = {'__init__'}  # conftest.py imports terraformer.
  for rel in _fast_files(slow):
    reached |= _package_modules(_tree(os.path.join(TESTS, rel + '.py')),
                                graph)
  todo = list(reached)
  while todo:
    module = todo.pop()
    parent = module.rsplit('/', 1)[0] + '/__init__' if '/' in module else None
    for imported in graph[module] | ({parent} & set(graph)):
      if imported not in reached:
        reached.add(imported)
        todo.append(imported)
  return sorted(set(graph) - reached)


@pytest.fixture(name='conftest')
def _conftest(request):
  """tests/conftest.py as pytest loaded it (`import conftest` could give
  another folder's conftest.py, or load this one again)."""
  return request.config.pluginmanager.get_plugin(
      os.path.join(TESTS, 'conftest.py'))


def test_the_fast_tier_imports_every_module(conftest):
  assert untouched_modules(conftest.SLOW) == []


def test_a_module_left_to_the_slow_tier_is_found():
  # With every test file slow, only what conftest.py imports is reached.
  every_file = [os.path.relpath(os.path.join(folder, name), TESTS).replace(
      os.sep, '/') for folder, _, names in os.walk(TESTS) for name in names
                if name.startswith('test_') and name.endswith('.py')]
  left = untouched_modules(tuple(every_file))
  assert 'cli/ood' in left and 'training/soak' in left
  assert 'runtime' not in left  # conftest.py imports it.
  assert 'cli/train' not in left  # tests/cli/tiny_checkpoints.py runs it.


class _Item:
  """What `mark_slow` reads of a pytest item."""

  def __init__(self, rootpath, nodeid, decorated=False):
    self.config = type('Config', (), {'rootpath': rootpath})
    self.nodeid = nodeid
    self.marks = ['slow'] if decorated else []

  def get_closest_marker(self, name):
    return name if name in self.marks else None

  def add_marker(self, mark):
    self.marks.append(mark.name)


def _items(*nodeids, decorated=()):
  root = os.path.dirname(TESTS)
  return [_Item(root, f'tests/{n}', n in decorated) for n in nodeids]


def test_slow_entries_mark_a_file_a_test_or_a_case(conftest):
  items = _items('a/test_x.py::test_one', 'a/test_x.py::test_two[1]',
                 'a/test_x.py::test_two[2]', 'a/test_x.py::test_one_more',
                 'test_y.py::test_z')
  conftest.mark_slow(items, ('a/test_x.py::test_one', 'test_y.py',
                             'a/test_x.py::test_two[2]'))
  assert [bool(i.marks) for i in items] == [True, False, True, False, True]


def test_the_slow_list_names_collected_tests_only(conftest):
  assert conftest.SLOW_PROBLEMS == []


def test_a_stale_slow_entry_or_a_decorator_is_found(conftest):
  items = _items('a/test_x.py::test_one', 'a/test_x.py::test_two')
  assert conftest.mark_slow(items, ('a/test_x.py::test_gone',)) == [
      "SLOW in tests/conftest.py: 'a/test_x.py::test_gone' matches no test"]
  # An entry of a file that was not collected (a run of other files) is not,
  # nor one of a file whose tests the command line named.
  assert conftest.mark_slow(items, ('b/test_other.py::test_gone',)) == []
  assert conftest.mark_slow(items, ('a/test_x.py::test_three',),
                            partly_collected=['a/test_x.py']) == []
  assert conftest.mark_slow(_items('a/test_x.py::test_one', decorated=[
      'a/test_x.py::test_one']), ()) == [
          'a/test_x.py::test_one: marked by a decorator, not by SLOW in '
          'tests/conftest.py']


def test_the_cpu_report_sums_files_and_ranks_tests(conftest):
  """TERRAFORMER_TEST_CPU_REPORT's summary: files by the sum of their tests'
  own and child-process seconds, tests by their own sum."""
  lines = conftest.cpu_report({'a/test_x.py::test_one': [1.0, 5.0],
                               'a/test_x.py::test_two': [2.0, 0.0],
                               'b/test_y.py::test_big': [7.5, 0.0]}, top=2)
  assert lines == [
      'CPU seconds of 3 tests: 16 (5 in child processes)',
      'files (the 2 most):',
      '     8.0  a/test_x.py',
      '     7.5  b/test_y.py',
      'tests (the 2 most): own + children',
      '     7.5      7.5 +     0.0  b/test_y.py::test_big',
      '     6.0      1.0 +     5.0  a/test_x.py::test_one']
