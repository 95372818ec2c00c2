#!/usr/bin/env bash
# Our decoding step next to Trax 1.4.1's (docs/decoding-speed.md): the 800M
# encoder-decoders of gin/scaling_800m/ (dense, sparse FF, sparse QKV, sparse
# FF + QKV, sparse FF + QKV + loss) and, timed beside each in the same run,
# Trax's `ConfigurableTransformer` with the same settings
# (`terraformer-bench --compare_trax`); random weights, batch 1, 16 tokens
# after a 16-token prompt, 3 repeats.
#
# Cost: about 0.1 core-hours on the 2-core CPU (5 minutes); needs a quiet machine.
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_800m_vs_trax.sh
# Writes OUT/bench.{txt,json}, OUT/vs_trax.json and
# results/decode_800m_vs_trax.json (table vs_trax). Rerunning reuses
# OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_800m_vs_trax.sh [OUT]
#   (OUT: runs/experiments/decode_800m_vs_trax)
NAME=decode_800m_vs_trax
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

banner "800M family, ours and Trax's ConfigurableTransformer"
timed bench 16 .venv/bin/terraformer-bench \
  --config_file=gin/scaling_800m/dense.gin \
  --config_file=gin/scaling_800m/sparse_ff.gin \
  --config_file=gin/scaling_800m/sparse_qkv.gin \
  --config_file=gin/scaling_800m/sparse_ff_qkv.gin \
  --config_file=gin/scaling_800m/sparse_ff_qkv_loss.gin \
  --compare_trax
tabulate speed vs_trax "$out/bench.json" \
  --columns='model,ms/token,Trax ms/token,ours vs Trax' \
  --label=sparse_ff='sparse FF (N=64)' --label=sparse_qkv='sparse QKV (S=16)' \
  --label=sparse_ff_qkv='sparse FF+QKV' \
  --label=sparse_ff_qkv_loss='sparse FF+QKV+loss (S=4)' \
  --figure=ff_qkv_loss_vs_trax='sparse FF+QKV+loss (S=4):ours vs Trax'
record --caption="vs_trax=Our decoding step next to Trax 1.4.1's \
ConfigurableTransformer with the same settings, timed in the same run (800M, \
XLA path, batch 1, 16 tokens after a 16-token prompt, 3 repeats, quiet CPU). \
The 800M speedups over dense are those of decode_800m."

banner done "outputs in $out"
