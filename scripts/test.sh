#!/usr/bin/env bash
# Runs the whole test suite (slow end-to-end tests included) in .venv.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
