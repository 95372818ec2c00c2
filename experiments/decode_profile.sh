#!/usr/bin/env bash
# Where a decoding step's time goes (docs/decoding-speed.md): a jax.profiler
# trace of 6 decoding steps (`terraformer-bench --profile_dir --json`) of
#   step:    the 17B sparse FF+QKV+loss and dense models in int8 with the
#            fused kernels, 2 decoder blocks and no encoder blocks;
#   q8:      the 17B Terraformer (2 decoder blocks, 1 encoder block) and the
#            dense model (2 blocks) with the Q8 GEMV;
#   q8_full: the 17B Terraformer with the Q8 GEMV at full depth (the model of
#            the 17B table);
#   q8_parts: the same with terraformer_block_kernel.enabled = False, each
#            decoder block as its parts' calls (where a block's time goes);
#   q8_scaling: the 17B sparse FF+QKV+loss model with the Q8 GEMV at full
#            depth (each decoder block one tf_scaling_block call);
# each summarised from its trace: wall time per step, then the operations
# that took the most time (kernel calls summed by their HLO line: target,
# operand and output shapes, i.e. one kind of layer; other operations by
# kind), self time summed over threads.
#
# Cost: about 0.08 core-hours on the 2-core CPU (4 minutes) and ~16 GiB of memory (the
# full-depth models); needs a quiet machine.
# Short version (1 block, 2 steps, no full-depth run; prints only):
#   SHORT=1 bash experiments/decode_profile.sh
# Writes OUT/profile*.txt and .json and the traces under OUT/trace*/
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
  --config=ScalingTransformer.n_encoder_layers=0 --tokens=$tokens \
  --profile_operations=6 --json="$out/profile.json"
banner "17B Q8 + kernels, $blocks decoder blocks: profile of $tokens steps"
into "$out/profile_q8.txt" .venv/bin/terraformer-bench --profile_dir="$out/trace" \
  --config_file=gin/bench/terraformer_17b_kernels_q8.gin \
  --config_file=gin/bench/17b_dense_kernels_q8.gin \
  --config=Terraformer.n_decoder_layers=$blocks \
  --config=Terraformer.n_encoder_layers=1 \
  --config=ScalingTransformer.n_decoder_layers=$blocks \
  --config=ScalingTransformer.n_encoder_layers=0 --tokens=$tokens \
  --profile_operations=8 --json="$out/profile_q8.json"
labels=(--label=17b_sparse_ff_qkv_loss_kernels_int8='sparse FF+QKV+loss, int8'
        --label=17b_dense_kernels_int8='dense, int8'
        --label=terraformer_17b_kernels_q8='Terraformer 17B, Q8'
        --label=17b_dense_kernels_q8='dense, Q8'
        --label=17b_sparse_ff_qkv_loss_kernels_q8='sparse FF+QKV+loss, Q8')
tabulate profile step "$out/profile.json" "${labels[@]}" \
  --figure=sparse_int8_wall='sparse FF+QKV+loss, int8:ms' \
  --figure=dense_int8_wall='dense, int8:ms'
tabulate profile q8 "$out/profile_q8.json" "${labels[@]}" \
  --figure=terraformer_q8_wall='Terraformer 17B, Q8:ms' \
  --figure=dense_q8_wall='dense, Q8:ms'
# full_depth TABLE CONFIG FIGURE [ARGS...]: the profile of $tokens steps of
# gin/bench/CONFIG.gin at full depth (terraformer-bench ARGS too) ->
# OUT/profile_TABLE.{txt,json}, traces under OUT/trace_TABLE, table TABLE.
full_depth() {
  local table=$1 config=$2 figure=$3
  shift 3
  into "$out/profile_$table.txt" .venv/bin/terraformer-bench \
    --profile_dir="$out/trace_$table" --config_file="gin/bench/$config.gin" \
    --tokens=$tokens --profile_operations=8 --json="$out/profile_$table.json" \
    "$@"
  tabulate profile "$table" "$out/profile_$table.json" "${labels[@]}" \
    --figure="$figure"
}
if [[ -z "$SHORT" ]]; then
  banner "17B Terraformer Q8 + kernels, full depth: profile of $tokens steps"
  full_depth q8_full terraformer_17b_kernels_q8 \
    terraformer_q8_full_wall='Terraformer 17B, Q8:ms'
  banner "the same, each decoder block as its parts' calls"
  full_depth q8_parts terraformer_17b_kernels_q8 \
    terraformer_q8_parts_wall='Terraformer 17B, Q8:ms' \
    --config=terraformer_block_kernel.enabled=False
  banner "17B sparse FF+QKV+loss Q8 + kernels, full depth: profile of $tokens steps"
  full_depth q8_scaling 17b_sparse_ff_qkv_loss_kernels_q8 \
    sparse_q8_full_wall='sparse FF+QKV+loss, Q8:ms'
fi
record \
  --caption=step="17B, $blocks decoder blocks, no encoder blocks, int8 weights and the fused kernels, $tokens steps traced by jax.profiler; per step: wall time (in parentheses the part with an operation running) and the operations that took the most time, kernel calls summed by their HLO line (target (operand shapes) -> output shape), others by kind; self time summed over threads; calls = operations per step; quiet machine." \
  --caption=q8="17B with the Q8 GEMV (int8 weights and activations) and the fused kernels: the Terraformer with $blocks decoder blocks and 1 encoder block (cached: the step runs the decoder), the dense model with $blocks decoder blocks; $tokens steps traced by jax.profiler; columns as above." \
  --caption=q8_full="The 17B Terraformer with the Q8 GEMV at full depth (6 decoder blocks; the model of the 17B table), $tokens steps traced by jax.profiler; columns as above." \
  --caption=q8_parts="The same model with terraformer_block_kernel.enabled = False: each decoder block as its parts' calls (two sparse QKV attentions, the sparse FF block and the SRU's two dense layers) and XLA's sums, swaps and SRU cell; $tokens steps traced by jax.profiler, the same process kind as above, a separate run." \
  --caption=q8_scaling="The 17B sparse FF+QKV+loss model with the Q8 GEMV at full depth (6 + 6 blocks, the encoder's outputs cached; the model of the 17B table), each decoder block one tf_scaling_block call (attention, cross-attention, sparse FF); $tokens steps traced by jax.profiler; columns as above."
banner done "outputs in $out"
