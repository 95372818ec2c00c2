#!/usr/bin/env bash
# The 17B models with the Q8 GEMV (docs/decoding-speed.md): int8 weights
# packed for the one-row product and int8 activations (decode_options.weights
# = 'q8', gin/bench/*17b*_kernels_q8.gin) beside the same models with int8
# weights and float activations (gin/bench/*17b*_kernels_int8.gin), full depth
# (6 + 6 blocks), fused C++ kernels, one model at a time; batch 1, 4 tokens
# after a 16-token prompt, 3 repeats. The speedup column is against the first
# model, the dense int8 one; `vs dense` against the dense model of the same
# storage (Q8 or int8), `vs dense bound` against that model at its bytes
# bound on this model's bandwidth; compute ms: the step's multiply-adds at
# the kernels' instructions' peak rates (the bound: the larger of the two); the last line names each model's decode path and
# the GEMV's instruction set. Then the Q8 models again with the kernels
# forced to their AVX2 paths (TERRAFORMER_ISA=avx2 TERRAFORMER_GEMV_ISA=avx2:
# maddubs + madd instead of vpdpbusd), what an AVX2-only host runs.
#
# Cost: about 0.25 core-hours on the 2-core CPU (8 minutes) and ~16 GiB of
# memory; needs a quiet machine.
# Short version (1 decoder block, no encoder blocks, 2 tokens, 1 repeat; no
# results file): SHORT=1 bash experiments/decode_17b_q8.sh
# Writes OUT/bench{,_avx2}.{txt,json}, OUT/models{,_avx2}.json and
# results/decode_17b_q8.json (tables models, models_avx2). Rerunning reuses
# OUT/bench*.txt (delete them to re-time).
#   bash experiments/decode_17b_q8.sh [OUT]  (OUT: runs/experiments/decode_17b_q8)
NAME=decode_17b_q8
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

depth=()
if [[ -n "$SHORT" ]]; then
  for model in ScalingTransformer Terraformer; do
    depth+=(--config=$model.n_decoder_layers=1 --config=$model.n_encoder_layers=0)
  done
fi
banner "17B, int8 weights vs Q8 GEMV, full depth, one model at a time"
timed bench 4 .venv/bin/terraformer-bench \
  --config_file=gin/bench/17b_dense_kernels_int8.gin \
  --config_file=gin/bench/17b_dense_kernels_q8.gin \
  --config_file=gin/bench/17b_sparse_ff_qkv_loss_kernels_q8.gin \
  --config_file=gin/bench/terraformer_17b_kernels_int8.gin \
  --config_file=gin/bench/terraformer_17b_kernels_q8.gin \
  ${depth[@]+"${depth[@]}"}
tabulate speed models "$out/bench.json" \
  --columns='model,ms/token [min-max],ms/block,MB/token,GB/s,compute ms,bound ms,x bound,speedup,vs dense,vs dense bound' \
  --label=17b_dense_kernels_int8='dense, int8' \
  --label=17b_dense_kernels_q8='dense, Q8' \
  --label=17b_sparse_ff_qkv_loss_kernels_q8='sparse FF+QKV+loss, Q8' \
  --label=terraformer_17b_kernels_int8='Terraformer 17B, int8' \
  --label=terraformer_17b_kernels_q8='Terraformer 17B, Q8' \
  --figure=dense_q8_x_bound='dense, Q8:x bound' \
  --figure=terraformer_q8_ms='Terraformer 17B, Q8:ms/token [min-max]' \
  --figure=terraformer_q8_x_bound='Terraformer 17B, Q8:x bound' \
  --figure=terraformer_q8_vs_dense='Terraformer 17B, Q8:vs dense' \
  --figure=terraformer_q8_vs_dense_bound='Terraformer 17B, Q8:vs dense bound'
banner "17B, Q8 GEMV, the kernels' AVX2 paths, full depth, one model at a time"
TERRAFORMER_ISA=avx2 TERRAFORMER_GEMV_ISA=avx2 timed bench_avx2 4 \
  .venv/bin/terraformer-bench \
  --config_file=gin/bench/17b_dense_kernels_q8.gin \
  --config_file=gin/bench/17b_sparse_ff_qkv_loss_kernels_q8.gin \
  --config_file=gin/bench/terraformer_17b_kernels_q8.gin \
  ${depth[@]+"${depth[@]}"}
tabulate speed models_avx2 "$out/bench_avx2.json" \
  --columns='model,ms/token [min-max],ms/block,MB/token,GB/s,compute ms,bound ms,x bound,vs dense,vs dense bound' \
  --label=17b_dense_kernels_q8='dense, Q8 (AVX2)' \
  --label=17b_sparse_ff_qkv_loss_kernels_q8='sparse FF+QKV+loss, Q8 (AVX2)' \
  --label=terraformer_17b_kernels_q8='Terraformer 17B, Q8 (AVX2)' \
  --figure=terraformer_avx2_ms='Terraformer 17B, Q8 (AVX2):ms/token [min-max]' \
  --figure=terraformer_avx2_x_bound='Terraformer 17B, Q8 (AVX2):x bound'
record --caption=models_avx2="The Q8 models of the table above with the kernels forced to their AVX2 paths (maddubs + madd for the Q8 GEMV, 8-wide float dot products), what an AVX2-only host runs, on this AVX-512 CPU: same run, same conditions; vs dense: against the dense Q8 model on the same paths." --caption=models="The 17B models at full depth (6 + 6 blocks) with the fused kernels: int8 weights with float activations beside the Q8 GEMV (int8 weights packed for the one-row product, int8 activations); batch 1, 4 tokens after a 16-token prompt, median of 3 repeats, quiet CPU; bound = the larger of the bytes read per token / the GEMV bandwidth measured after each round of that model's repeats (GB/s: their median) and compute ms, the step's int8 and float multiply-adds at the peak rates of the kernels' int8 instruction and float32 FMA on 2 cores probed likewise; speedup against the dense int8 model of the same run; vs dense and vs dense bound: against the dense model of the same storage, measured and at its bound on this model's bandwidth (its bytes read at this model's GB/s). Sparse rows store their sparse FF in int8 rows either way."
banner done "outputs in $out"
