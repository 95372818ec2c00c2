#!/usr/bin/env bash
# Decoding speed vs input length (docs/long-documents.md): batch 1, random
# weights, 8 tokens after a prompt of the real input length, 3 repeats
# (terraformer-bench; the encoders have 1 block: a decoding step never runs
# the encoder). At 1024 input tokens, in one run: the dense 800M model
# (gin/scaling_800m/dense.gin), the 800M Terraformer (gin/terraformer/c4_800m.gin),
# the same pooled to 1024 after encoder block 0 and with CST in both stacks
# (gin/bench/terraformer_800m_1k_{pooled,cst}.gin); then the pooled model on
# 16384 input tokens (gin/bench/terraformer_800m_16k_pooled.gin), whose
# decoder cache stays 1024 + 256 positions.
#
# Cost: about 0.5 core-hours on the 2-core CPU; needs a quiet machine (the
# ratios move with load; 16k vs 1k compares two runs, so compare their GEMV
# bandwidths, printed by each).
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/long_documents_decoding.sh
# Writes OUT/bench_{1k,16k}.{txt,json}, OUT/decoding_{1k,16k}.json and
# results/long_documents_decoding.json (tables decoding_1k, decoding_16k;
# figures terraformer_1k_vs_dense, pooled_16k_vs_1k). Rerunning reuses
# OUT/bench_*.txt (delete them to re-time).
#   bash experiments/long_documents_decoding.sh [OUT]
#   (OUT: runs/experiments/long_documents_decoding)
NAME=long_documents_decoding
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

B=gin/bench/terraformer_800m
banner "1024 input tokens: dense 800M, Terraformer, pooled, CST"
timed bench_1k 8 .venv/bin/terraformer-bench \
  --config_file=gin/scaling_800m/dense.gin \
  --config_file=gin/terraformer/c4_800m.gin --config_file=${B}_1k_pooled.gin \
  --config_file=${B}_1k_cst.gin --config=Terraformer.n_encoder_layers=1 \
  --prompt_len=1024
banner "16384 input tokens: pooled"
timed bench_16k 8 .venv/bin/terraformer-bench \
  --config_file=${B}_16k_pooled.gin --config=Terraformer.n_encoder_layers=1 \
  --prompt_len=16384

labels=(--label='dense=dense 800M (24-block encoder)'
        --label='c4_800m=Terraformer 800M, unpooled'
        --label='terraformer_800m_1k_pooled=Terraformer 800M, pooled to 1024'
        --label='terraformer_800m_1k_cst=Terraformer 800M, CST (L 32, α 3)'
        --label='terraformer_800m_16k_pooled=Terraformer 800M, pooled to 1024, 16k input')
tabulate speed decoding_1k "$out/bench_1k.json" "${labels[@]}" \
  --columns='model,ms/token [min-max],MB/token,x bound,speedup' \
  --figure='terraformer_1k_vs_dense=Terraformer 800M, unpooled:speedup'
tabulate speed decoding_16k "$out/bench_16k.json" "${labels[@]}" \
  --columns='model,ms/token [min-max],MB/token,x bound'
# The pooled model's ms/token on 16k input over its ms/token on 1k input.
ratio=$(.venv/bin/python - "$out" <<'PY'
import json, sys
ms = lambda path, name: next(m['ms_per_token'] for m in json.load(open(path))['models'] if m['name'] == name)
out = sys.argv[1]
print(f"{ms(f'{out}/bench_16k.json', 'terraformer_800m_16k_pooled') / ms(f'{out}/bench_1k.json', 'terraformer_800m_1k_pooled'):.2f}x")
PY
)
record --figure=pooled_16k_vs_1k="$ratio"
banner done "outputs in $out"
