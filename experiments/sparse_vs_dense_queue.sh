#!/usr/bin/env bash
# One queue of the sparse-vs-dense trainings (experiments/sparse_vs_dense_*.sh):
# for each NAME:SEED, in turn, terraformer-train --config_file=gin/tiny/NAME.gin
# with that seed, evaluating (on the same first 8 validation batches every
# time) and checkpointing every EVERY steps, to STEPS steps, into
# DIR/NAME_seedSEED (log: DIR/NAME_seedSEED.log). A finished run is skipped;
# an unfinished one resumes from its last checkpoint.
#   bash experiments/sparse_vs_dense_queue.sh DIR STEPS EVERY NAME:SEED...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dir=$1 steps=$2 every=$3
shift 3
mkdir -p "$dir"
for spec in "$@"; do
  name=${spec%:*} seed=${spec#*:}
  run=$dir/${name}_seed$seed
  if [[ -f "$run/done" ]]; then
    echo "== $name seed $seed: done before ($run)"
    continue
  fi
  echo "== $name seed $seed -> $run"
  .venv/bin/terraformer-train --config_file="gin/tiny/$name.gin" \
    --config="terraformer.train.random_seed=$seed" \
    --config="terraformer.train.steps=$steps" \
    --config="terraformer.train.eval_every=$every" \
    --config="terraformer.train.checkpoint_every=$every" \
    --output_dir="$run" >> "$run.log" 2>&1
  grep '^step' "$run.log" | tail -n 1
  touch "$run/done"
done
