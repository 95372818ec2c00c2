#!/usr/bin/env bash
# What bf16 / int8 weights and the fused kernels do to the logits
# (docs/decoding-speed.md): the 800M sparse FF+QKV+loss encoder-decoder on
# XLA in float32 (the reference) and with the kernels and float32, bfloat16
# and int8 weights (gin/bench/800m_sparse_ff_qkv_loss_kernels*.gin), the same
# random weights, each fed the reference's 16 greedy tokens: max |delta
# logit| and the fraction of positions with the reference's argmax
# (`terraformer-bench --agreement`). Random weights give small logits
# (max |logit| ~0.1), so greedy agreement here says little about a trained
# model.
#
# Cost: about 0.2 core-hours on the 2-core CPU; any machine (nothing timed).
# Short version (2 tokens; no results file):
#   SHORT=1 bash experiments/decode_agreement.sh
# Writes OUT/agreement.{txt,json}, OUT/paths.json and
# results/decode_agreement.json (table paths). Rerunning reuses
# OUT/agreement.txt (delete it to rerun).
#   bash experiments/decode_agreement.sh [OUT]
#   (OUT: runs/experiments/decode_agreement)
NAME=decode_agreement
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tokens=16
[[ -n "$SHORT" ]] && tokens=2
banner "800M sparse FF+QKV+loss: kernels and bf16/int8 weights vs XLA float32"
into "$out/agreement.txt" .venv/bin/terraformer-bench --agreement \
  --config_file=gin/scaling_800m/sparse_ff_qkv_loss.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_bf16.gin \
  --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_int8.gin \
  --tokens="$tokens" --json="$out/agreement.json"
tabulate agreement paths "$out/agreement.json" \
  --columns="model,max |delta logit| vs the first,greedy agreement ($tokens tokens)" \
  --rename='model=decode path' \
  --label=sparse_ff_qkv_loss='XLA, float32 (reference)' \
  --label=800m_sparse_ff_qkv_loss_kernels='kernels, float32' \
  --label=800m_sparse_ff_qkv_loss_kernels_bf16='kernels, bf16 weights' \
  --label=800m_sparse_ff_qkv_loss_kernels_int8='kernels, int8 weights' \
  --figure=int8_max_delta='kernels, int8 weights:max |delta logit| vs the first'
record
banner done "outputs in $out"
