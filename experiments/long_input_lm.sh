#!/usr/bin/env bash
# The recall LM (docs/long-input-quality.md): gin/long_input/lm_recall8.gin,
# 64-token rows with 8 facts `K_j V_j` in the first 23 tokens, queried at
# 47-63 with the keyed answer (each lookup reaches back 25-63 tokens), 2
# layers, d 128, batch 32, lr 0.001 after 200 warm-up steps.
#   1. What the lookup needs (seed 0): Q/K/V that are dense projections of one
#      position (local_conv_len 0; 10500 steps, lr times Trax's cosine factor
#      of 100000-step cycle, within 2% of 0.001), the paper's sparse QKV
#      (attention_sparsity 4: Q, K, V convolved over 3 positions; 2000 steps),
#      and `LocalConv` 3 (the gin file as it is; scored at 1500 steps).
#   2. Full attention vs causal CST (gin/long_input/lm_recall8_cst.gin: L 8,
#      α 1, a causal local window of 8 keys), seeds 0 and 1: full to 2500 steps (seed 0
#      is the LocalConv run of 1 trained on), CST to 2500 and then 5000.
# Exact match and token accuracy by experiments/long_input_eval.py (256
# validation rows) at each scored step; eval log-perplexity by step from
# terraformer-export.
#
# Cost: about 2.5 core-hours on the 2-core CPU (the dense run: ~70 minutes).
# Short version (a few steps each): SHORT=1 bash experiments/long_input_lm.sh
# Writes OUT/<run> (checkpoints, events, eval_<step>.json), OUT/export_{conv,cst}/
# (curves, table.md), OUT/<table>.json and results/long_input_lm.json (tables
# conv_log_ppl, conv_exact_match, cst_log_ppl, cst_exact_match). Rerunning
# skips finished steps and resumes an unfinished one.
#   bash experiments/long_input_lm.sh [OUT]  (OUT: runs/experiments/long_input_lm)
NAME=long_input_lm
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

conv_steps=500,1000,1250,1500,2000,4000,8000,10500
cst_steps=500,1000,1250,1500,1750,2000,2500,3000,4000,5000
scale() { echo "$1"; }
if [[ -n "$SHORT" ]]; then
  conv_steps=10,20; cst_steps=10,20,40
  scale() { echo $(( $1 / 250 * 2 )); }  # 2500 -> 20
fi
dense=(--config=ScalingTransformerLM.local_conv_len=0
       "--config=multifactor.factors='constant * linear_warmup * cosine_decay'")
sparse_qkv=(--config=ScalingTransformerLM.local_conv_len=0
            --config=ScalingTransformerLM.attention_sparsity=4)

# train RUN GIN SEED STEPS [bindings]: train RUN to each of STEPS (space-
# separated) and score it there (OUT/RUN/eval_<step>.json).
train() {
  local run=$1 gin=$2 seed=$3 steps=$4 step; shift 4
  local config=(--config_file="gin/long_input/$gin.gin"
                --config="terraformer.train.random_seed=$seed"
                --config="train/long_range_recall_lm_stream.seed=$seed" "$@")
  for step in $steps; do
    step=$(scale "$step")
    banner "$run: $gin, seed $seed, to step $step"
    once "$out/$run/steps$step.done" .venv/bin/terraformer-train "${config[@]}" \
      --config="terraformer.train.steps=$step" --output_dir="$out/$run"
    into "$out/$run/eval_$step.json" .venv/bin/python experiments/long_input_eval.py \
      "${config[@]}" --output_dir="$out/$run" --batches=8
  done
}
train dense lm_recall8 0 10500 "${dense[@]}"
train sparse_qkv lm_recall8 0 2000 "${sparse_qkv[@]}"
train full_s0 lm_recall8 0 '1500 2500'
train full_s1 lm_recall8 1 2500
train cst_s0 lm_recall8_cst 0 '2500 5000'
train cst_s1 lm_recall8_cst 1 '2500 5000'

# tables NAME STEPS 'LABEL=RUN:STEP [STEP]'...: the log-perplexity curves of
# the runs (terraformer-export) and their scores at each STEP, as the results
# tables NAME_log_ppl and NAME_exact_match.
tables() {
  local name=$1 steps=$2 spec label run step curves=() scores=(); shift 2
  for spec in "$@"; do
    label=${spec%%=*}; run=${spec#*=}
    curves+=(--logdir="$out/${run%:*}" --label="$label")
    for step in ${run#*:}; do
      scores+=("$label=$out/${run%:*}/eval_$(scale "$step").json")
    done
  done
  banner "$name: eval log-perplexity by step, exact match"
  .venv/bin/terraformer-export "${curves[@]}" --out="$out/export_$name" \
    --metrics='^eval/|^train/metrics' --table=eval/metrics/log_perplexity \
    --table_steps="$steps"
  tabulate markdown "${name}_log_ppl" "$out/export_$name/table.md"
  tabulate recall "${name}_exact_match" "${scores[@]}"
}
tables conv "$conv_steps" 'dense Q/K/V=dense:10500' \
  'sparse QKV, S 4, F 3=sparse_qkv:2000' 'dense Q/K/V + LocalConv 3=full_s0:1500'
tables cst "$cst_steps" 'Full, seed 0=full_s0:2500' 'Full, seed 1=full_s1:2500' \
  'CST L 8 α 1, seed 0=cst_s0:2500 5000' 'CST L 8 α 1, seed 1=cst_s1:2500 5000'
record
banner done "outputs in $out"
