#!/usr/bin/env bash
# Which training length L the dense baseline learns addition at, on this CPU
# (docs/ood.md): `add_transformer` (d_model 64, 2 + 2 layers, batch 64, Adam
# lr 0.002, warm-up 400, rsqrt decay) trained on addends of 1-L digits for
# L = 1, 2, 3, 4, 8, 16 (out of distribution: 2L to 2L + 1 digits; 32-37 at
# L = 16), seed 0; at L = 16 also twice the width (`add_transformer_d128`)
# and both addends 16 digits long; at L = 4 a 6-layer encoder and the
# Terraformer (`add_terraformer_sru_full_sinusoidal`). For each run: greedy
# accuracy (terraformer-ood's table), the accuracy of the digits by what they
# need (experiments/ood_digit_regions.py: both addends, one addend, carry, EOS)
# and the teacher-forced accuracy by step (terraformer-export's table).
# It prints these; results/ood_addition_length.json (tables length and l16)
# holds them as transcribed from such a run (no CLI writes that table whole).
#
# Cost: about 3 core-hours on the 2-core CPU (L = 16 at d_model 128: ~45 min).
# Short version (1/100 of the steps, 16 numbers):
#   SHORT=1 bash experiments/ood_addition_length.sh
# Writes OUT/<run>/<cell>_seed0 (checkpoints, events, ood_result.json),
# OUT/<run>/regions.json and OUT/export/ (curves, table.md). Rerunning resumes.
#   bash experiments/ood_addition_length.sh [OUT]
#   (OUT: runs/experiments/ood_addition_length)
NAME=ood_addition_length
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

every=(--config=terraformer.train.checkpoint_every=1000
       --config=terraformer.train.eval_every=1000)
examples=()
table_steps=1000,3000,4000,5000,8000,10000,12000,16000,20000
if [[ -n "$SHORT" ]]; then
  table_steps=10,30
  every=(--config=terraformer.train.checkpoint_every=10
         --config=terraformer.train.eval_every=10
         --config=evaluate_cell.n_examples=16)
  examples=(--examples=16)
fi
# run | cell | L (0: base.gin's 1-16, evaluated on 32-37) | steps | resumes run | extra bindings
runs=(
  'L1|add_transformer|1|3000||'
  'L2|add_transformer|2|3000||'
  'L2_20000|add_transformer|2|20000|L2|'
  'L3|add_transformer|3|3000||'
  'L4|add_transformer|4|4000||'
  'L4_20000|add_transformer|4|20000|L4|'
  'L8|add_transformer|8|8000||'
  'L16|add_transformer|0|16000||'
  'L16_d128|add_transformer_d128|0|10000||'
  'L16_aligned|add_transformer|0|5000||--config=arithmetic_stream.train_min_digits=16'
  'L4_enc6|add_transformer|4|5000||--config=ScalingTransformer.n_encoder_layers=6'
  'L4_terraformer|add_terraformer_sru_full_sinusoidal|4|4000||'
)

export_args=()
for spec in "${runs[@]}"; do
  IFS='|' read -r run cell L steps from bindings <<< "$spec"
  [[ -n "$SHORT" ]] && steps=$(( steps / 1000 * 10 ))
  read -r -a config <<< "$bindings"
  if (( L > 0 )); then
    config+=(--config=arithmetic_stream.train_max_digits=$L
             --config=arithmetic_stream.eval_min_digits=$((2 * L))
             --config=arithmetic_stream.eval_max_digits=$((2 * L + 1)))
  fi
  banner "$run: $cell, L ${L/#0/16}, $steps steps"
  [[ -n "$from" ]] && branch "$out/$from/${cell}_seed0" "$out/$run/${cell}_seed0"
  .venv/bin/terraformer-ood --output_dir="$out/$run" --cells="$cell" --seeds=0 \
    "${every[@]}" --config="terraformer.train.steps=$steps" \
    ${config[@]+"${config[@]}"}
  banner "$run: digits by what they need"
  into "$out/$run/regions.json" .venv/bin/python experiments/ood_digit_regions.py \
    --cell="$cell" --output_dir="$out/$run/${cell}_seed0" \
    ${examples[@]+"${examples[@]}"} ${config[@]+"${config[@]}"}
  export_args+=(--logdir="$out/$run/${cell}_seed0" --label="$run ($cell)")
done

banner "teacher-forced accuracy by step"
.venv/bin/terraformer-export "${export_args[@]}" --out="$out/export" \
  --metrics='^eval/|^train/' --table=eval/metrics/accuracy \
  --table_steps=$table_steps
banner done "outputs in $out (results/$NAME.json is transcribed)"
