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
# Writes OUT/bench.{txt,json} (terraformer-topk-bench, --json),
# OUT/topk_operator.png, OUT/topk.json and results/long_documents_topk.json
# (table topk). Rerunning reuses OUT/bench.txt (delete it to re-time).
#   bash experiments/long_documents_topk.sh [OUT]
#   (OUT: runs/experiments/long_documents_topk)
NAME=long_documents_topk
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

sizes=(--ns=256,1024,4096,16384 --repeats=3)
[[ -n "$SHORT" ]] && sizes=(--ns=256,1024 --repeats=1)
banner "top-k operators at k = 128"
into "$out/bench.txt" .venv/bin/terraformer-topk-bench --ks=128 "${sizes[@]}" \
  --methods=sh,sh_unsorted,sh_plain,goyal,hard \
  --plot="$out/topk_operator.png" --json="$out/bench.json"
tabulate topk topk "$out/bench.json" --k=128
record
banner done "outputs in $out"
