#!/usr/bin/env bash
# Table 4, copy, at reduced scale (docs/ood.md): train on numbers of 1-16
# digits, score greedy decoding of 256 numbers of 1-16 digits (in
# distribution) and of 32-37 digits (over 2x longer: out of distribution);
# 3000 steps of batch 32, d_model 64, 2 + 2 layers. The dense Transformer, the
# Terraformer as Trax configures it (LSH, fixed-base positions, reversible,
# low-rank SRU, dropout 0.05) and its ablations: one cell (gin/ood/CELL.gin)
# per row; the full-attention fixed-base cell also trained to 12000 steps.
# Then experiments/ood_decode_vs_eval.py on the LSH cell with sinusoidal
# positions: does decoding compute what evaluation does?
#
# Cost: about 6 core-hours on the 2-core CPU (the LSH cells compile their
# first step for ~10 minutes and decode slowest).
# Short version (2 cells, 30 steps, 16 numbers; writes no results file):
#   SHORT=1 bash experiments/ood_copy.sh
# Writes OUT/l16/<cell>_seed<k> and OUT/steps12000/<cell>_seed0 (checkpoints,
# TensorBoard events, ood_result.json), OUT/copy.json, OUT/decode_vs_eval.txt
# and results/ood_copy.json (table copy). Rerunning resumes: terraformer-ood
# skips finished runs and resumes the others from their newest checkpoint.
#   bash experiments/ood_copy.sh [OUT]      (OUT: runs/experiments/ood_copy)
NAME=ood_copy
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

long='--config=terraformer.train.steps=12000 --config=terraformer.train.checkpoint_every=1000 --config=terraformer.train.eval_every=1000'
# label | cell | seeds | folder under OUT | extra bindings
rows=(
  'Transformer (`copy_transformer`)|copy_transformer|0,1|l16|'
  'Transformer + dropout 0.05 (`copy_transformer_dropout`)|copy_transformer_dropout|0|l16|'
  'Terraformer as Trax: LSH, fixed-base positions (`copy_terraformer_sru`)|copy_terraformer_sru|0|l16|'
  'Terraformer, LSH, sinusoidal positions (`copy_terraformer_sru_sinusoidal`)|copy_terraformer_sru_sinusoidal|0|l16|'
  'Terraformer, full attention, fixed-base (`copy_terraformer_sru_full`)|copy_terraformer_sru_full|0|l16|'
  'the same, trained to 12000 steps|copy_terraformer_sru_full|0|steps12000|'"$long"
  'the same, fixed-base positions always from 0 (`copy_terraformer_sru_full_nooffset`)|copy_terraformer_sru_full_nooffset|0|l16|'
  'Terraformer, full attention, sinusoidal (`copy_terraformer_sru_full_sinusoidal`)|copy_terraformer_sru_full_sinusoidal|0,1|l16|'
  'the same, no SRU (`copy_terraformer_nosru_full_sinusoidal`)|copy_terraformer_nosru_full_sinusoidal|0|l16|'
  'the same, plain residual blocks (`copy_terraformer_sru_full_sinusoidal_irreversible`)|copy_terraformer_sru_full_sinusoidal_irreversible|0|l16|'
  'the same, no dropout (`copy_terraformer_sru_full_sinusoidal_nodropout`)|copy_terraformer_sru_full_sinusoidal_nodropout|0|l16|'
)
short=()
if [[ -n "$SHORT" ]]; then
  rows=("${rows[0]}" "${rows[7]}")
  short=(--config=terraformer.train.steps=30 --config=evaluate_cell.n_examples=16)
fi

table=()
for row in "${rows[@]}"; do
  IFS='|' read -r label cell seeds dir bindings <<< "$row"
  banner "$cell, seeds $seeds ($dir)"
  read -r -a extra <<< "$bindings"
  .venv/bin/terraformer-ood --output_dir="$out/$dir" --cells="$cell" \
    --seeds="$seeds" ${extra[@]+"${extra[@]}"} ${short[@]+"${short[@]}"}
  table+=("$label=$(run_dirs "$out/$dir" "$cell" "$seeds")")
done

banner "the table"
tabulate ood copy "${table[@]}"
record

if [[ -z "$SHORT" ]]; then
  banner "LSH decoding vs evaluation, copy_terraformer_sru_sinusoidal"
  into "$out/decode_vs_eval.txt" .venv/bin/python experiments/ood_decode_vs_eval.py \
    --cell=copy_terraformer_sru_sinusoidal --seed=0 \
    --output_dir="$out/l16/copy_terraformer_sru_sinusoidal_seed0"
fi
banner done "outputs in $out"
