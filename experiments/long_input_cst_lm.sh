#!/usr/bin/env bash
# CST against full attention as the CST paper measures it (Lee et al., §5.2,
# Tables 2-4: LM perplexity at N 256 and 1024), sized for the 2-core CPU:
# causal LMs on the aclsum paper text (gin/long_input/cst_lm/: d_model 128,
# 2 layers, 4 heads, 2048 tokens a step: 8 x 256 or 2 x 1024, lr 0.001
# constant after 200 warm-up steps), eval log-perplexity on 65,536
# validation tokens every 250 steps. Rows (gin/long_input/cst_lm/ROW.gin):
# full attention, blockwise (causal blocks of 32: the floor), CST with L 32
# (the paper's) at alpha 1 and 2 (a causal local window of at most
# (alpha + 1) L / 2 = 32 or 48 keys) with and without the global branch
# (CST rows in the paper's form: MS-VIPE, no positions at the embedding).
# At 1024 tokens cst_a1_local is left out: it has blockwise's reach (blocks
# of 32) and differs from it only by the positions, which its 256-token twin
# shows. Seeds 0 and 1 (weights and data order).
#   1. Step time and compiled memory of each row's gradient step
#      (terraformer-memory-bench, one core, before any training).
#   2. Every run trains to STEPS (equal steps); a row whose step is faster
#      than full attention's goes on to the steps it makes in the time full
#      takes to STEPS, by those step times (equal wall time; the lr does not
#      decay, so its curve up to STEPS is the equal-steps run's).
#   3. Per length, a table (python experiments/long_input_cst_lm.py table,
#      from terraformer-export's curves): eval log-perplexity at STEPS / 2
#      and STEPS, mean (seed 0, seed 1), minus full's; step ms, speed vs
#      full, MiB; the training logs' ms a step; the log-perplexity at full's
#      wall time (linear between evaluations), minus full's.
#
# Cost: about 5.7 core-hours on the 2-core CPU (22 runs, each about as long
# as full attention's 2000 steps: 0.28 CPU-s a step at 256 tokens, 0.56 at
# 1024; CST and blockwise 0.23-0.27 at 256, 0.23-0.24 at 1024, so at 1024
# they make about 4900 steps in full's time; 5 core-hours of steps, the rest
# evaluations, start-ups and the step times; no run over 0.4 core-hours).
# Step times: process CPU time of the compiled step on core 1 while two
# niced trainings and tests shared the machine (wall-clock was 1.5-2.5x
# that; on a busy machine a run takes that much longer). Two runs at a
# time, one per core: about 3 hours.
# One length at a time: LENGTHS=256 (12 runs, about 2.2 core-hours: 75
# minutes on 2 cores) or LENGTHS=1024 (10 runs, about 3.5) records that
# length's table alone (the other one kept as an earlier run recorded it).
# Short version (full and CST alpha 2, seed 0, a d_model 32 model at 128 and
# 256 tokens, 20 steps; records nothing):
#   SHORT=1 bash experiments/long_input_cst_lm.sh
# Only some runs (no record): ROWS='full cst_a2' SEEDS='0'
# bash experiments/long_input_cst_lm.sh; other step counts: STEPS=3000 (equal
# steps; the equal-time runs follow); the cores of the two lanes of runs:
# CORES='0 1' (one core: CORES='1').
# Writes OUT/<len>/<row>_s<seed>/ (checkpoints, events), OUT/bench_<len>.json
# (terraformer-memory-bench --json), OUT/targets_<len>.txt (each row's
# steps), OUT/lane{0,1}.log, OUT/export_<len>/ (curves: scalars.json, PNGs,
# table.md), OUT/lm_<len>.json and results/long_input_cst_lm.json (tables
# lm_256, lm_1024). Rerunning skips finished runs and resumes an unfinished
# one.
#   bash experiments/long_input_cst_lm.sh [OUT]
#   (OUT: runs/experiments/long_input_cst_lm)
NAME=long_input_cst_lm
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ -n "${LENGTHS:-}" && -z "$SHORT" ]]; then  # The provenance says which.
  TERRAFORMER_RUN_COMMAND="LENGTHS='$LENGTHS' $TERRAFORMER_RUN_COMMAND"
fi

G=gin/long_input/cst_lm
# row | label in the tables
all_rows=(
  'full|full attention'
  'blockwise|blockwise, blocks of 32 (the floor)'
  'cst_a1|CST, L 32, α 1'
  'cst_a2|CST, L 32, α 2'
  'cst_a1_local|CST, L 32, α 1, no global branch'
  'cst_a2_local|CST, L 32, α 2, no global branch'
)
steps="${STEPS:-2000}"
seeds="${SEEDS:-0 1}"
lengths="${LENGTHS:-256 1024}"
every=250
tokens=2048        # a step's tokens at every length
repeats=10
short=()
selected=" ${ROWS:-} "
if [[ -n "$SHORT" ]]; then
  steps=20; every=10; seeds=0; lengths='128 256'; tokens=256; repeats=1
  selected=' full cst_a2 '
  short=('--config=ScalingTransformerLM.d_model = 32'
         '--config=ScalingTransformerLM.d_ff = 64'
         '--config=terraformer.train.eval_batches = 2')
fi
# rows_of LEN: the rows trained at LEN.
rows_of() {
  local spec row
  for spec in "${all_rows[@]}"; do
    row=${spec%%|*}
    if [[ "$selected" == '  ' ]]; then
      [[ "$1" == 1024 && "$row" == cst_a1_local ]] || echo "$row"
    elif [[ "$selected" == *" $row "* ]]; then
      echo "$row"
    fi
  done
}
label_of() {
  local spec
  for spec in "${all_rows[@]}"; do
    [[ "${spec%%|*}" != "$1" ]] || echo "${spec#*|}"
  done
}

banner "step time and compiled memory, one core (${cores[0]}), nothing beside"
for len in $lengths; do
  files=()
  for row in $(rows_of "$len"); do
    files+=(--config_file="$G/$row.gin")
    # A report of other rows (another ROWS) is measured again.
    if [[ -f "$out/bench_$len.json" ]] &&
       ! grep -q "\"$row\": \[" "$out/bench_$len.json"; then
      mv "$out/bench_$len.json" "$out/bench_$len.json.old"
    fi
  done
  into "$out/bench_$len.json" taskset -c "${cores[0]}" \
    .venv/bin/terraformer-memory-bench --input_lens="$len" "${files[@]}" \
    --batch_size=$(( tokens / len )) --target_len="$len" \
    --repeats="$repeats" --json ${short[@]+"${short[@]}"} > /dev/null
  # Not kept as done: another STEPS gives other targets.
  .venv/bin/python experiments/long_input_cst_lm.py targets \
    --bench="$out/bench_$len.json" --steps="$steps" --every="$every" \
    $(rows_of "$len") | tee "$out/targets_$len.txt"
done

# The runs in the order the two cores take them: 1024 tokens first (each run
# takes about full attention's time at its length).
runs=()
for len in $(tr ' ' '\n' <<< "$lengths" | sort -rn); do
  for seed in $seeds; do
    while read -r row target; do
      runs+=("$len:$row:$seed:$target")
    done < "$out/targets_$len.txt"
  done
done

# train CORE LEN ROW SEED TARGET: the run on CPU core CORE, to TARGET steps.
train() {
  local core=$1 len=$2 row=$3 seed=$4 target=$5
  local run="$out/$len/${row}_s$seed"
  banner "$len/${row}_s$seed: to step $target (core $core)"
  once "$run/steps$target.done" taskset -c "$core" .venv/bin/terraformer-train \
    --config_file="$G/$row.gin" --config="SEQ_LEN = $len" \
    --config="BATCH = $(( tokens / len ))" \
    --config="terraformer.train.random_seed=$seed" \
    --config="train/lm_stream.seed=$seed" \
    --config="terraformer.train.eval_every=$every" \
    --config="terraformer.train.checkpoint_every=$every" \
    --config="terraformer.train.steps=$target" ${short[@]+"${short[@]}"} \
    --output_dir="$run"
}

# train_run CORE LEN:ROW:SEED:TARGET: train on core CORE.
train_run() {
  local len row seed target
  IFS=: read -r len row seed target <<< "$2"
  train "$1" "$len" "$row" "$seed" "$target"
}
lanes train_run "${runs[@]}"

tables=()
for len in $lengths; do
  if [[ " $(echo $(rows_of "$len")) " != *' full '* ]]; then
    banner "$len tokens: no full-attention row, no table"
    continue
  fi
  banner "$len tokens: curves and the table"
  logdirs=(); specs=(); columns=()
  for row in $(rows_of "$len"); do
    labels=()
    for seed in $seeds; do
      logdirs+=(--logdir="$out/$len/${row}_s$seed" --label="${row}_s$seed")
      labels+=("${row}_s$seed")
    done
    specs+=("$(label_of "$row")=$row:$(IFS=,; echo "${labels[*]}")")
  done
  for (( s = every; s <= steps; s += every )); do columns+=("$s"); done
  .venv/bin/terraformer-export "${logdirs[@]}" --out="$out/export_$len" \
    --metrics='^eval/metrics/log_perplexity$|^train/training/steps per second$' \
    --table=eval/metrics/log_perplexity \
    --table_steps="$(IFS=,; echo "${columns[*]}")"
  .venv/bin/python experiments/long_input_cst_lm.py table \
    --export="$out/export_$len" --bench="$out/bench_$len.json" \
    --steps="$(( steps / 2 )),$steps" --out="$out/lm_$len.json" "${specs[@]}"
  tables+=(--table="lm_$len=$out/lm_$len.json")
done
if [[ -z "$SHORT" && ( "$selected" != '  ' || "$seeds" != '0 1' ||
      "$steps" != 2000 || ${#tables[@]} == 0 ) ]]; then
  banner "done: a part of the experiment (ROWS, SEEDS or STEPS), not recorded"
  exit 0
fi
captions=()
for len in $lengths; do
  captions+=(--caption="lm_$len=Causal LMs on the aclsum paper text, $len tokens (d_model 128, 2 layers, 2048 tokens a step), eval log-perplexity on 65,536 validation tokens: mean (seed 0, seed 1) at equal steps, and at equal wall time (the steps each row makes in the time full attention takes to step 2000, by the step ms; linear between evaluations). Step ms and MiB: the compiled gradient step (terraformer-memory-bench, one core); log ms/step: the training logs' median.")
done
record "${tables[@]}" "${captions[@]}"
banner done "outputs in $out"
