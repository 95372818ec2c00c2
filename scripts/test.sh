#!/usr/bin/env bash
# Runs the whole test suite (slow tests included) in .venv, in TEST_WORKERS
# (default 3) pytest-xdist processes, one test file per process at a time
# (module fixtures are built once), in the order of tests/conftest.py
# (longest files first; --no-loadscope-reorder, or xdist starts the files
# with the most tests first and the one-test end-to-end files last).
# Three workers on the 2-core machine: a worker that waits (on a subprocess,
# a file, the compilation cache) leaves its core to the third.
# TEST_WORKERS=0: one process.
#   --fast  the fast tier: no test marked slow (the list SLOW in
#           tests/conftest.py, with its threshold), `-m 'not slow'`.
# Other arguments go to pytest (test paths, -k, -x, ...).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
args=()
for arg in "$@"; do
  if [[ "$arg" == --fast ]]; then args+=(-m 'not slow'); else args+=("$arg"); fi
done
set -- ${args[@]+"${args[@]}"}
workers="${TEST_WORKERS:-3}"
if [[ "$workers" == 0 ]]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile \
  --no-loadscope-reorder "$@"
