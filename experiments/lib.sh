# Sourced by experiments/*.sh after they set NAME: the pinned
# environment, the output folder OUT (first argument, default
# runs/experiments/NAME; a short version's default gets `_short`), and helpers:
#   banner TEXT...          a progress line with the time
#   once MARKER CMD...      CMD, then MARKER written; skipped when MARKER exists
#   into FILE CMD...        CMD's stdout into FILE (whole or not at all), once
#   branch FROM TO          TO starts as a copy of the run FROM (resumed later)
#   run_dirs DIR CELL SEEDS the run folders DIR/CELL_seed<k>, comma-separated
#   record ARGS...          scripts/results.py record NAME ARGS (not if SHORT)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
SHORT="${SHORT:-}"
out="${1:-runs/experiments/$NAME${SHORT:+_short}}"
mkdir -p "$out"

banner() {
  printf '\n=== [%s] %s ===\n' "$(date +%H:%M:%S)" "$*"
}

once() {
  local marker=$1
  shift
  if [[ -f "$marker" ]]; then
    echo "(done before: $marker)"
  else
    "$@"
    mkdir -p "$(dirname "$marker")"
    date -u +%FT%TZ > "$marker"
  fi
}

into() {
  local file=$1
  shift
  if [[ -s "$file" ]]; then
    echo "(done before: $file; delete it to rerun)"
  else
    "$@" > "$file.tmp"
    mv "$file.tmp" "$file"
  fi
  cat "$file"
}

branch() {
  local from=$1 to=$2
  if [[ ! -d "$to" ]]; then
    mkdir -p "$(dirname "$to")"
    cp -r "$from" "$to"
  fi
}

run_dirs() {
  local dir=$1 cell=$2 seeds=$3 seed dirs=()
  IFS=',' read -r -a seed_list <<< "$seeds"
  for seed in "${seed_list[@]}"; do
    dirs+=("$dir/${cell}_seed$seed")
  done
  (IFS=','; echo "${dirs[*]}")
}

record() {
  if [[ -n "$SHORT" ]]; then
    echo "(short version: results/$NAME.json not written)"
    return
  fi
  .venv/bin/python scripts/results.py record "$NAME" "$@"
}
