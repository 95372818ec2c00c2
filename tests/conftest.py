"""Test-wide setup.

pytest (prepend import mode) puts the folder of every conftest.py on sys.path,
so this file makes the helpers in tests/ (e.g. `import peak_rss`) importable
from the test files in its subfolders too.
"""
import terraformer  # noqa: F401  Installs compat fix 0 before tests import Trax.

# The longest files start first, longest first (by their durations in the
# clean-clone run of stop 30), so that with `pytest -n 2 --dist loadfile
# --no-loadscope-reorder` (scripts/test.sh) they do not end up alone at the
# end of the run while the other worker idles.
_LONGEST_FIRST = ('training/test_resume_sweep.py',
                  'training/test_distributed.py',
                  'test_main_job.py', 'cli/test_cli_memory_bench.py',
                  'models/test_terraformer.py', 'decoding/test_search.py',
                  'cli/test_cli_decode.py', 'cli/test_cli_ood.py',
                  'training/test_soak.py', 'test_gin_configs.py',
                  'kernels/test_kernels.py',
                  'trax_bridge/test_checkpoint_import.py',
                  'models/test_long_inputs.py', 'training/test_loop.py',
                  'trax_bridge/test_compat.py')


def pytest_collection_modifyitems(items):
  def rank(item):
    path = str(item.fspath).replace('\\', '/')
    for i, name in enumerate(_LONGEST_FIRST):
      if path.endswith('/' + name):
        return i
    return len(_LONGEST_FIRST)
  items.sort(key=rank)  # stable: the order within a file is kept
