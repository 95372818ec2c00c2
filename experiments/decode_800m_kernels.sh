#!/usr/bin/env bash
# Whole 800M models with the fused decode kernels (docs/decoding-speed.md):
# dense (XLA), sparse FF+QKV on XLA and with the kernels
# (gin/bench/800m_sparse_ff_qkv_kernels.gin), sparse FF+QKV+loss on XLA and
# with the kernels and float32, bfloat16 and int8 weights
# (gin/bench/800m_sparse_ff_qkv_loss_kernels*.gin), each beside its dense
# twin (the same decode options: gin/bench/800m_dense_kernels*.gin, the `vs
# dense` and `vs dense bound` columns), one encoder block (a
# decoding step reads only the encoder's cached output), timed in one run;
# batch 1, 4 tokens after a 16-token prompt, 3 repeats. Bytes per token count
# the stored types; the last line names each model's decode path and ISA.
#
# Cost: about 0.08 core-hours on the 2-core CPU (4 minutes); needs a quiet machine.
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_800m_kernels.sh
# Writes OUT/bench.{txt,json}, OUT/models.json and
# results/decode_800m_kernels.json (table models). Rerunning reuses
# OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_800m_kernels.sh [OUT]
#   (OUT: runs/experiments/decode_800m_kernels)
NAME=decode_800m_kernels
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

banner "800M, XLA and fused kernels (float32, bf16, int8 weights)"
timed bench 4 .venv/bin/terraformer-bench \
  --config_file=gin/scaling_800m/dense.gin \
  --config_file=gin/bench/800m_dense_kernels.gin \
  --config_file=gin/bench/800m_dense_kernels_bf16.gin \
  --config_file=gin/bench/800m_dense_kernels_int8.gin \
  --config_file=gin/scaling_800m/sparse_ff_qkv.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_kernels.gin \
  --config_file=gin/scaling_800m/sparse_ff_qkv_loss.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_bf16.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_int8.gin \
  --config=ScalingTransformer.n_encoder_layers=1
tabulate speed models "$out/bench.json" \
  --columns='model,ms/token [min-max],ms/block,MB/token,GB/s,bound ms,x bound,speedup,vs dense,vs dense bound' \
  --label=dense='dense (XLA)' --label=sparse_ff_qkv='sparse FF+QKV, XLA' \
  --label=800m_dense_kernels='dense, kernels f32' \
  --label=800m_dense_kernels_bf16='dense, kernels bf16' \
  --label=800m_dense_kernels_int8='dense, kernels int8' \
  --label=800m_sparse_ff_qkv_kernels='sparse FF+QKV, kernels' \
  --label=sparse_ff_qkv_loss='sparse FF+QKV+loss, XLA' \
  --label=800m_sparse_ff_qkv_loss_kernels='sparse FF+QKV+loss, kernels f32' \
  --label=800m_sparse_ff_qkv_loss_kernels_bf16='sparse FF+QKV+loss, kernels bf16' \
  --label=800m_sparse_ff_qkv_loss_kernels_int8='sparse FF+QKV+loss, kernels int8' \
  --figure=ff_qkv_kernels='sparse FF+QKV, kernels:speedup' \
  --figure=ff_qkv_loss_int8='sparse FF+QKV+loss, kernels int8:speedup'
record --caption="models=800M models with one encoder block, XLA and the fused \
kernels with float32, bf16 and int8 weights, timed in one run; batch 1, 4 \
tokens after a 16-token prompt, median of 3 repeats, quiet CPU; bound = bytes \
read per token / the GEMV bandwidth measured after each round of that model's \
repeats (GB/s: their median); speedup over the dense model (XLA); vs dense \
and vs dense bound: over the dense model with the same kernels and weight \
storage, measured and at its bound on this model's bandwidth."
banner done "outputs in $out"
