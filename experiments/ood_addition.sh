#!/usr/bin/env bash
# Table 4, addition, at the training length the dense baseline learns
# (docs/ood.md): train on addends of 1-2 digits, score greedy decoding of 256
# sums of 1-2-digit addends (in distribution) and of 4-5-digit addends (out of
# distribution); batch 64, d_model 64, 2 + 2 layers, 20000 steps, seeds 0 and
# 1: the Transformer (`add_transformer`) and the Terraformer with full
# attention and sinusoidal positions (`add_terraformer_sru_full_sinusoidal`,
# the one that learns the copy), the latter then resumed to 30000 steps.
# experiments/ood_addition_length.sh is why L = 2.
#
# Cost: about 1.5 core-hours on the 2-core CPU.
# Short version (50 steps, 16 numbers; writes no results file):
#   SHORT=1 bash experiments/ood_addition.sh
# Writes OUT/steps20000/<cell>_seed<k>, OUT/steps30000/<cell>_seed<k> (copies
# of the 20000-step runs, resumed), OUT/addition_l2.json and
# results/ood_addition.json (table addition_l2). Rerunning resumes.
#   bash experiments/ood_addition.sh [OUT]  (OUT: runs/experiments/ood_addition)
NAME=ood_addition
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

l2=(--config=arithmetic_stream.train_max_digits=2
    --config=arithmetic_stream.eval_min_digits=4
    --config=arithmetic_stream.eval_max_digits=5
    --config=terraformer.train.checkpoint_every=1000
    --config=terraformer.train.eval_every=1000)
steps=(20000 30000)
if [[ -n "$SHORT" ]]; then
  steps=(50 100)
  l2+=(--config=terraformer.train.checkpoint_every=50
       --config=evaluate_cell.n_examples=16)
fi
terraformer=add_terraformer_sru_full_sinusoidal

banner "add_transformer and $terraformer, ${steps[0]} steps, seeds 0 and 1"
.venv/bin/terraformer-ood --output_dir="$out/steps20000" \
  --cells="add_transformer,$terraformer" --seeds=0,1 "${l2[@]}" \
  --config="terraformer.train.steps=${steps[0]}"
banner "$terraformer resumed to ${steps[1]} steps"
resume_ood "$out/steps20000" "$out/steps30000" "$terraformer" 0,1 "${l2[@]}" \
  --config="terraformer.train.steps=${steps[1]}"

banner "the table"
tabulate ood addition_l2 \
  "Transformer (\`add_transformer\`)=$(run_dirs "$out/steps20000" add_transformer 0,1)" \
  "Terraformer, full attention, sinusoidal (\`$terraformer\`)=$(run_dirs "$out/steps20000" "$terraformer" 0,1)" \
  "the same Terraformer, trained on=$(run_dirs "$out/steps30000" "$terraformer" 0,1)"
record
banner done "outputs in $out"
