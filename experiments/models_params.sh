#!/usr/bin/env bash
# Parameter counts of the paper's 800M family and of the Terraformer configs
# (docs/models.md): terraformer-info counts parameters by layer kind from
# shapes only (nothing is allocated; the 17B model takes seconds).
#
# Cost: a few core-minutes on the 2-core CPU (mostly starting Python).
# Short version (the dense 800M model only; no results file):
#   SHORT=1 bash experiments/models_params.sh
# Writes OUT/<config>.json (terraformer-info --json), OUT/scaling_800m.json,
# OUT/terraformer.json and results/models_params.json (tables scaling_800m,
# terraformer).
#   bash experiments/models_params.sh [OUT]  (OUT: runs/experiments/models_params)
NAME=models_params
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# table | config (gin/<config>.gin) | label
configs=(
  'scaling_800m|scaling_800m/dense|`scaling_800m/dense.gin`'
  'scaling_800m|scaling_800m/sparse_ff|`scaling_800m/sparse_ff.gin` (N=64)'
  'scaling_800m|scaling_800m/sparse_qkv|`scaling_800m/sparse_qkv.gin` (S=16, F=3, d_ff 6144)'
  'scaling_800m|scaling_800m/sparse_ff_qkv|`scaling_800m/sparse_ff_qkv.gin`'
  'scaling_800m|scaling_800m/sparse_ff_qkv_loss|`scaling_800m/sparse_ff_qkv_loss.gin` (loss S=4)'
  'terraformer|terraformer/c4_800m|`terraformer/c4_800m.gin` (Table 8: 800M dims, loss S=4, batch 4x)'
  'terraformer|terraformer/arxiv_800m|`terraformer/arxiv_800m.gin` (fine-tuning, 16k/1k tokens)'
  'terraformer|terraformer/17b|`terraformer/17b.gin` (d_model 9216, 6+6 layers, 96 heads, attention S=64, FF N=256, loss S=4)'
)
[[ -n "$SHORT" ]] && configs=("${configs[0]}")

declare -A rows
for spec in "${configs[@]}"; do
  IFS='|' read -r table config label <<< "$spec"
  json="$out/${config//\//_}.json"
  banner "$config"
  into "$json" .venv/bin/terraformer-info --config_file="gin/$config.gin" \
    --json > /dev/null
  rows[$table]+="$label=$json"$'\n'
done

for table in scaling_800m terraformer; do
  [[ -n "${rows[$table]:-}" ]] || continue
  mapfile -t args <<< "${rows[$table]%$'\n'}"
  tabulate params "$table" "${args[@]}"
done
record
banner done "outputs in $out"
