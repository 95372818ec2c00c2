#!/usr/bin/env bash
# Pyramidion's scorer ablation (Pietruszka et al., App. A, Table 4), sized for
# the 2-core CPU, on a task where selection decides the answer: salient-token
# extraction (terraformer/data/salient_extraction.py): 512 tokens of aclsum
# paper bodies, 16 salient tokens each after its own marker (indexed
# markers); the target is those 16 tokens in input order. No queries. A
# length curriculum in the train stream (64, 128, 256 tokens, then 512;
# base.gin's header says why): pooling passes inputs of at most k vectors
# unchanged, so each pooled row's scorer starts fresh at the first stage
# longer than its k.
# The shallow encoder-decoder of App. C (gin/long_input/scorers/base.gin: 4
# encoder layers, pooling after the second, 2 decoder layers, d_model 128;
# the scorer reads the normalized stream, one pooling step of 2-3 halving
# rounds: the paper's form; positions in the decoder: not the paper's).
# Rows (gin/long_input/scorers/ROW.gin): no pooling (full attention; blocks
# of 128), the linear scorer pooled 4x and 8x, the nonlinear scorer,
# index-based selection, random scores, mean and max pooling over windows of
# 4 (stride 4), the linear scorer pooling after layer 0, and k = 8 below
# m = 16 (a control that must cap accuracy). Seeds 0 and 1, each trained to
# step 6000 (5500 curriculum steps, then 500 at 512 tokens; batch 16, lr
# 0.001 after 400 warm-up steps) and scored there on 256 validation and 256
# test examples (python -m terraformer.cli.extraction_eval: greedy decoding,
# token F1, exact match, the first pooling's recall of the salient
# positions). Step time and compiled memory of each row's gradient step at
# batch 16 by terraformer-memory-bench, and the same at 2048 tokens for the
# linear scorer (4x, blocks of 512) and its unpooled twin.
# In the probes (seed 0, validation, base.gin's header) the linear 4x row
# keeps every salient position (recall 1.000, token F1 1.000) where random
# scores keep chance (0.260) and lose (F1 0.933, exact match 0.297).
# Cost: about 17 core-hours on the 2-core CPU (22 runs of 42-50 core-
# minutes: the 64-token stage ~20, the 128 and 256 stages ~5, the 500 steps
# at 512 tokens 15-23, scoring ~2; two runs at a time, one per core: about
# 8.5 hours over sessions: rerunning resumes), plus the benches.
# Short version (full and linear 4x, seed 0, a d_model 32 model, 64 then
# 256 tokens, 20 steps, 4 examples scored; records nothing):
#   SHORT=1 bash experiments/long_input_scorers.sh
# Only some runs (no table until all are scored): ROWS='full linear_4x'
# SEEDS='0' bash experiments/long_input_scorers.sh; other step counts:
# STEPS='5750 6000' (each run scored at each, its test scores at the step of
# best validation token F1); the cores of the two lanes of runs:
# CORES='0 1' (one core: CORES='1').
# Writes OUT/<row>_s<seed>/ (checkpoints, eval_{validation,test}_<step>.json),
# OUT/lane{0,1}.log (each lane's runs), OUT/bench_512.json and
# OUT/bench_2048.json (terraformer-memory-bench --json), OUT/scorers.json,
# OUT/length.json and results/long_input_scorers.json (tables scorers,
# length). Rerunning skips finished steps and resumes an unfinished one.
#   bash experiments/long_input_scorers.sh [OUT]
#   (OUT: runs/experiments/long_input_scorers)
NAME=long_input_scorers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

G=gin/long_input/scorers
# row | label in the tables
all_rows=(
  'full|no pooling, full attention'
  'linear_4x|linear, 4x (512 → 128)'
  'blockwise|no pooling, blocks of 128'
  'linear_8x|linear, 8x (512 → 64)'
  'nonlinear|nonlinear, 4x'
  'index|index-based, 4x'
  'random|random, 4x'
  'mean|mean pooling, windows of 4'
  'max|max pooling, windows of 4'
  'linear_layer0|linear, 4x after layer 0'
  'k_below_m|linear, k = 8 < m = 16'
)
default_steps=6000
steps="${STEPS:-$default_steps}"
seeds="${SEEDS:-0 1}"
batches=16
len=512
short=()
selected=" ${ROWS:-} "
if [[ -n "$SHORT" ]]; then
  steps=20; seeds=0; batches=1; len=256; selected=' full linear_4x '
  short=('--config=INPUT_LEN = 256' '--config=ScalingTransformer.d_model = 32'
         '--config=ScalingTransformer.d_ff = 64'
         '--config=salient_extraction_stream.batch_size = 4'
         '--config=train/salient_extraction_stream.length_stages = ((64, 10),)'
         '--config=terraformer.train.eval_batches = 1')
fi
wanted() { [[ "$selected" == '  ' || "$selected" == *" $1 "* ]]; }

# The runs in the order the two cores take them (the first two: the ceiling
# and the paper's row, seed 0, a check that the task is learned).
runs=()
for seed in $seeds; do
  for spec in "${all_rows[@]}"; do
    row=${spec%%|*}
    if wanted "$row"; then runs+=("$row:$seed"); fi
  done
done
if [[ -n "${QUALITY_2048:-}" && -z "$SHORT" ]]; then
  runs+=('linear_4x_2048:0' 'blockwise_2048:0')
fi

# train_and_score CORE ROW SEED: ROW's run with SEED on CPU core CORE, trained
# to each of $steps and scored there on validation and test.
train_and_score() {
  local core=$1 row=$2 seed=$3 step split
  local run="$out/${row}_s$seed"
  local config=(--config_file="$G/$row.gin"
                --config="terraformer.train.random_seed=$seed"
                --config="train/salient_extraction_stream.seed=$seed"
                ${short[@]+"${short[@]}"})
  for step in $steps; do
    banner "${row}_s$seed: to step $step (core $core)"
    once "$run/steps$step.done" taskset -c "$core" .venv/bin/terraformer-train \
      "${config[@]}" --config="terraformer.train.steps=$step" --output_dir="$run"
    for split in validation test; do
      into "$run/eval_${split}_$step.json" taskset -c "$core" \
        .venv/bin/python -m terraformer.cli.extraction_eval "${config[@]}" \
        --output_dir="$run" --split="$split" --batches="$batches"
    done
  done
}

# score_run CORE ROW:SEED: train_and_score on core CORE.
score_run() { train_and_score "$1" "${2%%:*}" "${2##*:}"; }
lanes score_run "${runs[@]}"

banner "step time and compiled memory at batch 16, $len tokens"
bench_files=()
for spec in "${all_rows[@]}"; do
  row=${spec%%|*}
  if wanted "$row"; then bench_files+=(--config_file="$G/$row.gin"); fi
done
repeats=3
[[ -z "$SHORT" ]] || repeats=1
into "$out/bench_$len.json" taskset -c "${cores[0]}" .venv/bin/terraformer-memory-bench \
  --input_lens="$len" "${bench_files[@]}" --batch_size=16 --target_len=17 \
  --repeats="$repeats" --json ${short[@]+"${short[@]}"}
bench=(--bench="$out/bench_$len.json")
if [[ -z "$SHORT" ]]; then
  banner "the same at 2048 tokens: linear 4x and its unpooled twin"
  into "$out/bench_2048.json" taskset -c "${cores[0]}" .venv/bin/terraformer-memory-bench \
    --input_lens=2048 --config_file="$G/linear_4x_2048.gin" \
    --config_file="$G/blockwise_2048.gin" --batch_size=16 --target_len=17 \
    --repeats=3 --json
  bench+=(--bench="$out/bench_2048.json")
fi

# row_spec ROW LABEL LEN: the table row `LABEL|ROW|LEN|runs` of its scored
# runs; a row with a run not scored at the last step goes into `missing`.
last=${steps##* }
missing=()
row_spec() {
  local row=$1 label=$2 length=$3 seed dirs=()
  for seed in $seeds; do
    if [[ -f "$out/${row}_s$seed/eval_test_$last.json" ]]; then
      dirs+=("$out/${row}_s$seed")
    elif [[ " ${missing[*]-} " != *" $row "* ]]; then
      missing+=("$row")
    fi
  done
  specs+=("--row=$label|$row|$length|$(IFS=,; echo "${dirs[*]-}")")
}
specs=()
for spec in "${all_rows[@]}"; do
  if wanted "${spec%%|*}"; then row_spec "${spec%%|*}" "${spec#*|}" "$len"; fi
done
exit_unless_complete ROWS
scorers=("${specs[@]}")
specs=()
if [[ -z "$SHORT" ]]; then
  row_spec linear_4x 'linear, 4x, 512 tokens' 512
  row_spec full 'no pooling (one block of 512), 512 tokens' 512
  if [[ -n "${QUALITY_2048:-}" ]]; then
    seeds=0 row_spec linear_4x_2048 'linear, 4x, 2048 tokens' 2048
    seeds=0 row_spec blockwise_2048 'no pooling, blocks of 512, 2048 tokens' 2048
  else
    specs+=('--row=linear, 4x, 2048 tokens|linear_4x_2048|2048|'
            '--row=no pooling, blocks of 512, 2048 tokens|blockwise_2048|2048|')
  fi
  exit_unless_complete QUALITY_2048
fi

banner "tables"
.venv/bin/python -m terraformer.cli.extraction_eval "${scorers[@]}" \
  "${bench[@]}" > "$out/scorers.json"
cat "$out/scorers.json"
if [[ -z "$SHORT" ]]; then
  .venv/bin/python -m terraformer.cli.extraction_eval "${specs[@]}" \
    "${bench[@]}" > "$out/length.json"
  cat "$out/length.json"
fi
if [[ -z "$SHORT" && ( "$selected" != '  ' || "$seeds" != '0 1' ||
      "$steps" != "$default_steps" ) ]]; then
  banner "done: a part of the experiment (ROWS, SEEDS or STEPS), not recorded"
  exit 0
fi
record --table="scorers=$out/scorers.json" --table="length=$out/length.json" \
  --caption="scorers=Salient-token extraction (512 tokens of aclsum paper bodies, 16 salient tokens after indexed markers; a length curriculum 64-256 tokens to step 5500, then 512), the test split (256 examples) at step $default_steps: mean (seed 0, seed 1). Recall: the share of salient positions (or, second column, of salient positions or their markers) among the first pooling's winners. Step and memory: the compiled gradient step at batch 16 (terraformer-memory-bench)." \
  --caption="length=The linear scorer pooling 4x and its unpooled twin at 512 and 2048 tokens (blocks of 512): gradient step time and compiled memory at batch 16; quality as in the scorers table (2048 tokens: seed 0, with QUALITY_2048=1)."
banner done "outputs in $out"
