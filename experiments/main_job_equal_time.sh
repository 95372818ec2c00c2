#!/usr/bin/env bash
# The main job's model, input length, vocabulary and sparsity compared at an
# equal training wall time, chosen on the 25 validation papers. Every setting
# trains body -> abstract from scratch as the main job does
# (gin/main/finetune.gin, lr 0.002, seed 0; the job's and the narrow model
# also seed 1) with one change of bindings, for
# as many steps as the job's 400 take on this CPU: first each setting trains
# 31 steps (calib/<setting>), its steps/s is read from steps 2-31 (Trax's
# "Ran 30 train steps in S secs", compilation excluded), and it then trains
# round(400 * its steps/s / the job's steps/s) steps. Each trained setting
# summarizes the validation papers as the job does (T = 0.5, no repeated
# token trigram). One table: ROUGE and fluency per setting (its parameters,
# steps and calibrated steps/s in the label), beside the references' fluency
# and lead-3 / random 3 on the same papers. The test split is not read.
#
# Cost: about 1.7 core-hours on the 2-core CPU (calibration ~25 minutes,
# then 6-9 minutes per setting on one core); the calibration is a timing:
# run it on one core (taskset -c 1) with nothing else heavy running.
# SETTINGS="name ..." trains and evaluates only those settings (e.g. two
# halves at once on two cores, once the calibration has finished); the table
# is written when every setting has been evaluated.
# Short version (5 calibration steps, 1 + 1 layers, 128 / 64 tokens, 2
# validation papers; no results file): SHORT=1 bash experiments/main_job_equal_time.sh
# Writes OUT/calib/<setting>.log, OUT/<setting>/ (checkpoints, eval JSON),
# OUT/<setting>/eval.txt and results/main_job_equal_time.json (table
# settings). Rerunning resumes: finished calibrations, trainings and
# evaluations are skipped.
#   bash experiments/main_job_equal_time.sh [OUT]  (OUT: runs/experiments/main_job_equal_time)
NAME=main_job_equal_time
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

base_steps=400
calib_steps=30
main_job_validation
eval_args+=(--temperature=0.5)
if [[ -n "$SHORT" ]]; then
  base_steps=6
  calib_steps=4
fi

# name|what changes from the main job|its bindings (;). lsh_chunk_len 64
# divides every INPUT_LEN and INPUT_LEN + TARGET_LEN below; predict_mem_len is
# INPUT_LEN + TARGET_LEN (decoding sees the whole input); the model's
# vocabulary is the pieces + 100 sentinels, as in gin/main/pretrain.gin.
settings=(
  "base|the job's (d_model 128, 2 + 2 layers, 512 input tokens, 2048 pieces, sparse)|"
  "narrow|d_model 64, d_ff 256|Terraformer.d_model = 64;Terraformer.d_ff = 256"
  "wide|d_model 256, d_ff 1024|Terraformer.d_model = 256;Terraformer.d_ff = 1024"
  "deep|4 + 4 layers|Terraformer.n_encoder_layers = 4;Terraformer.n_decoder_layers = 4"
  "input256|256 input tokens|INPUT_LEN = 256;Terraformer.predict_mem_len = 384"
  "input1024|1024 input tokens|INPUT_LEN = 1024;Terraformer.predict_mem_len = 1152"
  "vocab1024|1024 pieces|VOCAB_SIZE = 1024;MODEL_VOCAB_SIZE = 1124"
  "vocab4096|4096 pieces|VOCAB_SIZE = 4096;MODEL_VOCAB_SIZE = 4196"
  "dense|the dense twin (FF, QKV and loss dense)|Terraformer.ff_sparsity = 0;Terraformer.attention_sparsity = 0;Terraformer.loss_sparsity = 0"
  # The second seed of the job's setting and of the best other one: a
  # <setting>_seed1 trains as many steps as <setting> (its calibration).
  "base_seed1|the job's, seed 1|terraformer.train.random_seed = 1"
  "narrow_seed1|d_model 64, d_ff 256, seed 1|Terraformer.d_model = 64;Terraformer.d_ff = 256;terraformer.train.random_seed = 1"
)
[[ -z "$SHORT" ]] || settings=("${settings[0]}" "${settings[1]}" "${settings[8]}" "${settings[10]}")
wanted=" ${SETTINGS:-} "

# steps/s of a calibration log: the last "Ran N train steps in S secs"
steps_per_s() {
  grep -o 'Ran [0-9]* train steps in [0-9.]* secs' "$1" | tail -1 |
    awk '{ printf "%.3f", $2 / $6 }'
}

banner "calibration: $calib_steps steps per setting (after its first) -> $out/calib"
mkdir -p "$out/calib"
for setting in "${settings[@]}"; do
  IFS='|' read -r name label more <<< "$setting"
  [[ "$name" != *_seed1 ]] || continue
  log="$out/calib/$name.log"
  if [[ -s "$log" ]] && grep -q '^Done: step' "$log"; then
    echo "$name: $(steps_per_s "$log") steps/s (done before: $log)"
    continue
  fi
  mapfile -t bindings < <(bindings_of "$more")
  rm -rf "$out/calib/$name"
  .venv/bin/terraformer-train --config_file=gin/main/finetune.gin \
    --output_dir="$out/calib/$name" \
    "--config=terraformer.train.steps = $((calib_steps + 1))" \
    "--config=terraformer.train.eval_every = $calib_steps" \
    '--config=terraformer.train.eval_batches = 1' \
    ${bindings[@]+"${bindings[@]}"} ${common[@]+"${common[@]}"} > "$log.tmp" 2>&1
  mv "$log.tmp" "$log"
  rm -rf "$out/calib/$name"  # its weights are not used
  echo "$name: $(steps_per_s "$log") steps/s"
done
base_sps=$(steps_per_s "$out/calib/base.log")

rows=()
missing=()
for setting in "${settings[@]}"; do
  IFS='|' read -r name label more <<< "$setting"
  dir="$out/$name"
  calib="$out/calib/${name%_seed1}.log"
  sps=$(steps_per_s "$calib")
  steps=$(awk -v b="$base_steps" -v s="$sps" -v s0="$base_sps" \
    'BEGIN { printf "%d", b * s / s0 + 0.5 }')
  params=$(grep -o 'Total number of trainable weights: [0-9]*' \
    "$calib" | head -1 | awk '{ printf "%.2fM", $NF / 1e6 }')
  row_label="$label: $params parameters, $steps steps ($sps steps/s)"
  if [[ "$wanted" == "  " || "$wanted" == *" $name "* ]]; then
    mapfile -t bindings < <(bindings_of "$more")
    banner "$name ($label): $steps steps at $sps steps/s -> $dir"
    finetune_and_validate "$dir" "$steps" "$out/$name.log" \
      ${bindings[@]+"${bindings[@]}"} ${common[@]+"${common[@]}"}
  fi
  row_or_missing "$name" "$row_label" "$dir/eval_validation_step$steps.json"
done

exit_unless_complete
banner "the table"
tabulate settings settings "${rows[@]}"
record --caption=settings="Each setting trained body -> abstract from scratch (lr 0.002, seed 0 unless named, batch 4, 128 target tokens) for the wall time of the main job's 400 steps: its steps = 400 x its steps/s / the job's, steps/s measured over 30 steps on one core; scored on the 25 validation papers, sampled at T = 0.5 without repeating a token trigram, beside the references' fluency and two extractive yardsticks on the same papers (ROUGE F1 %, rouge-score stemmed; fluency against the train papers' texts)."
banner done "outputs in $out"
