# Sourced by every experiments/NAME.sh right after it sets NAME (its file
# name: `record` writes results/NAME.json): the pinned environment
# (scripts/env.sh), the repository as the working folder, SHORT (non-empty:
# the short version) and the output folder $out (OUT in the scripts'
# headers: the first argument; default runs/experiments/NAME, or
# runs/experiments/NAME_short for the short version, so that a short run
# never resumes a full one).
# Helpers (a rerun skips what a finished run left):
#   banner TEXT...            a progress line with the time
#   once MARKER CMD...        CMD, then MARKER written; skipped when MARKER exists
#   into FILE CMD...          CMD's stdout into FILE (whole or not at all), then
#                             FILE printed; CMD skipped when FILE is not empty
#   timed FILE TOKENS CMD...  CMD (terraformer-bench) timing TOKENS tokens, 3
#                             repeats (the short version: 2 tokens, 1 repeat):
#                             its table into $out/FILE.txt (into), its JSON
#                             into $out/FILE.json
#   branch FROM TO            TO starts as a copy of the run folder FROM (to be
#                             trained on); nothing when TO exists
#   run_dirs DIR CELL SEEDS   the runs `terraformer-ood --seeds=SEEDS` (0,1) makes
#                             in DIR, DIR/CELL_seed<k>, joined by commas (as
#                             `tabulate ood` takes a row's runs)
#   resume_ood FROM TO CELL SEEDS ARGS...
#                             CELL's runs of FROM copied to TO (branch) and
#                             trained on there: terraformer-ood
#                             --output_dir=TO --cells=CELL --seeds=SEEDS ARGS
#   tabulate MODE ID INPUT... [OPTIONS]
#                             scripts/experiment_tables.py MODE: the table
#                             $out/ID.json of what a CLI wrote, and its figures
#                             (--figure), both kept for `record`
#   record ARGS...            scripts/results.py record NAME with every table and
#                             figure `tabulate` kept, and ARGS; the short
#                             version records nothing
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
SHORT="${SHORT:-}"
out="${1:-runs/experiments/$NAME${SHORT:+_short}}"
mkdir -p "$out"
tabulated=()

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

timed() {
  local file=$1 tokens=$2
  shift 2
  local timing=(--tokens="$tokens" --repeats=3)
  [[ -z "$SHORT" ]] || timing=(--tokens=2 --repeats=1)
  into "$out/$file.txt" "$@" "${timing[@]}" --json="$out/$file.json"
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
  local -a seed_list
  IFS=',' read -r -a seed_list <<< "$seeds"
  for seed in "${seed_list[@]}"; do
    dirs+=("$dir/${cell}_seed$seed")
  done
  (IFS=','; echo "${dirs[*]}")
}

resume_ood() {
  local from=$1 to=$2 cell=$3 seeds=$4 seed
  shift 4
  for seed in ${seeds//,/ }; do
    branch "$from/${cell}_seed$seed" "$to/${cell}_seed$seed"
  done
  .venv/bin/terraformer-ood --output_dir="$to" --cells="$cell" \
    --seeds="$seeds" "$@"
}

tabulate() {
  local mode=$1 id=$2 line
  shift 2
  .venv/bin/python scripts/experiment_tables.py "$mode" --out="$out/$id.json" \
    --figures="$out/$id.figures" "$@"
  tabulated+=(--table="$id=$out/$id.json")
  while IFS= read -r line; do
    tabulated+=(--figure="$line")
  done < "$out/$id.figures"
}

record() {
  if [[ -n "$SHORT" ]]; then
    echo "(short version: results/$NAME.json not written)"
    return
  fi
  .venv/bin/python scripts/results.py record "$NAME" "${tabulated[@]}" "$@"
}
