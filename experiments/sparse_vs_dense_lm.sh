#!/usr/bin/env bash
# Sparse vs dense past the plateau (Fig. 1; docs/sparse-vs-dense.md): the
# tiny decoder-only LMs of gin/tiny/ (d 128, 2 layers, 4 heads, vocab 2048,
# batch 16 x 128 tokens of the aclsum papers, lr 0.002 constant after 100
# warm-up steps) dense (lm_dense) and with sparse FF + QKV + loss (lm_sparse),
# seeds 0 and 1, and with sparse FF + QKV, sparse FF, sparse QKV (seed 0), to
# 5000 steps, eval log-perplexity on the same 8 validation batches every 250
# steps. Two queues, each pinned to one core, so that every run has a core to
# itself and its wall-clock compares; then the curves by step and by minutes
# of each run's own wall-clock (terraformer-export).
#
# Cost: about 5 core-hours on the 2-core CPU (2.5 hours of wall time); the
# wall-clock table needs a machine that runs nothing else. PART=seeds: only
# dense and FF+QKV+loss, seeds 0 and 1 (table steps; about 3 core-hours, 1.5
# hours of wall time).
# Short version (lm_dense and lm_sparse, seed 0, 50 steps; no results file):
#   SHORT=1 bash experiments/sparse_vs_dense_lm.sh
# Writes OUT/<gin>_seed<k> (checkpoints, TensorBoard events; logs beside),
# OUT/steps/, OUT/variants/ and OUT/wallclock/ (exports: CSV, JSON, PNGs,
# table.md), their tables OUT/<table>.json and results/sparse_vs_dense_lm.json
# (tables steps: dense vs FF+QKV+loss, 2 seeds; variants: the other sparse
# layers, seed 0, beside dense; wallclock). Rerunning resumes every run.
#   [PART=seeds] bash experiments/sparse_vs_dense_lm.sh [OUT]
#   (OUT: runs/experiments/sparse_vs_dense_lm)
NAME=sparse_vs_dense_lm
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

steps=5000 every=250
part=${PART:-all}
queue0=(lm_dense:0 lm_sparse:0 lm_sparse_ff_qkv:0 lm_sparse_qkv:0)
queue1=(lm_dense:1 lm_sparse:1 lm_sparse_ff:0)
case "$part" in
  all) ;;
  seeds) queue0=(lm_dense:0 lm_sparse:0) queue1=(lm_dense:1 lm_sparse:1) ;;
  *) echo "PART must be all or seeds, not $part" >&2; exit 2 ;;
esac
table_steps=500,1000,1500,2000,2500,3000,3500,4000,4500,5000
minutes=5,10,15,20,25,30,35
if [[ -n "$SHORT" ]]; then
  steps=50 every=25 table_steps=25,50 minutes=1
  queue0=(lm_dense:0) queue1=(lm_sparse:0)
fi
declare -A label=([lm_dense]='Dense' [lm_sparse]='FF+QKV+loss'
                  [lm_sparse_ff_qkv]='FF+QKV' [lm_sparse_ff]='Sparse FF'
                  [lm_sparse_qkv]='Sparse QKV')

banner "two queues, one per core: ${queue0[*]} | ${queue1[*]}"
queue=experiments/sparse_vs_dense_queue.sh
taskset -c 0 bash "$queue" "$out" "$steps" "$every" "${queue0[@]}" &
pid0=$!
taskset -c 1 bash "$queue" "$out" "$steps" "$every" "${queue1[@]}" &
pid1=$!
wait "$pid0"
wait "$pid1"

# export DIR METRICS TABLE_OPTION NAME:SEED...: the curves of those runs that
# exist, their eval log-perplexity table into OUT/DIR/table.md.
export_runs() {
  local dir=$1 metrics=$2 table=$3 spec name seed
  shift 3
  local runs=()
  for spec in "$@"; do
    name=${spec%:*} seed=${spec#*:}
    [[ -d "$out/${name}_seed$seed" ]] || continue
    runs+=(--logdir="$out/${name}_seed$seed"
           --label="${label[$name]}, seed $seed")
  done
  .venv/bin/terraformer-export "${runs[@]}" --out="$out/$dir" \
    --metrics="$metrics" --table=eval/metrics/log_perplexity "$table"
}
seeds=(lm_dense:0 lm_dense:1 lm_sparse:0 lm_sparse:1)
variants=(lm_dense:0 lm_dense:1 lm_sparse_ff_qkv:0 lm_sparse_ff:0
          lm_sparse_qkv:0)
dense='Dense, seed 0|Dense, seed 1:5000'
banner "eval log-perplexity by step: dense vs FF+QKV+loss, 2 seeds"
export_runs steps '^eval/|^train/metrics' --table_steps="$table_steps" \
  "${seeds[@]}"
figures=()
if [[ -z "$SHORT" ]]; then
  figures=(--figure=dense_5000="$dense"
    --figure=ff_qkv_loss_minus_dense_5000="FF+QKV+loss, seed 0|FF+QKV+loss, seed 1:5000 - $dense"
    --figure=dense_seed_spread_5000='Dense, seed 1:5000 - Dense, seed 0:5000')
fi
tabulate markdown steps "$out/steps/table.md" "${figures[@]}"
if [[ "$part" == all && -z "$SHORT" ]]; then
  banner "the other sparse layers (seed 0) by step, and all by wall-clock"
  export_runs variants '^eval/|^train/metrics' \
    --table_steps="$table_steps" "${variants[@]}"
  tabulate markdown variants "$out/variants/table.md" \
    --figure=sparse_qkv_minus_dense_5000="Sparse QKV, seed 0:5000 - $dense"
  export_runs wallclock '^eval/' --table_minutes="$minutes" \
    "${seeds[@]}" lm_sparse_ff_qkv:0 lm_sparse_ff:0 lm_sparse_qkv:0
  tabulate markdown wallclock "$out/wallclock/table.md"
fi
record
banner done "outputs in $out"
