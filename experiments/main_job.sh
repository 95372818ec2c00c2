#!/usr/bin/env bash
# The main job as a new user runs it (docs/main-job.md): `bash scripts/main.sh`
# (train the tiny Terraformer of gin/main/ body -> abstract on the train
# papers, summarize the 27 held-out test papers, time dense vs sparse
# decoding) into OUT, then its ROUGE table (the model beside lead-3, lead-k
# matched and 3 random sentences, the same papers and scorer), its fluency
# table and its run: the environment's set-up when this run created it, the
# job's wall time and the training's last eval log-perplexity.
#
# Cost: about 0.3 core-hours on the 2-core CPU (7-11 minutes of wall time;
# the set-up adds a few minutes on a fresh clone); the wall time needs a
# quiet machine.
# Short version (3 steps per stage, 1 + 1 layers, 2 test papers; no results
# file): SHORT=1 bash experiments/main_job.sh
# Writes OUT/{finetune,bench.txt} (scripts/main.sh's outputs), OUT/main.txt
# (what it printed), OUT/rouge.json, OUT/fluency.json, OUT/run.json and
# results/main_job.json (tables rouge, fluency, run). Rerunning resumes every stage;
# the run table is recorded only by a run that trained both stages from
# scratch (a resumed run's wall time is not the job's).
#   bash experiments/main_job.sh [OUT]  (OUT: runs/experiments/main_job)
stamp="$(dirname "${BASH_SOURCE[0]}")/../.venv/.terraformer-stamp"
fresh_env=
[[ -f "$stamp" ]] || fresh_env=1
start=$(date +%s)
NAME=main_job
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
setup_s=$(( $(date +%s) - start ))

args=()
if [[ -n "$SHORT" ]]; then
  args=('--config=terraformer.train.steps = 3' '--config=terraformer.train.eval_every = 3'
        '--config=Terraformer.n_encoder_layers = 1' '--config=Terraformer.n_decoder_layers = 1'
        '--config=INPUT_LEN = 128' '--config=TARGET_LEN = 64'
        '--config=terraformer.evaluate.max_examples = 2'
        '--config=terraformer.evaluate.batch_size = 2')
fi
from_scratch=
[[ -e "$out/pretrain" || -e "$out/finetune" ]] || from_scratch=1
start=$(date +%s)
OUTPUT_DIR="$out" bash scripts/main.sh "${args[@]}" | tee "$out/main.txt"
job_s=$(( $(date +%s) - start ))

banner "the tables"
eval_json=$(ls -t "$out"/finetune/eval_test_step*.json | head -n 1)
tabulate rouge rouge "$eval_json" --columns='F1 (%),ROUGE-1,ROUGE-2,ROUGE-L' \
  --figure=model_rouge1='model:ROUGE-1' \
  --figure=model_rouge2='model:ROUGE-2' --figure=model_rougeL='model:ROUGE-L' \
  --figure=lead3_rouge2='lead-3:ROUGE-2' \
  --figure=random3_rouge2='random 3 (seed 0):ROUGE-2'
tabulate settings fluency "model=$eval_json" \
  --columns='setting,words,known words (%),known trigrams (%),repeated trigrams (%)' \
  --figure=model_known_trigrams='model:known trigrams (%)' \
  --figure=references_known_trigrams='references:known trigrams (%)'
run=()
if [[ -n "$from_scratch" ]]; then
  last_ppl() {  # The last eval log-perplexity that stage printed.
    sed -n "\|stage $1|,\|=== \[|p" "$out/main.txt" \
      | grep -o 'eval log_perplexity [0-9.]*' | tail -n 1 | cut -d' ' -f3
  }
  minutes() { printf '%d min %d s' $(( $1 / 60 )) $(( $1 % 60 )); }
  rows="[\"main job (3 stages)\", \"$(minutes "$job_s")\"]"
  [[ -n "$fresh_env" ]] && rows="[\"set-up (the environment)\", \"$setup_s s\"], $rows"
  rows="$rows, [\"training: last eval log-perplexity\", \"$(last_ppl 2/4)\"]"
  printf '{"columns": ["measure", "this run"], "rows": [%s]}\n' "$rows" > "$out/run.json"
  run=(--table=run="$out/run.json" --figure=run:job_time="$(minutes "$job_s")")
fi
record "${run[@]}"
banner done "outputs in $out"
