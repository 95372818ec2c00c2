#!/usr/bin/env bash
# Runs the whole test suite (slow end-to-end tests included) in .venv, in
# TEST_WORKERS (default 2) pytest-xdist processes, one test file per process
# at a time (module fixtures are built once), in the order of
# tests/conftest.py (longest files first; --no-loadscope-reorder, or xdist
# starts the files with the most tests first and the one-test end-to-end
# files last). TEST_WORKERS=0: one process.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
workers="${TEST_WORKERS:-2}"
if [[ "$workers" == 0 ]]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile \
  --no-loadscope-reorder "$@"
