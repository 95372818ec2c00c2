#!/usr/bin/env bash
# XLA operations per decoder block of the compiled decoding step
# (docs/decoding-speed.md): the 800M family (dense, sparse FF, sparse QKV,
# sparse FF+QKV, sparse FF+QKV+loss) and the Terraformer of
# gin/terraformer/c4_800m.gin; per block = (3 blocks - 1 block) / 2, each
# operation one launch of XLA:CPU's runtime per token, the branches a
# `conditional` runs included. Compiled from shapes: nothing is timed, so any
# machine will do.
#
# Cost: about 0.04 core-hours on the 2-core CPU (2.5 minutes); any machine
# (compiling only).
# Short version (dense and sparse FF+QKV only; no results file):
#   SHORT=1 bash experiments/decode_xla_ops.sh
# Writes OUT/xla_ops.{txt,json}, OUT/ops.json and results/decode_xla_ops.json
# (table ops). Rerunning reuses OUT/xla_ops.txt (delete it to recount).
#   bash experiments/decode_xla_ops.sh [OUT]  (OUT: runs/experiments/decode_xla_ops)
NAME=decode_xla_ops
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

configs=(gin/scaling_800m/dense.gin gin/scaling_800m/sparse_ff.gin
         gin/scaling_800m/sparse_qkv.gin gin/scaling_800m/sparse_ff_qkv.gin
         gin/scaling_800m/sparse_ff_qkv_loss.gin gin/terraformer/c4_800m.gin)
[[ -n "$SHORT" ]] && configs=("${configs[0]}" "${configs[3]}")
banner "XLA operations per decoder block"
into "$out/xla_ops.txt" .venv/bin/terraformer-bench --xla_ops \
  "${configs[@]/#/--config_file=}" --json="$out/xla_ops.json"
tabulate xla_ops ops "$out/xla_ops.json" \
  --label=sparse_ff='sparse FF' --label=sparse_qkv='sparse QKV' \
  --label=sparse_ff_qkv='sparse FF+QKV' \
  --label=sparse_ff_qkv_loss='sparse FF+QKV+loss' \
  --label=c4_800m='Terraformer 800M'
record
banner done "outputs in $out"
