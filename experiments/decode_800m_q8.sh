#!/usr/bin/env bash
# The 800M models with the Q8 GEMV (docs/decoding-speed.md): the dense model
# and sparse FF+QKV+loss, each with the fused kernels and int8 weights with
# float activations (gin/bench/800m_*_kernels_int8.gin) and with the Q8 GEMV
# (int8 weights packed for the one-row product, int8 activations;
# gin/bench/800m_*_kernels_q8.gin), and with the Q8 GEMV sparse FF+QKV and
# the Terraformer 800M (gin/bench/terraformer_800m_kernels_q8.gin), one
# encoder block (a decoding step reads only the encoder's cached output),
# timed in one run; batch 1, 8 tokens after a 16-token prompt, 3 repeats.
# The last line names each model's decode path and the GEMV's instruction
# set.
#
# Cost: about 0.02 core-hours on the 2-core CPU (1 minute); needs a quiet machine.
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_800m_q8.sh
# Writes OUT/bench.{txt,json}, OUT/models.json and results/decode_800m_q8.json
# (table models). Rerunning reuses OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_800m_q8.sh [OUT]  (OUT: runs/experiments/decode_800m_q8)
NAME=decode_800m_q8
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

banner "800M, int8 weights vs Q8 GEMV: dense, sparse FF+QKV(+loss), Terraformer"
timed bench 8 .venv/bin/terraformer-bench \
  --config_file=gin/bench/800m_dense_kernels_int8.gin \
  --config_file=gin/bench/800m_dense_kernels_q8.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_int8.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_q8.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_kernels_q8.gin \
  --config_file=gin/bench/terraformer_800m_kernels_q8.gin \
  --config=ScalingTransformer.n_encoder_layers=1 \
  --config=Terraformer.n_encoder_layers=1
tabulate speed models "$out/bench.json" \
  --columns='model,ms/token [min-max],ms/block,MB/token,GB/s,bound ms,x bound,speedup,vs dense,vs dense bound' \
  --label=800m_dense_kernels_int8='dense, int8' \
  --label=800m_dense_kernels_q8='dense, Q8' \
  --label=800m_sparse_ff_qkv_loss_kernels_int8='sparse FF+QKV+loss, int8' \
  --label=800m_sparse_ff_qkv_loss_kernels_q8='sparse FF+QKV+loss, Q8' \
  --label=800m_sparse_ff_qkv_kernels_q8='sparse FF+QKV, Q8' \
  --label=terraformer_800m_kernels_q8='Terraformer 800M, Q8' \
  --figure=dense_q8_x_bound='dense, Q8:x bound' \
  --figure=sparse_q8_x_bound='sparse FF+QKV+loss, Q8:x bound' \
  --figure=ff_qkv_q8_vs_dense='sparse FF+QKV, Q8:vs dense' \
  --figure=terraformer_q8_vs_dense='Terraformer 800M, Q8:vs dense'
record --caption=models="The 800M models (one encoder block) with the fused kernels: int8 weights with float activations beside the Q8 GEMV (int8 weights packed for the one-row product, int8 activations; the Terraformer's decoder blocks one call each); batch 1, 8 tokens after a 16-token prompt, median of 3 repeats, quiet CPU; bound = bytes read per token / the GEMV bandwidth measured after each round of that model's repeats (GB/s: their median); speedup against the dense int8 model of the same run; vs dense and vs dense bound: against the dense model of the same storage, measured and at its bound on this model's bandwidth (its bytes read at this model's GB/s)."
banner done "outputs in $out"
