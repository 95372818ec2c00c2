#!/usr/bin/env bash
# What the long-range recall encoder-decoders cost (docs/long-input-quality.md):
# compiled gradient-step memory (XLA's buffer assignment of the whole step:
# weights, batch, gradients, temporaries; exact for the compiled program,
# nothing is run) of the six encoders of gin/long_input/ (full, blockwise 64,
# Transpooler, Pyramidion, CST L 16 α 1, LSH chunks of 64 with 2 hashes) at
# batch 8, 4 target tokens, and 256, 1024 and 4096 input tokens.
#
# Cost: about 0.3 core-hours on the 2-core CPU (compiling only).
# Short version (256 and 1024 tokens, no results file):
#   SHORT=1 bash experiments/long_input_memory.sh
# Writes OUT/memory_bench.json (terraformer-memory-bench --json),
# OUT/memory.json and results/long_input_memory.json (table memory).
#   bash experiments/long_input_memory.sh [OUT]  (OUT: runs/experiments/long_input_memory)
NAME=long_input_memory
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

lens=256,1024,4096
[[ -n "$SHORT" ]] && lens=256,1024
G=gin/long_input
banner "compiled gradient-step memory at $lens input tokens"
into "$out/memory_bench.json" .venv/bin/terraformer-memory-bench --input_lens="$lens" \
  --config_file=$G/full.gin --config_file=$G/blockwise.gin \
  --config_file=$G/transpooler.gin --config_file=$G/pyramidion.gin \
  --config_file=$G/cst.gin --config_file=$G/lsh.gin \
  --config='ScalingTransformer.max_len=4096' --batch_size=8 --target_len=4 \
  --time_budget_gb=0 --json > /dev/null
tabulate lengths memory "$out/memory_bench.json" \
  --label='blockwise=blockwise 64' --label='transpooler=Transpooler' \
  --label='pyramidion=Pyramidion' --label='cst=CST (L 16, α 1)' \
  --label='lsh=LSH (chunks of 64, 2 hashes)'
record
banner done "outputs in $out"
