#!/usr/bin/env bash
# How the main job's model should decode, chosen on the validation papers:
# the main job's training (`scripts/main.sh`, gin/main/finetune.gin) into OUT,
# then terraformer-eval of its checkpoint on the 25 validation
# papers once per decoding setting (each in its own copy of the checkpoint
# folder): sampling at T = 0.5 (the paper's), greedy and beam search, each
# with and without no_repeat_ngram=3 (no summary repeats one of its own token
# trigrams). One table: ROUGE and the fluency shares per setting, beside the
# references' fluency and lead-3 / random 3 on the same papers. The test
# split is not read.
#
# Cost: about 0.3 core-hours on the 2-core CPU (the training, ~6 minutes,
# then 1-4 minutes per setting); no timing, any machine.
# Short version (3 steps, 1 + 1 layers, 2 validation papers; no
# results file): SHORT=1 bash experiments/main_job_decoding.sh
# Writes OUT/finetune (the main job's training), OUT/setting<i>/
# (each setting's eval JSON and JSONL), OUT/settings.json and
# results/main_job_decoding.json (table settings). Rerunning resumes:
# training continues or says it is done, a setting with its eval JSON is
# skipped.
#   bash experiments/main_job_decoding.sh [OUT]  (OUT: runs/experiments/main_job_decoding)
NAME=main_job_decoding
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

args=()
eval_args=(--split=validation)
if [[ -n "$SHORT" ]]; then
  args=('--config=terraformer.train.steps = 3' '--config=terraformer.train.eval_every = 3'
        '--config=Terraformer.n_encoder_layers = 1' '--config=Terraformer.n_decoder_layers = 1'
        '--config=INPUT_LEN = 128' '--config=TARGET_LEN = 64')
  eval_args+=(--max_examples=2 --batch_size=2)
fi
banner "the main job's training -> $out"
OUTPUT_DIR="$out" STAGES="finetune" bash scripts/main.sh ${args[@]+"${args[@]}"}

settings=(
  "sample T 0.5 (the paper's)=--method=sample --temperature=0.5 --no_repeat_ngram=0"
  "sample T 0.5, no repeated trigram=--method=sample --temperature=0.5 --no_repeat_ngram=3"
  "greedy=--method=greedy --no_repeat_ngram=0"
  "greedy, no repeated trigram=--method=greedy --no_repeat_ngram=3"
  "beam 4=--method=beam --beam_size=4 --no_repeat_ngram=0"
  "beam 4, no repeated trigram=--method=beam --beam_size=4 --no_repeat_ngram=3"
)
rows=()
i=0
for setting in "${settings[@]}"; do
  label=${setting%%=*}
  read -r -a flags <<< "${setting#*=}"
  dir="$out/setting$i"
  i=$(( i + 1 ))
  banner "validation papers, $label"
  if ! ls "$dir"/eval_validation_step*.json > /dev/null 2>&1; then
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$out/finetune/model.pkl.gz" "$out/finetune/config.gin" "$dir/"
    .venv/bin/terraformer-eval --config_file=gin/main/finetune.gin \
      ${args[@]+"${args[@]}"} --output_dir="$dir" "${eval_args[@]}" "${flags[@]}" \
      --print_examples=1 > "$dir/eval.txt"
  fi
  grep -A 7 '^F1' "$dir/eval.txt" || true
  rows+=("$label=$(ls "$dir"/eval_validation_step*.json)")
done

banner "the table"
tabulate settings settings "${rows[@]}" \
  --figure=sample_rouge2="sample T 0.5 (the paper's):ROUGE-2" \
  --figure=greedy_nr3_rouge2="greedy, no repeated trigram:ROUGE-2" \
  --figure=beam_nr3_rouge2="beam 4, no repeated trigram:ROUGE-2" \
  --figure=random3_rouge2="random 3 (seed 0):ROUGE-2"
record --caption=settings="The main job's model (400 steps body -> abstract) on the 25 validation papers, decoded 6 ways, beside the references' fluency and two extractive yardsticks on the same papers (ROUGE F1 %, rouge-score stemmed; fluency against the train papers' texts). No repeated trigram: no_repeat_ngram = 3, on tokens."
banner done "outputs in $out"
