#!/usr/bin/env bash
# Encoder-decoder attention while decoding (docs/decoding-speed.md): the 800M
# sparse FF+QKV+loss model with the fused kernels and int8 weights
# (gin/bench/800m_sparse_ff_qkv_loss_kernels_int8.gin, one encoder block: a
# decoding step reads only the encoder's cached keys and values), batch 1,
# 8 tokens after a prompt of 16, 256 and 1024 input tokens, 3 repeats; each
# length with `CrossAttention` (the encoder's keys and values split into
# heads once per input, the default) and with Trax's `tl.PureAttention`
# (`cross_attention_split_once.enabled=False`: split again at every step).
# Each row is its own terraformer-bench run, beside its bytes-read bound.
#
# Cost: about 0.05 core-hours on the 2-core CPU (2.5 minutes); needs a quiet machine.
# Short version (2 tokens, 1 repeat; no results file):
#   SHORT=1 bash experiments/decode_cross_attention.sh
# Writes OUT/bench_<len>_{split_once,trax}.{txt,json},
# OUT/cross_attention.json and results/decode_cross_attention.json (table
# cross_attention; figures speedup_16, speedup_256, speedup_1024: Trax's
# ms/token over CrossAttention's). Rerunning reuses OUT/bench_*.txt (delete
# them to re-time).
#   bash experiments/decode_cross_attention.sh [OUT]
#   (OUT: runs/experiments/decode_cross_attention)
NAME=decode_cross_attention
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

LENGTHS=(16 256 1024)
rows=()
for len in "${LENGTHS[@]}"; do
  for variant in trax split_once; do
    enabled=True
    [[ $variant == split_once ]] || enabled=False
    banner "$len input tokens, cross_attention_split_once.enabled=$enabled"
    timed "bench_${len}_$variant" 8 .venv/bin/terraformer-bench \
      --config_file=gin/bench/800m_sparse_ff_qkv_loss_kernels_int8.gin \
      --config=ScalingTransformer.n_encoder_layers=1 \
      --config=cross_attention_split_once.enabled=$enabled \
      --prompt_len="$len"
  done
  rows+=("$len tokens, tl.PureAttention=$out/bench_${len}_trax.json"
         "$len tokens, CrossAttention=$out/bench_${len}_split_once.json")
done
tabulate speeds cross_attention "${rows[@]}" \
  --columns='model,ms/token [min-max],MB/token,bound ms,x bound'
# Trax's ms/token over CrossAttention's, at each input length.
figures=()
for len in "${LENGTHS[@]}"; do
  figures+=(--figure="speedup_$len=$(.venv/bin/python - "$out" "$len" <<'PY'
import json, sys
out, n = sys.argv[1:]
ms = lambda v: json.load(open(f'{out}/bench_{n}_{v}.json'))['models'][0]['ms_per_token']
print(f"{ms('trax') / ms('split_once'):.2f}x")
PY
)")
done
record "${figures[@]}" --caption="cross_attention=The 800M sparse FF+QKV+loss \
model with the fused kernels and int8 weights, one encoder block; batch 1, 8 \
tokens after a prompt of the input length, median of 3 repeats, each row its \
own terraformer-bench run; bound = bytes read per token (the encoder's keys \
and values included) / the GEMV bandwidth measured in the same run."
banner done "outputs in $out"
