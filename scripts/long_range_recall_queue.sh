#!/usr/bin/env bash
# Long-range recall runs (docs/long-input-quality.md), one after
# another, niced; rerunning resumes each from its checkpoint.
#   bash scripts/long_range_recall_queue.sh full:0 blockwise:0 pyramidion:1 lm_cst:0 ...
# NAME is a gin/long_input/NAME.gin; SEED sets the init and the training
# stream's seed (the validation batches stay the same for every run).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
RUNS="${RUNS:-$HOME/runs/longinput}"
mkdir -p "$RUNS"
for spec in "$@"; do
  name=${spec%:*}; seed=${spec#*:}
  dir=$RUNS/li_${name}_seed$seed
  echo "== $(date -u +%T) $name seed $seed -> $dir"
  PYTHONPATH="$root" nice -n 19 .venv/bin/terraformer-train --config_file="gin/long_input/$name.gin" \
    --config="terraformer.train.random_seed=$seed" --config="train/long_range_recall_stream.seed=$seed" \
    --output_dir="$dir" >> "$dir.log" 2>&1
  echo "== $(date -u +%T) done rc=$? $(grep '^step' "$dir.log" | tail -n 1)"
done
