#!/usr/bin/env bash
# Table 4, copy, at L = 32 (docs/ood.md): as experiments/ood_copy.sh, but
# train on numbers of 1-32 digits and evaluate on 64-75; the Transformer and
# the Terraformer that learns the copy at L = 16 (full attention, sinusoidal
# positions) for 3000 steps, then that Terraformer resumed to 6000 steps.
#
# Cost: about 1.5 core-hours on the 2-core CPU.
# Short version (30 steps, 16 numbers; writes no results file):
#   SHORT=1 bash experiments/ood_copy_l32.sh
# Writes OUT/steps3000/<cell>_seed0, OUT/steps6000/<cell>_seed0 (a copy of the
# 3000-step run, resumed), OUT/copy_l32.json and results/ood_copy_l32.json
# (table copy_l32). Rerunning resumes (terraformer-ood skips finished runs).
#   bash experiments/ood_copy_l32.sh [OUT]  (OUT: runs/experiments/ood_copy_l32)
NAME=ood_copy_l32
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

l32=(--config=arithmetic_stream.train_max_digits=32
     --config=arithmetic_stream.eval_min_digits=64
     --config=arithmetic_stream.eval_max_digits=75)
steps=(3000 6000)
if [[ -n "$SHORT" ]]; then
  steps=(30 60)
  l32+=(--config=evaluate_cell.n_examples=16)
fi
terraformer=copy_terraformer_sru_full_sinusoidal

banner "copy_transformer and $terraformer, ${steps[0]} steps"
.venv/bin/terraformer-ood --output_dir="$out/steps3000" \
  --cells="copy_transformer,$terraformer" --seeds=0 "${l32[@]}" \
  --config="terraformer.train.steps=${steps[0]}"
banner "$terraformer resumed to ${steps[1]} steps"
resume_ood "$out/steps3000" "$out/steps6000" "$terraformer" 0 "${l32[@]}" \
  --config="terraformer.train.steps=${steps[1]}"

banner "the table"
tabulate ood copy_l32 \
  "Transformer (\`copy_transformer\`)=$out/steps3000/copy_transformer_seed0" \
  "Terraformer, full attention, sinusoidal (\`$terraformer\`)=$out/steps3000/${terraformer}_seed0" \
  "the same, trained on=$out/steps6000/${terraformer}_seed0"
record
banner done "outputs in $out"
