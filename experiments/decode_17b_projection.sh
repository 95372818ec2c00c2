#!/usr/bin/env bash
# The 17B models projected from one decoder block (Tables 1 and 6;
# docs/decoding-speed.md): d_model 9216, 96 heads, FF sparsity 256, attention
# sparsity 64, loss sparsity 4, vocab 32100 (gin/bench/17b_*.gin and the
# Terraformer of gin/bench/terraformer_17b.gin), float32, XLA path. Each model
# is timed with one decoder block and no encoder blocks, and without decoder
# blocks; ms/token and bytes are projected to 6 decoder blocks and printed
# beside the paper's seconds (PAPER_DECODE_SECONDS of each gin file).
#
# Cost: about 0.1 core-hours on the 2-core CPU and ~9 GB of memory; needs a
# quiet machine.
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_17b_projection.sh
# Writes OUT/bench.{txt,json}, OUT/projection.json and
# results/decode_17b_projection.json (table projection). Rerunning reuses
# OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_17b_projection.sh [OUT]
#   (OUT: runs/experiments/decode_17b_projection)
NAME=decode_17b_projection
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

banner "17B dense, sparse FF, QKV, FF+QKV, FF+QKV+loss, Terraformer: 1 block, projected to 6"
timed bench 4 .venv/bin/terraformer-bench \
  --config_file=gin/bench/17b_dense.gin \
  --config_file=gin/bench/17b_sparse_ff.gin \
  --config_file=gin/bench/17b_sparse_qkv.gin \
  --config_file=gin/bench/17b_sparse_ff_qkv.gin \
  --config_file=gin/bench/17b_sparse_ff_qkv_loss.gin \
  --config_file=gin/bench/terraformer_17b.gin \
  --project_layers=6 --memory_budget_gb=9
tabulate projection projection "$out/bench.json" \
  --columns='model,measured ms/token (1 block),ms/block,ms no blocks,projected ms/token,projected MB/token,x bound,speedup (time),speedup (bytes),paper s/token,paper speedup,vs dense,vs dense bound' \
  --label=17b_dense=dense --label=17b_sparse_ff='sparse FF (N=256)' \
  --label=17b_sparse_qkv='sparse QKV (S=64)' \
  --label=17b_sparse_ff_qkv='sparse FF+QKV' \
  --label=17b_sparse_ff_qkv_loss='sparse FF+QKV+loss (S=4)' \
  --label=terraformer_17b='Terraformer 17B' \
  --figure=ff='sparse FF (N=256):speedup (time)' \
  --figure=qkv='sparse QKV (S=64):speedup (time)' \
  --figure=ff_qkv='sparse FF+QKV:speedup (time)' \
  --figure=ff_qkv_bytes='sparse FF+QKV:speedup (bytes)' \
  --figure=ff_qkv_loss='sparse FF+QKV+loss (S=4):speedup (time)' \
  --figure=terraformer='Terraformer 17B:speedup (time)'
record --caption="projection=The 17B models (d_model 9216, float32, XLA path) timed with one decoder block and no encoder blocks and without decoder blocks, projected to 6 decoder blocks; batch 1, 4 tokens, 3 repeats, quiet CPU; bound = projected bytes per token / the GEMV bandwidth measured in the run; vs dense and vs dense bound: the projected speedup over the dense model, measured and at its bound on this model's bandwidth. Paper: Table 6's seconds (sparse QKV: Table 1's), the speedup computed from them (Table 6 prints 19.98x for FF+QKV)."
banner done "outputs in $out"
