#!/usr/bin/env bash
# Kill -9 soak of crash-safe training (terraformer/training/soak.py): kills a tiny
# training run at random moments, restarts it, checks every resume and the
# final weights against an uninterrupted run. Flags go to terraformer.training.soak:
#   bash scripts/soak.sh --work_dir=/tmp/soak --kills=50
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
exec .venv/bin/python -m terraformer.training.soak "$@"
