#!/usr/bin/env bash
# The 17B models decoded for real, full depth (6 + 6 blocks), int8 weights and
# the fused C++ kernels (docs/decoding-speed.md): gin/bench/*17b*_kernels_int8.gin
# (decode_options.kernels = 'ffi', weights = 'int8', bench_weights.created =
# 'stored': each kernel matrix made directly in int8, never a float32 copy);
# dense, sparse FF+QKV+loss, the Terraformer and sparse FF+QKV, one model at a
# time; batch 1, 4 tokens after a 16-token prompt, 3 repeats. Prints each
# model's memory by layer kind and the run's peak RSS.
#
# Cost: about 0.2 core-hours on the 2-core CPU (8 minutes) and ~16 GiB of
# memory; needs a quiet machine.
# Short version (1 decoder block, no encoder blocks, 2 tokens, 1 repeat; no
# results file): SHORT=1 bash experiments/decode_17b_int8.sh
# Writes OUT/bench.{txt,json}, OUT/models.json and results/decode_17b_int8.json
# (table models). Rerunning reuses OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_17b_int8.sh [OUT]
#   (OUT: runs/experiments/decode_17b_int8)
NAME=decode_17b_int8
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

depth=()
if [[ -n "$SHORT" ]]; then
  for model in ScalingTransformer Terraformer; do
    depth+=(--config=$model.n_decoder_layers=1 --config=$model.n_encoder_layers=0)
  done
fi
banner "17B int8 + kernels, full depth, one model at a time"
timed bench 4 .venv/bin/terraformer-bench \
  --config_file=gin/bench/17b_dense_kernels_int8.gin \
  --config_file=gin/bench/17b_sparse_ff_qkv_loss_kernels_int8.gin \
  --config_file=gin/bench/terraformer_17b_kernels_int8.gin \
  --config_file=gin/bench/17b_sparse_ff_qkv_kernels_int8.gin \
  ${depth[@]+"${depth[@]}"}
tabulate speed models "$out/bench.json" \
  --columns='model,ms/token [min-max],ms/block,MB/token,GB/s,bound ms,x bound,speedup,per block,vs dense,vs dense bound' \
  --label=17b_dense_kernels_int8=dense \
  --label=17b_sparse_ff_qkv_loss_kernels_int8='sparse FF+QKV+loss' \
  --label=terraformer_17b_kernels_int8='Terraformer 17B' \
  --label=17b_sparse_ff_qkv_kernels_int8='sparse FF+QKV' \
  --paper=17b_dense_kernels_int8='1x (3.651 s)' \
  --paper=17b_sparse_ff_qkv_loss_kernels_int8='37.64x (0.097 s)' \
  --paper=terraformer_17b_kernels_int8='37.64x (0.097 s)' \
  --paper=17b_sparse_ff_qkv_kernels_int8='19.98x (0.183 s)' \
  --figure=ff_qkv='sparse FF+QKV:speedup' \
  --figure=ff_qkv_loss='sparse FF+QKV+loss:speedup' \
  --figure=terraformer='Terraformer 17B:speedup'
tabulate memory held "$out/bench.json" \
  --label=17b_dense_kernels_int8=dense \
  --label=17b_sparse_ff_qkv_loss_kernels_int8='sparse FF+QKV+loss' \
  --label=terraformer_17b_kernels_int8='Terraformer 17B' \
  --label=17b_sparse_ff_qkv_kernels_int8='sparse FF+QKV'
record --caption=held="What a full-depth int8 model holds (GiB), counted from its shapes (the run prints the same split, by layer class and dtype). Its peak RSS is 1.3-1.5 GiB more (runtime, compiled steps, XLA temporaries)." --caption=models="The 17B models decoded for real at full depth (6 + 6 blocks), int8 weights with float32 row scales (float activations) and the fused kernels, one model at a time; batch 1, 4 tokens after a 16-token prompt, median of 3 repeats, quiet CPU; bound = bytes read per token / the GEMV bandwidth measured after each round of that model's repeats (GB/s: their median); speedup and vs dense: against the dense int8 model, vs dense bound: that model at its bound on this model's bandwidth (its bytes read at this model's GB/s). Paper: Table 6."
banner done "outputs in $out"
