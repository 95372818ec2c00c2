#!/usr/bin/env bash
# FF sparsity N and loss sparsity S at 800M (Tables 2 and 7;
# docs/decoding-speed.md): the 800M dense encoder-decoder
# (gin/scaling_800m/dense.gin) and the same model with sparse FF of N = 16,
# 32, 64, 128 (gin/bench/ff_sparsity_N.gin) or a sparse loss layer of S = 2,
# 4, 8 modules (gin/bench/loss_sparsity_S.gin), timed in one run; random
# weights, batch 1, 16 tokens after a 16-token prompt, 3 repeats.
#
# Cost: about 0.1 core-hours on the 2-core CPU (4.5 minutes); needs a quiet machine.
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_800m_sparsity.sh
# Writes OUT/bench.{txt,json}, OUT/sparsity.json and
# results/decode_800m_sparsity.json (table sparsity). Rerunning reuses
# OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_800m_sparsity.sh [OUT]
#   (OUT: runs/experiments/decode_800m_sparsity)
NAME=decode_800m_sparsity
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

configs=(--config_file=gin/scaling_800m/dense.gin)
labels=()
for n in 16 32 64 128; do
  configs+=(--config_file=gin/bench/ff_sparsity_$n.gin)
  labels+=(--label=ff_sparsity_$n="FF N=$n")
done
for s in 2 4 8; do
  configs+=(--config_file=gin/bench/loss_sparsity_$s.gin)
  labels+=(--label=loss_sparsity_$s="loss S=$s")
done
banner "800M dense, sparse FF N = 16...128, sparse loss S = 2, 4, 8"
timed bench 16 .venv/bin/terraformer-bench "${configs[@]}"
# The paper's decoding seconds per token: Table 7 (loss sparsity); Table 2
# gives its FF sparsity rows as a trend.
tabulate speed sparsity "$out/bench.json" "${labels[@]}" \
  --columns='model,ms/token,MB/token,x bound,speedup,per block,vs dense bound' \
  --paper=dense='0.160 s' --paper=loss_sparsity_2='0.158 s (1.01x)' \
  --paper=loss_sparsity_4='0.149 s (1.07x)' \
  --paper=loss_sparsity_8='0.148 s (1.08x)' \
  --figure=ff_n64='FF N=64:speedup' --figure=loss_s4='loss S=4:speedup'
record --caption="sparsity=Tables 2 and 7: the 800M dense encoder-decoder \
with sparse FF of N units per block or a sparse loss of S modules, XLA path, \
batch 1, 16 tokens after a 16-token prompt, 3 repeats, all in one run; bound = \
bytes read per token / the GEMV bandwidth measured after each round of that \
model's repeats. Paper: decoding seconds per token (Table 7; Table 2 gives a \
steady decrease with N)."

banner done "outputs in $out"
