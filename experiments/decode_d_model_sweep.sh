#!/usr/bin/env bash
# Speedup vs d_model (the paper's 800M -> 17B trend; docs/decoding-speed.md):
# a dense encoder-decoder (gin/bench/sweep_dense.gin: 1 encoder + 4 decoder
# blocks, d_ff = 4 d_model) and its sparse twin (gin/bench/sweep_sparse.gin:
# sparse FF N = 64 + sparse QKV with modules of 64, d_ff = 6 d_model) at
# d_model 512, 1024, 2048, 4096; random weights, batch 1, 16 tokens after a
# 16-token prompt, 3 repeats; plots the speedup.
#
# Cost: about 0.04 core-hours on the 2-core CPU (1.5 minutes); needs a quiet machine.
# Short version (d_model 256 and 512, 2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_d_model_sweep.sh
# Writes OUT/bench.{txt,json}, OUT/decode_speedup_vs_d_model.png (the plot
# docs/decode_speedup_vs_d_model.png shows; copy it there), OUT/sweep.json and
# results/decode_d_model_sweep.json (table sweep). Rerunning reuses
# OUT/bench.txt (delete it to re-time).
#   bash experiments/decode_d_model_sweep.sh [OUT]
#   (OUT: runs/experiments/decode_d_model_sweep)
NAME=decode_d_model_sweep
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sweep=(--sweep_d_models=512,1024,2048,4096 --tokens=16 --repeats=3)
[[ -n "$SHORT" ]] && sweep=(--sweep_d_models=256,512 --tokens=2 --repeats=1)
banner "dense vs sparse FF+QKV over d_model"
into "$out/bench.txt" .venv/bin/terraformer-bench --sweep \
  --config_file=gin/bench/sweep_dense.gin \
  --config_file=gin/bench/sweep_sparse.gin "${sweep[@]}" \
  --plot="$out/decode_speedup_vs_d_model.png" --json="$out/bench.json"
tabulate sweep sweep "$out/bench.json" \
  --label=sweep_dense=dense --label=sweep_sparse=sparse \
  --figure=speedup_4096='4096:speedup'
record --caption="sweep=Dense (d_ff = 4 d_model) vs sparse FF N=64 + sparse \
QKV (modules of 64, d_ff = 6 d_model), 1 encoder + 4 decoder blocks, XLA \
path, batch 1, 16 tokens, 3 repeats, quiet CPU; speedup: over the dense \
model measured, vs dense bound: over the dense model at its bytes bound on \
the sparse model's bandwidth (its bytes / the GEMV bandwidth measured for the \
sparse model)."

banner done "outputs in $out"
