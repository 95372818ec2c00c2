#!/usr/bin/env bash
# Quality at equal steps of the long-document mechanisms
# (docs/long-documents.md), at what a shared CPU fits: (1) body -> abstract on
# the aclsum papers with the tiny encoder-decoder (d 128, 2 + 2 layers,
# blockwise encoder, 1024-token inputs), pooled 1024 -> 256 -> 64
# (gin/tiny/pyramidion.gin) vs unpooled (gin/tiny/pyramidion_unpooled.gin),
# 100 steps, then terraformer-eval on the first 10 test papers; (2) the tiny
# LM (d 128, 2 layers, 128-token sequences) with causal CST (L 16, α 3;
# gin/tiny/lm_cst.gin) vs full attention (gin/tiny/lm_dense.gin), 200 steps.
# The learning rate is constant after warm-up, so these runs equal the same
# configs stopped at that step. It prints the eval log-perplexity by step
# (terraformer-export's tables) and the ROUGE of each summarizer;
# results/long_documents_quality.json (tables pyramidion, cst_lm) holds them
# as transcribed from such a run.
#
# Cost: about 0.5 core-hours on the 2-core CPU.
# Short version (10 steps, 2 papers): SHORT=1 bash experiments/long_documents_quality.sh
# Writes OUT/<run> (checkpoints, events; the summarizers' eval_test_step*.json)
# and OUT/export_{pyramidion,cst_lm}/. Rerunning skips finished steps.
#   bash experiments/long_documents_quality.sh [OUT]
#   (OUT: runs/experiments/long_documents_quality)
NAME=long_documents_quality
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pyr_steps=100; lm_steps=200; papers=10; tables=(50,100 1,100,200)
if [[ -n "$SHORT" ]]; then
  pyr_steps=10; lm_steps=10; papers=2; tables=(10 10)
fi

for run in pyramidion pyramidion_unpooled; do
  banner "$run: body -> abstract, $pyr_steps steps"
  once "$out/$run/train.done" .venv/bin/terraformer-train \
    --config_file="gin/tiny/$run.gin" --config="terraformer.train.steps=$pyr_steps" \
    --config=terraformer.train.eval_every=50 --output_dir="$out/$run"
  banner "$run: summaries of the first $papers test papers"
  into "$out/$run/eval.txt" .venv/bin/terraformer-eval \
    --config_file="gin/tiny/$run.gin" --max_examples="$papers" \
    --batch_size="$papers" --output_dir="$out/$run"
done
.venv/bin/terraformer-export --logdir="$out/pyramidion" \
  --label='pooled 1024 -> 256 -> 64' --logdir="$out/pyramidion_unpooled" \
  --label='unpooled (1024)' --out="$out/export_pyramidion" \
  --metrics='^eval/|^train/metrics' --table=eval/metrics/log_perplexity \
  --table_steps="${tables[0]}"

for run in lm_dense lm_cst; do
  banner "$run: $lm_steps steps"
  once "$out/$run/train.done" .venv/bin/terraformer-train \
    --config_file="gin/tiny/$run.gin" --config="terraformer.train.steps=$lm_steps" \
    --config=terraformer.train.eval_every=100 --output_dir="$out/$run"
done
.venv/bin/terraformer-export --logdir="$out/lm_dense" --label='full attention' \
  --logdir="$out/lm_cst" --label='CST (L 16, α 3)' --out="$out/export_cst_lm" \
  --metrics='^eval/|^train/metrics' --table=eval/metrics/log_perplexity \
  --table_steps="${tables[1]}"
banner done "outputs in $out (results/$NAME.json is transcribed)"
