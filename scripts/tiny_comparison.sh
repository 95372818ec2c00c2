#!/usr/bin/env bash
# The paper's Figure 1 comparison at tiny scale (tensorboard_exports/sparse_is_enough_tiny):
# dense vs sparse FF vs sparse QKV vs sparse FF+QKV decoder-only LMs (gin/tiny/lm_*.gin),
# SEEDS x models, STEPS steps each, one run after another; then exports the curves.
#
#   bash scripts/tiny_comparison.sh                 # 2 seeds x 1500 steps (about 1.5 h on 2 cores)
#   SEEDS="0" STEPS=300 RUNS=/tmp/cmp bash scripts/tiny_comparison.sh
#
# Reruns resume unfinished runs (terraformer-train resumes from its checkpoint).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
SEEDS="${SEEDS:-0 1}"
STEPS="${STEPS:-1500}"
RUNS="${RUNS:-runs/tiny_comparison}"
OUT="${OUT:-tensorboard_exports/sparse_is_enough_tiny}"
MODELS="${MODELS:-dense sparse_ff sparse_qkv sparse_ff_qkv}"
declare -A LABEL=([dense]='Dense' [sparse_ff]='Sparse FF (N=16)'
                  [sparse_qkv]='Sparse QKV (S=4, d_ff 640)' [sparse_ff_qkv]='Sparse FF+QKV')
mkdir -p "$RUNS"
export_args=()
for seed in $SEEDS; do
  for name in $MODELS; do
    dir="$RUNS/${name}_seed$seed"
    echo "== $name, seed $seed: $dir (log: $dir.log)"
    .venv/bin/terraformer-train --config_file="gin/tiny/lm_$name.gin" \
      --config="terraformer.train.random_seed=$seed" \
      --config='terraformer.train.eval_every=250' \
      --config='terraformer.train.checkpoint_every=250' \
      --steps="$STEPS" --output_dir="$dir" > "$dir.log" 2>&1
    tail -n 2 "$dir.log"
    export_args+=(--logdir="$dir" --label="${LABEL[$name]}, seed $seed")
  done
done
.venv/bin/terraformer-export "${export_args[@]}" --out="$OUT"
