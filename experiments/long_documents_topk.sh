#!/usr/bin/env bash
# The successive-halving top-k operator vs n (docs/long-documents.md;
# Pietruszka et al. App. B.5, Figs. 5/6): time (median of 3 jitted calls,
# batch 16, d 64) and nCCS to the exact top-k at k = 128 of the sorted
# operator, the unsorted one, the plain pairwise softmax, Goyal et al.'s
# iterative baseline and the hard top-k, for n = 256 to 16384.
#
# Cost: about 0.1 core-hours on the 2-core CPU (times move with the load).
# Short version (n = 256 and 1024, 1 repeat; no results file):
#   SHORT=1 bash experiments/long_documents_topk.sh
# Writes OUT/topk.json (terraformer-topk-bench --json), OUT/topk_operator.png,
# OUT/topk_table.json and results/long_documents_topk.json (table topk).
#   bash experiments/long_documents_topk.sh [OUT]
#   (OUT: runs/experiments/long_documents_topk)
NAME=long_documents_topk
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sizes=(--ns=256,1024,4096,16384 --repeats=3)
[[ -n "$SHORT" ]] && sizes=(--ns=256,1024 --repeats=1)
banner "top-k operators at k = 128"
if [[ ! -s "$out/topk.json" ]]; then
  .venv/bin/terraformer-topk-bench --ks=128 "${sizes[@]}" \
    --methods=sh,sh_unsorted,sh_plain,goyal,hard \
    --plot="$out/topk_operator.png" --json="$out/topk.json.tmp"
  mv "$out/topk.json.tmp" "$out/topk.json"
fi
.venv/bin/python scripts/experiment_tables.py topk --k=128 \
  --out="$out/topk_table.json" "$out/topk.json"
record --table topk="$out/topk_table.json"
banner done "outputs in $out"
