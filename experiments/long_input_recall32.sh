#!/usr/bin/env bash
# Long-range recall with the encoder-decoder (docs/long-input-quality.md):
# 32-token inputs, 3 facts `K_j V_j` in the first half, queried at the end;
# one decoder layer, so only an encoder that sees a query and its key in one
# attention can bring the value to the query. Curriculum: the keyed form
# (gin/long_input/recall32/keyed.gin: the answer repeats each key, one lookup
# that needs no encoder range) to 5000 steps, then the values only, in a copy
# of that run, to 16000. One gin file per row (gin/long_input/recall32/ROW.gin):
# full, blockwise 16, Transpooler, Pyramidion, CST (L 8, α 1), LSH encoders
# (seeds 0, 1; full also 2); the ablations CST α 2, Pyramidion with a full
# first layer, Pyramidion with plain pair weights, the keys scored in stage 1
# (keyed_scored.gin) for Pyramidion and for full attention (seed 0); the tiny
# Terraformer with full and with LSH attention (1 decoder block; keyed stage
# 10000 steps, then values to 21000; seeds 0, 1). Each run is scored by
# experiments/long_input_eval.py (exact match and token accuracy on 256
# validation examples, after each stage; pooled encoders: which tokens the
# first pooling keeps; after stage 2, the answers' accuracy by their key's
# input position), and the curves by terraformer-export (eval log-perplexity
# by step). It prints these. results/long_input_recall32.json: the table
# cst_alpha2_by_key_position is recorded by this script once both CST α 2
# runs are scored; the others (encoders, ablations, pooling_kept,
# terraformer) are transcribed from such a run (no CLI writes them whole).
# The Transpooler and Pyramidion runs feed only the table pooling_kept: their
# rows are retired from the comparison (docs/long-input-quality.md says why).
#
# Cost: about 13 core-hours on the 2-core CPU (~22 core-minutes per
# ScalingTransformer run, 45-90 per Terraformer run). Two runs at a time, one
# per core (CORES='0 1'; one core: CORES='1'). The CST α 2 table alone,
# ROWS='cst_alpha2_s0 cst_alpha2_s1': about 0.8 core-hours.
# Short version (full and Pyramidion, seed 0, 20 + 20 steps):
#   SHORT=1 bash experiments/long_input_recall32.sh
# Only some runs: ROWS='full_s0 lsh_s1' bash experiments/long_input_recall32.sh
# Writes OUT/<run>_keyed (stage 1; its score stage1_eval.json), OUT/<run>
# (both stages; eval.json), OUT/export/ (curves, table.md). Rerunning skips
# finished stages and resumes an unfinished one from its newest checkpoint.
#   bash experiments/long_input_recall32.sh [OUT]
#   (OUT: runs/experiments/long_input_recall32)
NAME=long_input_recall32
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ -n "${ROWS:-}" && -z "$SHORT" ]]; then  # The provenance says which.
  TERRAFORMER_RUN_COMMAND="ROWS='$ROWS' $TERRAFORMER_RUN_COMMAND"
fi

G=gin/long_input/recall32
# run | row file | seed | stage-1 file | stage-1 steps, total steps (empty: the gin files') | pooled | extra bindings
runs=(
  'full_s0|full|0|keyed|||' 'full_s1|full|1|keyed|||' 'full_s2|full|2|keyed|||'
  'blockwise_s0|blockwise|0|keyed|||' 'blockwise_s1|blockwise|1|keyed|||'
  'transpooler_s0|transpooler|0|keyed||pooled|'
  'transpooler_s1|transpooler|1|keyed||pooled|'
  'pyramidion_s0|pyramidion|0|keyed||pooled|'
  'pyramidion_s1|pyramidion|1|keyed||pooled|'
  'cst_s0|cst|0|keyed|||' 'cst_s1|cst|1|keyed|||'
  'lsh_s0|lsh|0|keyed|||' 'lsh_s1|lsh|1|keyed|||'
  'cst_alpha2_s0|cst_alpha2|0|keyed|||' 'cst_alpha2_s1|cst_alpha2|1|keyed|||'
  'pyramidion_full_first_layer_s0|pyramidion_full_first_layer|0|keyed||pooled|'
  'pyramidion_plain_s0|pyramidion|0|keyed||pooled|--config=ScalingTransformer.pooling_peaked=False'
  'pyramidion_keys_scored_s0|pyramidion|0|keyed_scored||pooled|'
  'full_keys_scored_s0|full|0|keyed_scored|||'
  'terraformer_full_s0|terraformer_full|0|keyed|10000 21000||'
  'terraformer_full_s1|terraformer_full|1|keyed|10000 21000||'
  'terraformer_lsh_s0|terraformer_lsh|0|keyed|10000 21000||'
  'terraformer_lsh_s1|terraformer_lsh|1|keyed|10000 21000||'
)
selected=" ${ROWS:-} "
if [[ -n "$SHORT" ]]; then selected=' full_s0 pyramidion_s0 '; fi
chosen=()
for spec in "${runs[@]}"; do
  run=${spec%%|*}
  if [[ "$selected" == '  ' || "$selected" == *" $run "* ]]; then
    chosen+=("$run")
  fi
done

# train_run CORE RUN: RUN's two stages and their scores, on CPU core CORE.
train_run() {
  local core=$1 spec run row seed stage1 steps pooled bindings
  for spec in "${runs[@]}"; do [[ "${spec%%|*}" != "$2" ]] || break; done
  IFS='|' read -r run row seed stage1 steps pooled bindings <<< "$spec"
  local -a extra keyed_at=() total_at=() kept=() files
  read -r -a extra <<< "$bindings"
  extra+=(--config="terraformer.train.random_seed=$seed"
          --config="train/long_range_recall_stream.seed=$seed")
  local keyed_steps total_steps
  read -r keyed_steps total_steps <<< "$steps"
  if [[ -n "$SHORT" ]]; then keyed_steps=20; total_steps=40; fi
  [[ -n "$keyed_steps" ]] && keyed_at=(--config="terraformer.train.steps=$keyed_steps")
  [[ -n "$total_steps" ]] && total_at=(--config="terraformer.train.steps=$total_steps")
  [[ -n "$pooled" ]] && kept=(--kept_by_pooling)
  files=(--config_file="$G/$row.gin")
  local on_core=(taskset -c "$core")

  banner "$run: stage 1 ($stage1.gin, core $core)"
  once "$out/${run}_keyed/stage1.done" "${on_core[@]}" .venv/bin/terraformer-train \
    "${files[@]}" --config_file="$G/$stage1.gin" "${extra[@]}" \
    ${keyed_at[@]+"${keyed_at[@]}"} --output_dir="$out/${run}_keyed"
  into "$out/${run}_keyed/stage1_eval.json" "${on_core[@]}" .venv/bin/python \
    experiments/long_input_eval.py "${files[@]}" --config_file="$G/$stage1.gin" \
    "${extra[@]}" --output_dir="$out/${run}_keyed" --batches=8 \
    ${kept[@]+"${kept[@]}"}
  banner "$run: stage 2 (values only, core $core)"
  branch "$out/${run}_keyed" "$out/$run"
  once "$out/$run/stage2.done" "${on_core[@]}" .venv/bin/terraformer-train \
    "${files[@]}" "${extra[@]}" ${total_at[@]+"${total_at[@]}"} \
    --output_dir="$out/$run"
  into "$out/$run/eval.json" "${on_core[@]}" .venv/bin/python \
    experiments/long_input_eval.py "${files[@]}" "${extra[@]}" \
    --output_dir="$out/$run" --batches=8 --by_key_position \
    ${kept[@]+"${kept[@]}"}
}
if (( ${#chosen[@]} )); then lanes train_run "${chosen[@]}"; fi

export_args=()
for run in ${chosen[@]+"${chosen[@]}"}; do
  export_args+=(--logdir="$out/$run" --label="$run")
done
if (( ${#export_args[@]} )); then
  banner "eval log-perplexity by step"
  .venv/bin/terraformer-export "${export_args[@]}" --out="$out/export" \
    --metrics='^eval/|^train/metrics' --table=eval/metrics/log_perplexity \
    --table_steps=5000,8000,10000,11000,12000,14000,16000,21000
fi

# CST α 2's answers by their key's position (both seeds): recorded; the
# other tables are transcribed.
by_position=()
for seed in 0 1; do
  eval_json="$out/cst_alpha2_s$seed/eval.json"
  if grep -qs value_accuracy_by_key_position "$eval_json"; then
    by_position+=("CST (L 8, α 2), seed $seed=$eval_json")
  fi
done
if (( ${#by_position[@]} == 2 )); then
  tabulate recall cst_alpha2_by_key_position "${by_position[@]}"
  record --caption="cst_alpha2_by_key_position=CST with α 2 (L 8: local windows of 16 tokens), 2 encoder layers, the values-only stage at step 16000, 256 validation examples: exact match, token accuracy, and each answer value's teacher-forced accuracy by its key's input position (facts K V in slots of 2 at 0-15; the queried keys at 28-30). Two stacked local windows reach keys at 10-14 (the queries' slice 24-31 sees 20 and up; positions 16-23 see 12 and up; the causal LocalConv 3 before the first layer, 2 more); keys at 0-8 reach the queries only through the global attention over slice summaries."
fi
banner done "outputs in $out (results/$NAME.json: the CST α 2 by key position table recorded, the others transcribed)"
