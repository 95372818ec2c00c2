#!/usr/bin/env bash
# Sparse vs dense past the plateau (docs/sparse-vs-dense.md): tiny
# LMs to 5000 steps, one after another, niced; rerunning resumes each.
#   bash scripts/sparse_vs_dense_queue.sh lm_dense:0 lm_sparse:0 lm_dense:1 lm_sparse:1 \
#     lm_sparse_ff_qkv:0 lm_sparse_ff:0 lm_sparse_qkv:0 terraformer_pretrain:0 terraformer_pretrain_dense:0
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
RUNS="${RUNS:-$HOME/runs/longinput}"
mkdir -p "$RUNS"
for spec in "$@"; do
  name=${spec%:*}; seed=${spec#*:}
  dir=$RUNS/${name}_seed$seed
  echo "== $(date -u +%T) $name seed $seed -> $dir"
  PYTHONPATH="$root" nice -n 19 .venv/bin/terraformer-train --config_file="gin/tiny/$name.gin" \
    --config="terraformer.train.random_seed=$seed" --config='terraformer.train.steps=5000' \
    --config='terraformer.train.eval_every=250' --config='terraformer.train.checkpoint_every=250' \
    --output_dir="$dir" >> "$dir.log" 2>&1
  echo "== $(date -u +%T) done rc=$? $(grep '^step' "$dir.log" | tail -n 1)"
done
