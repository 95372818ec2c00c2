#!/usr/bin/env bash
# Reversible layers (§4.2; docs/models.md): compiled gradient-step memory
# (XLA's buffer assignment: weights, batch, gradients, temporaries; nothing is
# run) of the tiny Terraformer (gin/tiny/terraformer.gin) with 1, 2, 4 and 8
# encoder and decoder layers, reversible and not, at 2048 input and 256
# target tokens, batch 1.
#
# Cost: about 0.2 core-hours on the 2-core CPU (compiling only).
# Short version (1 and 2 layers, 256 input tokens; no results file):
#   SHORT=1 bash experiments/models_reversible_memory.sh
# Writes OUT/memory_bench.json (terraformer-memory-bench --json),
# OUT/depth.json and results/models_reversible_memory.json (table depth).
#   bash experiments/models_reversible_memory.sh [OUT]
#   (OUT: runs/experiments/models_reversible_memory)
NAME=models_reversible_memory
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sizes=(--layers=1,2,4,8 --input_len=2048)
[[ -n "$SHORT" ]] && sizes=(--layers=1,2 --input_len=256)
banner "memory vs depth, reversible and not"
into "$out/memory_bench.json" .venv/bin/terraformer-memory-bench \
  --config_file=gin/tiny/terraformer.gin "${sizes[@]}" --target_len=256 --json
tabulate depth depth "$out/memory_bench.json"
record --caption=depth="Compiled gradient-step memory (MiB; XLA's buffer assignment) of the tiny Terraformer (gin/tiny/terraformer.gin) with n encoder + n decoder layers, batch 1, 2048 input and 256 target tokens, reversible and not, with the temporaries in parentheses columns; ratio: not reversible over reversible."
banner done "outputs in $out"
