#!/usr/bin/env bash
# The tiny Terraformer, sparse vs dense (docs/sparse-vs-dense.md): the same
# model (d 128, 2 + 2 layers, 4 heads, LSH attention in chunks of 64,
# reversible blocks, low-rank SRU, vocab 2048 + 100 sentinels) with sparse FF
# N 16, sparse Q/K/V S 4 and sparse loss S 4 (gin/tiny/terraformer_pretrain.gin)
# and with dense layers (gin/tiny/terraformer_pretrain_dense.gin), trained with
# the paper's objective (single masked words, T5 sentinels) on the aclsum train
# papers' bodies, 256 input / 64 target tokens, batch 8, seed 0, to 5000
# steps; eval log-perplexity on the same 8 validation batches every 250 steps.
# The two run side by side, one per core.
#
# Cost: about 2.5 core-hours on the 2-core CPU (the sparse run ~95 minutes of
# wall time); its step times need a machine that runs nothing else.
# Short version (50 steps; no results file):
#   SHORT=1 bash experiments/sparse_vs_dense_terraformer.sh
# Writes OUT/<gin>_seed0 (checkpoints, TensorBoard events; logs beside),
# OUT/export/ (CSV, JSON, PNGs, table.md), OUT/steps.json and
# results/sparse_vs_dense_terraformer.json (table steps). Rerunning resumes.
#   bash experiments/sparse_vs_dense_terraformer.sh [OUT]
#   (OUT: runs/experiments/sparse_vs_dense_terraformer)
NAME=sparse_vs_dense_terraformer
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

steps=5000 every=250
table_steps=250,500,750,1000,1500,2000,2500,3000,3500,4000,4500,5000
[[ -n "$SHORT" ]] && steps=50 every=25 table_steps=25,50

banner "sparse and dense tiny Terraformer, one per core"
queue=experiments/sparse_vs_dense_queue.sh
taskset -c 0 bash "$queue" "$out" "$steps" "$every" terraformer_pretrain:0 &
pid0=$!
taskset -c 1 bash "$queue" "$out" "$steps" "$every" terraformer_pretrain_dense:0 &
pid1=$!
wait "$pid0"
wait "$pid1"

banner "eval log-perplexity by step"
.venv/bin/terraformer-export \
  --logdir="$out/terraformer_pretrain_dense_seed0" --label='Terraformer dense, seed 0' \
  --logdir="$out/terraformer_pretrain_seed0" --label='Terraformer FF+QKV+loss, seed 0' \
  --out="$out/export" --metrics='^eval/|^train/' \
  --table=eval/metrics/log_perplexity --table_steps="$table_steps"
figures=()
if [[ -z "$SHORT" ]]; then
  sparse='Terraformer FF+QKV+loss, seed 0:4000'
  dense='Terraformer dense, seed 0:4000'
  figures=(--figure=sparse_4000="$sparse" --figure=dense_4000="$dense"
           --figure=sparse_minus_dense_4000="$sparse - $dense")
fi
tabulate markdown steps "$out/export/table.md" "${figures[@]}"
record
banner done "outputs in $out"
