#!/usr/bin/env bash
# Decoding speed of the 800M family and the Terraformer (Table 1;
# docs/decoding-speed.md): the 24 + 24-layer encoder-decoders of
# gin/scaling_800m/ (d_model 1024, vocab 32100) dense, with sparse FF + QKV
# and with sparse FF + QKV + loss, and the Terraformer of
# gin/terraformer/c4_800m.gin; random weights, batch 1, 8 tokens after a
# 16-token prompt, 3 repeats, timed interleaved in one run (XLA path). Prints
# ms/token, ms per decoder block, bytes read per token and the bound those
# bytes give at the GEMV bandwidth measured in the run.
#
# Cost: about 0.05 core-hours on the 2-core CPU (2.5 minutes); needs a quiet machine (the
# ratios move with load: compare them within one run).
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_800m.sh
# Writes OUT/bench.{txt,json}, OUT/models.json and results/decode_800m.json
# (table models). Rerunning reuses OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_800m.sh [OUT]   (OUT: runs/experiments/decode_800m)
NAME=decode_800m
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

banner "800M dense, sparse FF+QKV, sparse FF+QKV+loss, Terraformer"
timed bench 8 .venv/bin/terraformer-bench \
  --config_file=gin/scaling_800m/dense.gin \
  --config_file=gin/scaling_800m/sparse_ff_qkv.gin \
  --config_file=gin/scaling_800m/sparse_ff_qkv_loss.gin \
  --config_file=gin/terraformer/c4_800m.gin
tabulate speed models "$out/bench.json" \
  --columns='model,ms/token [min-max],ms/block,MB/token,MB/block,bound ms,x bound,speedup,per block,vs dense,vs dense bound' \
  --label=sparse_ff_qkv='sparse FF+QKV' \
  --label=sparse_ff_qkv_loss='sparse FF+QKV+loss (S=4)' \
  --label=c4_800m='Terraformer 800M' \
  --paper=sparse_ff_qkv='2.62x (3.05x per block)' --paper=c4_800m='1.92x' \
  --figure=ff_qkv='sparse FF+QKV:speedup' \
  --figure=ff_qkv_per_block='sparse FF+QKV:per block' \
  --figure=ff_qkv_loss='sparse FF+QKV+loss (S=4):speedup' \
  --figure=terraformer='Terraformer 800M:speedup' \
  --figure=ff_qkv_vs_dense_bound='sparse FF+QKV:vs dense bound' \
  --figure=terraformer_vs_dense_bound='Terraformer 800M:vs dense bound'
record --caption="models=The 800M encoder-decoders (24 + 24 blocks, d_model 1024, \
vocab 32100) and the Terraformer 800M, XLA path, batch 1, 8 tokens after a \
16-token prompt, 3 repeats, timed interleaved in one run; bound = bytes read \
per token / the GEMV bandwidth measured after each round of that model's \
repeats. Speedups are over the \
dense row, measured (speedup, vs dense) and at the dense model's bound on \
this model's bandwidth (vs dense bound); paper: Table 1 (sparse FF+QKV) and Table 8 (Terraformer, 1.92x \
in its caption)."
banner done "outputs in $out"
