#!/usr/bin/env bash
# Whole greedy decoding calls as a user makes them (docs/decoding.md): ours
# (terraformer.decoding.search.decode) next to Trax 1.4.1's
# `autoregressive_sample` on the same 800M models (gin/scaling_800m/dense.gin,
# sparse_ff_qkv_loss.gin), random weights, 8 tokens after a 16-token input
# (so the encoder runs in each call), median of 2 calls after the first (the
# first includes compilation); both must decode the same tokens.
#
# Cost: about 0.1 core-hours on the 2-core CPU; needs a quiet machine.
# Short version (the tiny sparse LM, gin/tiny/lm_sparse.gin; no results file):
#   SHORT=1 bash experiments/decode_user_path.sh
# Writes OUT/user_path.{txt,json}, OUT/calls.json and
# results/decode_user_path.json (table calls). Rerunning reuses
# OUT/user_path.txt (delete it to re-time).
#   bash experiments/decode_user_path.sh [OUT]
#   (OUT: runs/experiments/decode_user_path)
NAME=decode_user_path
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

models=(--config_file=gin/scaling_800m/dense.gin
        --config_file=gin/scaling_800m/sparse_ff_qkv_loss.gin)
figure=(--figure=ff_qkv_loss='sparse FF+QKV+loss 800M:Trax / ours')
if [[ -n "$SHORT" ]]; then
  models=(--config_file=gin/tiny/lm_sparse.gin)
  figure=()
fi
banner "ours vs Trax's autoregressive_sample, whole calls"
into "$out/user_path.txt" .venv/bin/terraformer-bench --trax_user_path \
  "${models[@]}" --tokens=8 --repeats=2 --json="$out/user_path.json"
tabulate user_path calls "$out/user_path.json" \
  --label=dense='dense 800M' --label=sparse_ff_qkv_loss='sparse FF+QKV+loss 800M' \
  "${figure[@]}"
record
banner done "outputs in $out"
