"""Test-wide setup.

pytest (prepend import mode) puts the folder of every conftest.py on sys.path,
so this file makes the helpers in tests/ (e.g. `import peak_rss`) importable
from the test files in its subfolders too.
"""
import terraformer  # noqa: F401  Installs compat fix 0 before tests import Trax.

# The longest files start first, so that with `pytest -n 2 --dist loadfile`
# (scripts/test.sh) they do not end up alone at the end of the run.
_LONGEST_FIRST = ('test_main_job.py', 'training/test_resume_sweep.py',
                  'trax_bridge/test_checkpoint_import.py',
                  'models/test_terraformer.py', 'test_gin_configs.py',
                  'models/test_long_inputs.py')


def pytest_collection_modifyitems(items):
  def rank(item):
    path = str(item.fspath).replace('\\', '/')
    for i, name in enumerate(_LONGEST_FIRST):
      if path.endswith('/' + name):
        return i
    return len(_LONGEST_FIRST)
  items.sort(key=rank)  # stable: the order within a file is kept
