#!/usr/bin/env bash
# Creates (or reuses) .venv with the pinned, tested stack. Idempotent: it
# reinstalls only when setup.py, pyproject.toml, constraints.txt or the kernel
# sources changed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.terraformer-stamp"
# The decode kernels (terraformer/kernels/*.cc, *.h) are compiled by the
# install: a changed source reinstalls too.
want="$(cat "$root/setup.py" "$root/pyproject.toml" "$root/constraints.txt" \
  "$root"/terraformer/kernels/*.cc "$root"/terraformer/kernels/*.h \
  | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi
python="$(command -v python3.11 || command -v python3)"
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "terraformer needs Python 3.11 (found: $("$python" --version 2>&1))" >&2
  exit 1
fi
echo "Setting up $venv (first run takes a few minutes)..." >&2
[[ -x "$venv/bin/python" ]] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip >&2
"$venv/bin/pip" install -q -c "$root/constraints.txt" -e "$root[test,eval]" >&2
echo "$want" > "$stamp"
