#!/usr/bin/env bash
# The main job's training settings compared at an equal number of training
# steps (400 in all: every step of both stages reads 512 input and 128 target
# tokens, so the steps cost about the same), chosen on the 25 validation
# papers: each setting runs the main job's two stages (gin/main/pretrain.gin
# or another pretraining file, gin/main/finetune.gin with the setting's
# bindings) into its own
# folder, then terraformer-eval on the validation split with sampling at
# T = 0.5 and no repeated token trigram. One table: ROUGE and the fluency
# shares per setting, beside the references' fluency and lead-3 / random 3 on the same papers. The test
# split is not read.
#
# Cost: about 1.2 core-hours on the 2-core CPU (7-10 minutes per setting on
# one core); no timing, any machine (run it on one core: taskset -c 1).
# Short version (3 steps per stage, 1 + 1 layers, 2 validation papers; no
# results file): SHORT=1 bash experiments/main_job_tuning.sh
# Writes OUT/<setting>/{pretrain,finetune} and each setting's eval JSON in
# its finetune folder, OUT/settings.json and results/main_job_tuning.json
# (table settings). Rerunning resumes: training continues or says it is
# done, an evaluated setting is skipped.
#   bash experiments/main_job_tuning.sh [OUT]  (OUT: runs/experiments/main_job_tuning)
NAME=main_job_tuning
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

common=()
eval_args=(--split=validation --method=sample --temperature=0.5 --no_repeat_ngram=3)
if [[ -n "$SHORT" ]]; then
  common=('--config=terraformer.train.eval_every = 3'
          '--config=Terraformer.n_encoder_layers = 1' '--config=Terraformer.n_decoder_layers = 1'
          '--config=INPUT_LEN = 128' '--config=TARGET_LEN = 64')
  eval_args+=(--max_examples=2 --batch_size=2)
fi

# name|label|pretraining gin file|its steps|fine-tuning steps|more
# fine-tuning bindings (;)
settings=(
  "base|masked words 200, fine-tune 200 (the paper's recipe)|main/pretrain.gin|200|200|"
  "prefix_lm|prefix LM 200, fine-tune 200|main/pretrain_prefix_lm.gin|200|200|"
  "finetune_only|fine-tune 400 from scratch, lr 0.002|-|0|400|multifactor.constant = 0.002"
  "finetune_lr3|masked words 200, fine-tune 200 at lr 0.003|main/pretrain.gin|200|200|multifactor.constant = 0.003"
  "finetune_only_lr4|fine-tune 400 from scratch, lr 0.004|-|0|400|multifactor.constant = 0.004"
  "finetune_only_seed1|fine-tune 400 from scratch, lr 0.002, seed 1|-|0|400|multifactor.constant = 0.002;terraformer.train.random_seed = 1"
)

steps() { [[ -n "$SHORT" ]] && echo $(( $1 > 0 ? 3 : 0 )) || echo "$1"; }
rows=()
for setting in "${settings[@]}"; do
  IFS='|' read -r name label pre_gin pre ft more <<< "$setting"
  dir="$out/$name"
  mkdir -p "$dir"
  pre=$(steps "$pre")
  ft=$(steps "$ft")
  ft_args=("--config=terraformer.train.steps = $ft")
  IFS=';' read -r -a bindings <<< "$more"
  for b in "${bindings[@]}"; do ft_args+=("--config=$b"); done
  if (( pre > 0 )); then
    banner "$label: pretrain -> $dir/pretrain"
    .venv/bin/terraformer-train --config_file="gin/$pre_gin" \
      --output_dir="$dir/pretrain" "--config=terraformer.train.steps = $pre" \
      ${common[@]+"${common[@]}"} 2>&1 | tee -a "$dir/pretrain.log"
    ft_args+=("--config=INIT_CHECKPOINT = '$dir/pretrain'")
  fi
  banner "$label: fine-tune -> $dir/finetune"
  .venv/bin/terraformer-train --config_file=gin/main/finetune.gin \
    --output_dir="$dir/finetune" "${ft_args[@]}" ${common[@]+"${common[@]}"} \
    2>&1 | tee -a "$dir/finetune.log"
  banner "$label: validation papers"
  if ! ls "$dir"/finetune/eval_validation_step*.json > /dev/null 2>&1; then
    .venv/bin/terraformer-eval --config_file=gin/main/finetune.gin \
      ${common[@]+"${common[@]}"} --output_dir="$dir/finetune" \
      "${eval_args[@]}" --print_examples=1 > "$dir/eval.txt"
  fi
  grep -A 7 '^F1' "$dir/eval.txt" || true
  rows+=("$label=$(ls "$dir"/finetune/eval_validation_step*.json)")
done

banner "the table"
tabulate settings settings "${rows[@]}" \
  --figure=base_rouge2="masked words 200, fine-tune 200 (the paper's recipe):ROUGE-2" \
  --figure=prefix_lm_rouge2="prefix LM 200, fine-tune 200:ROUGE-2" \
  --figure=finetune_only_rouge2="fine-tune 400 from scratch, lr 0.002:ROUGE-2" \
  --figure=finetune_only_seed1_rouge2="fine-tune 400 from scratch, lr 0.002, seed 1:ROUGE-2" \
  --figure=random3_rouge2="random 3 (seed 0):ROUGE-2"
record --caption=settings="Each setting trained 400 steps in all (pretraining + fine-tuning, 512 input / 128 target tokens, batch 4; about equal wall time), scored on the 25 validation papers, sampled at T = 0.5 without repeating a token trigram, beside the references' fluency and two extractive yardsticks on the same papers (ROUGE F1 %, rouge-score stemmed; fluency against the train papers' texts; seed 0 unless named)."
banner done "outputs in $out"
