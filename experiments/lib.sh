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
#                             tools/experiment_tables.py MODE: the table
#                             $out/ID.json (a table a CLI's --json holds, as
#                             it is, its rows, columns and labels picked; or
#                             one made of what a CLI wrote), and its figures
#                             (--figure), both kept for `record`
#   main_job_validation       sets eval_args (the main job's decoding of the
#                             validation papers, no repeated token trigram; the
#                             short version: 2 papers) and common (the short
#                             version's 1 + 1 layer model, 128 / 64 tokens;
#                             else empty), for the main job's tuning scripts
#   bindings_of "A;B"         the lines --config=A, --config=B
#   finetune_and_validate DIR STEPS LOG ARGS...
#                             terraformer-train of gin/main/finetune.gin into DIR
#                             to STEPS steps with ARGS (--config=...; output
#                             appended to LOG), then, unless DIR has
#                             eval_validation_stepSTEPS.json, terraformer-eval
#                             with ARGS and the script's eval_args into
#                             DIR/eval.txt; prints its F1 table
#   row_or_missing NAME LABEL JSON
#                             rows+=("LABEL=JSON") when JSON (an evaluation)
#                             exists, else missing+=("NAME") (once a name)
#   exit_unless_complete [VAR]
#                             with names in `missing`: says to run them
#                             (VAR=..., default SETTINGS) and exits 0,
#                             writing no table
#   lanes FN SPEC...          FN CORE SPEC for every SPEC, one lane of runs a
#                             CPU core of CORES (default '0 1'; the array
#                             `cores`): each lane takes the next SPEC no lane
#                             has claimed; its output into OUT/laneN.log;
#                             exits 1 after all lanes end if a run failed
#   record ARGS...            tools/results.py record NAME with every table and
#                             figure `tabulate` kept, and ARGS; the short
#                             version records nothing
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
SHORT="${SHORT:-}"
# The run's provenance, taken when it starts (`record` writes it into the
# results file): the commit its code is, "+dirty" with uncommitted changes to
# tracked files, the command and the start time.
if [[ -z "${TERRAFORMER_RUN_COMMIT:-}" ]]; then
  TERRAFORMER_RUN_COMMIT="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    TERRAFORMER_RUN_COMMIT+="+dirty"
  fi
  TERRAFORMER_RUN_COMMAND="${SHORT:+SHORT=1 }bash experiments/$NAME.sh"
  TERRAFORMER_RUN_STARTED="$(date +%s)"
  export TERRAFORMER_RUN_COMMIT TERRAFORMER_RUN_COMMAND TERRAFORMER_RUN_STARTED
fi
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
  .venv/bin/python tools/experiment_tables.py "$mode" --out="$out/$id.json" \
    --figures="$out/$id.figures" "$@"
  tabulated+=(--table="$id=$out/$id.json")
  while IFS= read -r line; do
    tabulated+=(--figure="$id:$line")
  done < "$out/$id.figures"
}

main_job_validation() {
  eval_args=(--split=validation --method=sample --no_repeat_ngram=3)
  common=()
  if [[ -n "$SHORT" ]]; then
    common=('--config=Terraformer.n_encoder_layers = 1'
            '--config=Terraformer.n_decoder_layers = 1'
            '--config=INPUT_LEN = 128' '--config=TARGET_LEN = 64'
            '--config=Terraformer.predict_mem_len = 192')
    eval_args+=(--max_examples=2 --batch_size=2)
  fi
}

bindings_of() {
  local b
  local -a list
  IFS=';' read -r -a list <<< "$1"
  for b in ${list[@]+"${list[@]}"}; do printf '%s\n' "--config=$b"; done
}

finetune_and_validate() {
  local dir=$1 steps=$2 log=$3
  shift 3
  mkdir -p "$dir"
  .venv/bin/terraformer-train --config_file=gin/main/finetune.gin \
    --output_dir="$dir" "--config=terraformer.train.steps = $steps" "$@" \
    2>&1 | tee -a "$log"
  if ! ls "$dir"/eval_validation_step"$steps".json > /dev/null 2>&1; then
    banner "$(basename "$dir"): validation papers"
    .venv/bin/terraformer-eval --config_file=gin/main/finetune.gin "$@" \
      --output_dir="$dir" "${eval_args[@]}" --print_examples=1 > "$dir/eval.txt"
  fi
  grep -A 7 '^F1' "$dir/eval.txt" || true
}

row_or_missing() {
  if [[ -f "$3" ]]; then
    rows+=("$2=$3")
  elif [[ " ${missing[*]-} " != *" $1 "* ]]; then
    missing+=("$1")
  fi
}

exit_unless_complete() {
  if (( ${#missing[@]} )); then
    banner "not evaluated yet: ${missing[*]} (run them, e.g." \
      "${1:-SETTINGS}=\"${missing[*]}\"); no table"
    exit 0
  fi
}

read -r -a cores <<< "${CORES:-0 1}"
lanes() {
  local fn=$1 n pid failed=0 pids=()
  shift
  rm -rf "$out/.claims"
  mkdir -p "$out/.claims"
  banner "$# runs, ${#cores[@]} at a time on cores ${cores[*]}" \
    "(logs: $out/lane*.log)"
  for n in "${!cores[@]}"; do
    # A claim is a directory: mkdir is atomic, so two lanes never take one.
    (for spec in "$@"; do
       if mkdir "$out/.claims/${spec//[:\/]/_}" 2> /dev/null; then
         "$fn" "${cores[$n]}" "$spec"
       fi
     done >> "$out/lane$n.log" 2>&1) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  rm -rf "$out/.claims"
  if (( failed )); then
    banner "a run failed: see $out/lane*.log"
    exit 1
  fi
}

record() {
  if [[ -n "$SHORT" ]]; then
    echo "(short version: results/$NAME.json not written)"
    return
  fi
  .venv/bin/python tools/results.py record "$NAME" "${tabulated[@]}" "$@"
}
