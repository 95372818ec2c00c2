"""Test-wide setup.

pytest (prepend import mode) puts the folder of every conftest.py on sys.path,
so this file makes the helpers in tests/ (e.g. `import peak_rss`) importable
from the test files in its subfolders too.

For the whole session, this process and every process a test starts (they
inherit the environment):

- JAX's persistent compilation cache is .pytest_compilation_cache/ (shared by
  the xdist workers and kept between runs; TERRAFORMER_COMPILATION_CACHE, if
  set, names another directory or `off`): tests that compile the same tiny
  models load what another test compiled.
- XLA's CPU rendezvous waits longer: on a loaded machine (2 cores, load 5-7)
  the threads of 4 forced host devices reached an all-reduce more than 40 s
  apart, and XLA ended the process ("Termination timeout for `all reduce
  RendezvousKey{...}` of 40 seconds", rendezvous.cc). A real deadlock still
  ends: every test bounds its subprocesses' time.
"""
import os

import terraformer  # noqa: F401  Installs compat fix 0 before tests import Trax.
from terraformer import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Flags of jaxlib 0.10.2's XLA (an unknown flag in XLA_FLAGS aborts JAX).
RENDEZVOUS_FLAGS = ('--xla_cpu_collective_call_warn_stuck_timeout_seconds=120',
                    '--xla_cpu_collective_call_terminate_timeout_seconds=600')

os.environ.setdefault(runtime.COMPILATION_CACHE_ENV,
                      os.path.join(ROOT, '.pytest_compilation_cache'))
runtime.use_compilation_cache(runtime.compilation_cache_dir())
os.environ['XLA_FLAGS'] = ' '.join(
    [os.environ.get('XLA_FLAGS', '')] +
    [f for f in RENDEZVOUS_FLAGS
     if f.split('=')[0] not in os.environ.get('XLA_FLAGS', '')]).strip()

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
