#!/usr/bin/env bash
# Every decoding table: the decode_* experiments behind docs/decoding-speed.md,
# docs/decoding.md and the README's decode rows, one after another into
# OUT/NAME (each its own results/NAME.json), then the pages rendered from
# them (tools/results.py). The timed ones run first and need a quiet
# machine; the untimed ones (XLA operations, agreement) follow, two at a time
# on separate cores. About 1.3 hours on the 2-core CPU and ~16 GiB of memory.
# A rerun into the same OUT reuses what each experiment finished (delete
# OUT/NAME to rerun one).
#   bash experiments/decode_all.sh [OUT]   (OUT: runs/experiments/decode_all)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out=${1:-runs/experiments/decode_all}
mkdir -p "$out"
timed=(decode_17b_q8 decode_17b_int8 decode_800m_q8 decode_800m_kernels
       decode_800m decode_800m_vs_trax decode_800m_sparsity
       decode_d_model_sweep decode_17b_projection decode_output_layer
       decode_kernel_layers decode_cross_attention decode_profile
       decode_user_path)
for name in "${timed[@]}"; do
  echo "== $(date +%T) $name -> $out/$name"
  bash "experiments/$name.sh" "$out/$name"
done
echo "== $(date +%T) decode_xla_ops, decode_agreement (untimed, one core each)"
taskset -c 0 bash experiments/decode_xla_ops.sh "$out/decode_xla_ops" &
xla_ops=$!
taskset -c 1 bash experiments/decode_agreement.sh "$out/decode_agreement"
wait "$xla_ops"
echo "== $(date +%T) decode_agreement_trained"
bash experiments/decode_agreement_trained.sh "$out/decode_agreement_trained"
.venv/bin/python tools/results.py
echo "== $(date +%T) done: results/decode_*.json, the pages rendered"
