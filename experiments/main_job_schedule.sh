#!/usr/bin/env bash
# The main job's learning-rate schedule, chosen on the 25 validation papers:
# every setting trains body -> abstract from scratch as the main job does
# (gin/main/finetune.gin: 400 steps, 50 warmup steps) with one change of the
# schedule's bindings, seeds 0 and 1, and summarizes the validation papers as
# the job does (T = 0.5, no repeated token trigram). The steps are equal, and
# so is the wall time (the schedule costs nothing). Cosine decay is Trax's
# `multifactor` factor 'cosine_decay' with one cycle over the steps after the
# warmup, so that the rate reaches ~0 at the last step. One table: ROUGE and
# fluency per setting and seed, beside the references' fluency and lead-3 /
# random 3 on the same papers. The test split is not read.
#
# Cost: about 0.7 core-hours on the 2-core CPU (6-8 minutes per run on one
# core); no timing, any machine (one core per process: taskset -c N).
# SETTINGS="name ..." trains and evaluates only those (e.g. two halves at once
# on two cores); the table is written when every setting has been evaluated.
# Short version (6 steps, 1 + 1 layers, 128 / 64 tokens, 2 validation papers;
# no results file): SHORT=1 bash experiments/main_job_schedule.sh
# Writes OUT/<setting>/ (checkpoints, eval JSON), OUT/<setting>/eval.txt and
# results/main_job_schedule.json (table settings). Rerunning resumes:
# finished trainings and evaluations are skipped.
#   bash experiments/main_job_schedule.sh [OUT]  (OUT: runs/experiments/main_job_schedule)
NAME=main_job_schedule
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

steps=400
warmup=50
main_job_validation
eval_args+=(--temperature=0.5)
if [[ -n "$SHORT" ]]; then
  steps=6
  warmup=2
  common+=("--config=multifactor.warmup_steps = $warmup")
fi
cosine="multifactor.factors = 'constant * linear_warmup * cosine_decay';multifactor.steps_per_cycle = $((steps - warmup))"

# name|label|bindings (;)
settings=(
  "constant2|the job's: constant 0.002 after warmup|"
  "cosine2|cosine decay from 0.002|$cosine"
  "cosine4|cosine decay from 0.004|$cosine;multifactor.constant = 0.004"
)
wanted=" ${SETTINGS:-} "

rows=()
missing=()
for setting in "${settings[@]}"; do
  IFS='|' read -r base label more <<< "$setting"
  for seed in 0 1; do
    name="${base}_seed$seed"
    dir="$out/$name"
    if [[ "$wanted" == "  " || "$wanted" == *" $name "* ]]; then
      mapfile -t bindings < <(bindings_of "$more;terraformer.train.random_seed = $seed")
      banner "$name ($label, seed $seed): $steps steps -> $dir"
      finetune_and_validate "$dir" "$steps" "$out/$name.log" \
        ${bindings[@]+"${bindings[@]}"} ${common[@]+"${common[@]}"}
    fi
    row_or_missing "$name" "$label, seed $seed" \
      "$dir/eval_validation_step$steps.json"
  done
done

exit_unless_complete
banner "the table"
tabulate settings settings "${rows[@]}"
record --caption=settings="Each setting trained body -> abstract from scratch for the main job's 400 steps (50 warmup steps, batch 4, 512 input / 128 target tokens; equal wall time), seeds 0 and 1, scored on the 25 validation papers, sampled at T = 0.5 without repeating a token trigram, beside the references' fluency and two extractive yardsticks on the same papers (ROUGE F1 %, rouge-score stemmed; fluency against the train papers' texts). Cosine decay: one cycle over the 350 steps after the warmup."
banner done "outputs in $out"
