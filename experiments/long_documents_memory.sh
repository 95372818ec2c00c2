#!/usr/bin/env bash
# Training step vs input length (docs/long-documents.md; Pyramidion Fig. 4,
# CST Fig. 2): compiled gradient-step memory (XLA's buffer assignment:
# weights, batch, gradients, temporaries) of one small Terraformer (d_model
# 256, 2 + 2 reversible layers, batch 1, 256 target tokens; gin/bench/long_*.gin)
# with full, Pyramidion (blockwise + pooled to 1024, then 256), LSH, blockwise
# and CST attention at 1024, 4096 and 16384 input tokens, and the median
# step time (2 steps) of the full and the Pyramidion model where the step
# needs at most 1 GiB.
#
# Cost: about 2 core-hours on the 2-core CPU (CST's compile at 16k tokens is
# the longest).
# Short version (1024 tokens only, no results file):
#   SHORT=1 bash experiments/long_documents_memory.sh
# Writes OUT/timed.json, OUT/memory_only.json (terraformer-memory-bench --json),
# their plots (*.png), OUT/memory.json and
# results/long_documents_memory.json (table memory).
#   bash experiments/long_documents_memory.sh [OUT]
#   (OUT: runs/experiments/long_documents_memory)
NAME=long_documents_memory
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

lens=1024,4096,16384
[[ -n "$SHORT" ]] && lens=1024
B=gin/bench
banner "full and Pyramidion: memory, and step time where it needs <= 1 GiB"
into "$out/timed.json" .venv/bin/terraformer-memory-bench --input_lens="$lens" \
  --repeats=2 --time_budget_gb=1 --config_file=$B/long_full.gin \
  --config_file=$B/long_pyramidion.gin --plot="$out/timed.png" --json >/dev/null
banner "LSH, blockwise, CST: memory only"
into "$out/memory_only.json" .venv/bin/terraformer-memory-bench \
  --input_lens="$lens" --time_budget_gb=0 --config_file=$B/long_lsh.gin \
  --config_file=$B/long_blockwise.gin --config_file=$B/long_cst.gin \
  --plot="$out/memory_only.png" --json >/dev/null
tabulate lengths memory "$out/timed.json" "$out/memory_only.json" \
  --columns='input tokens,full,Pyramidion,LSH,blockwise,CST,full ms,Pyramidion ms' \
  --label=long_full=full --label=long_pyramidion=Pyramidion \
  --label=long_lsh=LSH --label=long_blockwise=blockwise --label=long_cst=CST
record
banner done "outputs in $out"
