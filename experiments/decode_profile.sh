#!/usr/bin/env bash
# Where a decoding step's time goes (docs/decoding-speed.md): a jax.profiler
# trace of 6 decoding steps of the 17B sparse FF+QKV+loss and dense models in
# int8 with the fused kernels, 2 decoder blocks and no encoder blocks
# (`terraformer-bench --profile_dir`), then of the 17B Terraformer (2 decoder
# blocks, 1 encoder block) and the dense model (2 blocks) with the Q8 GEMV,
# summarised from the trace: operations and their self time per step by kind
# (ffi_call = the fused kernels), and the slowest operations with their
# compiled HLO line. It writes no JSON: results/decode_profile.json (tables
# step and q8) is transcribed from its output.
#
# Cost: about 0.25 core-hours on the 2-core CPU and ~7 GiB of memory; needs a
# quiet machine.
# Short version (1 block, 2 steps; prints only): SHORT=1 bash experiments/decode_profile.sh
# Writes OUT/profile.txt, OUT/profile_q8.txt and the traces under OUT/trace/
# (TensorBoard's profile plugin or XProf open them). Rerunning reuses them.
#   bash experiments/decode_profile.sh [OUT]  (OUT: runs/experiments/decode_profile)
NAME=decode_profile
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

blocks=2 tokens=6
[[ -n "$SHORT" ]] && blocks=1 tokens=2
banner "17B int8 + kernels, $blocks decoder blocks: profile of $tokens steps"
into "$out/profile.txt" .venv/bin/terraformer-bench --profile_dir="$out/trace" \
  --config_file=gin/bench/17b_sparse_ff_qkv_loss_kernels_int8.gin \
  --config_file=gin/bench/17b_dense_kernels_int8.gin \
  --config=ScalingTransformer.n_decoder_layers=$blocks \
  --config=ScalingTransformer.n_encoder_layers=0 --tokens=$tokens
banner "17B Q8 + kernels, $blocks decoder blocks: profile of $tokens steps"
into "$out/profile_q8.txt" .venv/bin/terraformer-bench --profile_dir="$out/trace" \
  --config_file=gin/bench/terraformer_17b_kernels_q8.gin \
  --config_file=gin/bench/17b_dense_kernels_q8.gin \
  --config=Terraformer.n_decoder_layers=$blocks \
  --config=Terraformer.n_encoder_layers=1 \
  --config=ScalingTransformer.n_decoder_layers=$blocks \
  --config=ScalingTransformer.n_encoder_layers=0 --tokens=$tokens
banner done "outputs in $out"
