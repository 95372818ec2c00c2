#!/usr/bin/env bash
# The main job's long setting and its curve of ROUGE against CPU-hours, beside
# lead-3, lead-k matched and random-3 on the same papers:
#   1. masked-word pretraining (gin/main/pretrain.gin: the train papers'
#      bodies, T5 sentinels) in chunks of 1000 steps until its plateau: the
#      validation log-perplexity (10 batches, every 250 steps) falls less than
#      0.05 over the last chunk, or 5000 steps (~1.2 core-hours);
#   2. fine-tuning body -> abstract (gin/main/finetune.gin) from the plateau's
#      checkpoint, seeds 0 and 1, and from scratch (seed 0, the yardstick of
#      what pretraining buys), in chunks of 100 steps: after each chunk the
#      checkpoint is summarized on the 25 validation and the 27 test papers
#      (as the main job decodes: T = 0.5, no repeated token trigram), and
#      fine-tuning stops 3 evaluations after the best validation ROUGE-2
#      (early stopping), or at 2000 steps. The step is chosen on validation
#      only; test scores are reported for every step, never chosen on.
#   3. the curve: every evaluated step at the CPU-hours (user + sys, from
#      /usr/bin/time) of its training so far, pretraining included ->
#      tensorboard_exports/main_job_long/ (rouge2_vs_cpu_hours.png,
#      points.csv, the pretraining's exported curves) and
#      results/main_job_long.json.
#
# Cost: about 2 core-hours on the 2-core CPU (the pretraining 1.2, each
# fine-tuning run 0.1-0.25 and ~10 minutes of evaluations); no timing, any
# machine (run it on one core: taskset -c 1). RUNS="seed0" (or seed1, scratch) runs only those
# fine-tunings (two at once on two cores, after the pretraining finished);
# only the call with every run records.
# Short version (chunks of 4 / 3 steps, 1 + 1 layers, 2 papers per split; no
# results file): SHORT=1 bash experiments/main_job_long.sh
# Writes OUT/pretrain, OUT/finetune_{seed0,seed1,scratch} (each with its
# eval_<split>_step<N>.json), OUT/cpu_seconds.txt, OUT/points.json.
# Rerunning resumes: a finished chunk or evaluation is skipped, training
# continues from its last checkpoint.
#   bash experiments/main_job_long.sh [OUT]  (OUT: runs/experiments/main_job_long)
NAME=main_job_long
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

chunk=1000 max_pre=5000 eval_every=250 min_drop=0.05
ft_chunk=100 max_ft=2000 patience=3
common=()
eval_args=(--method=sample --temperature=0.5 --no_repeat_ngram=3)
export_dir=tensorboard_exports/main_job_long
if [[ -n "$SHORT" ]]; then
  chunk=4 max_pre=8 eval_every=2 min_drop=100 ft_chunk=3 max_ft=9 patience=1
  common=('--config=Terraformer.n_encoder_layers = 1' '--config=Terraformer.n_decoder_layers = 1'
          '--config=INPUT_LEN = 128' '--config=TARGET_LEN = 64')
  eval_args+=(--max_examples=2 --batch_size=2)
  export_dir="$out/export"
fi
all_runs="seed0 seed1 scratch"
runs="${RUNS:-$all_runs}"
cpu="$out/cpu_seconds.txt"

# train STAGE STEPS ARGS...: terraformer-train to STEPS, its CPU time in $cpu.
train() {
  local stage=$1 steps=$2
  shift 2
  /usr/bin/time -f "$stage $steps %e %U %S" -a -o "$cpu" \
    .venv/bin/terraformer-train "$@" "--config=terraformer.train.steps = $steps" \
    ${common[@]+"${common[@]}"} >> "$out/$stage.log" 2>&1
  grep '^step ' "$out/$stage.log" | tail -1
}

pre=0
while [[ " $runs " == *" seed"* ]]; do
  pre=$((pre + chunk))
  banner "pretrain (masked words) to step $pre -> $out/pretrain"
  once "$out/pretrain/chunk_$pre.done" train pretrain "$pre" \
    --config_file=gin/main/pretrain.gin --output_dir="$out/pretrain" \
    "--config=terraformer.train.eval_every = $eval_every" \
    '--config=terraformer.train.eval_batches = 10' \
    "--config=terraformer.train.checkpoint_every = $eval_every" \
    "--config=terraformer.train.permanent_checkpoint_every = $((chunk / 2))"
  (( pre < max_pre )) || break
  if (( pre > chunk )) && .venv/bin/python experiments/long_setting.py plateau \
      --logdir="$out/pretrain" --step="$pre" --window="$chunk" \
      --min_drop="$min_drop"; then
    break
  fi
done

for run in $runs; do
  dir="$out/finetune_$run"
  args=(--config_file=gin/main/finetune.gin --output_dir="$dir"
        "--config=terraformer.train.eval_every = $ft_chunk"
        "--config=terraformer.train.checkpoint_every = $ft_chunk")
  case "$run" in
    seed*) args+=("--config=INIT_CHECKPOINT = '$out/pretrain'"
                  "--config=terraformer.train.random_seed = ${run#seed}") ;;
    scratch) ;;
    *) echo "main_job_long.sh: unknown run $run (RUNS: $all_runs)" >&2; exit 2 ;;
  esac
  ft=0
  while (( ft < max_ft )); do
    ft=$((ft + ft_chunk))
    banner "fine-tune $run to step $ft -> $dir"
    once "$dir/chunk_$ft.done" train "finetune_$run" "$ft" "${args[@]}"
    for split in validation test; do
      if [[ ! -f "$dir/eval_${split}_step$ft.json" ]]; then
        .venv/bin/terraformer-eval --config_file=gin/main/finetune.gin \
          ${common[@]+"${common[@]}"} --output_dir="$dir" --split="$split" \
          "${eval_args[@]}" > "$dir/eval_${split}_step$ft.txt"
      fi
    done
    grep -A 1 '^F1' "$dir/eval_validation_step$ft.txt" || true
    if .venv/bin/python experiments/long_setting.py early_stop --dir="$dir" \
        --patience="$patience"; then
      break
    fi
  done
done

if [[ "$runs" != "$all_runs" ]]; then
  echo "(RUNS=$runs: the curve and the results wait for the call with every run)"
  exit 0
fi
banner "the curve -> $export_dir"
mkdir -p "$export_dir"
.venv/bin/terraformer-export --logdir="$out/pretrain" --label='masked-word pretraining' \
  --out="$export_dir/pretrain" --metrics='^eval/'
.venv/bin/python experiments/long_setting.py curve --cpu="$cpu" --out="$out/points.json" \
  --plot="$export_dir/rouge2_vs_cpu_hours.png" --csv="$export_dir/points.csv" \
  --run="pretrained, seed 0=$out/finetune_seed0" \
  --run="pretrained, seed 1=$out/finetune_seed1" \
  --run="from scratch, seed 0=$out/finetune_scratch" \
  --from_scratch="from scratch, seed 0"
tabulate curve curve "$out/points.json" \
  --figure=seed0_test_rouge2="pretrained, seed 0, chosen on validation:test ROUGE-2" \
  --figure=seed1_test_rouge2="pretrained, seed 1, chosen on validation:test ROUGE-2" \
  --figure=scratch_test_rouge2="from scratch, seed 0, chosen on validation:test ROUGE-2" \
  --figure=seeds_test_rouge2="pretrained, seed 0, chosen on validation|pretrained, seed 1, chosen on validation:test ROUGE-2" \
  --figure=seed0_cpu_hours="pretrained, seed 0, chosen on validation:CPU-hours" \
  --figure=lead3_test_rouge2="lead-3:test ROUGE-2"
record --caption=curve="Masked-word pretraining to its plateau, then fine-tuning body -> abstract with early stopping on validation ROUGE-2 (every 100 steps, patience 3); each evaluated step on the 25 validation and 27 test papers (T = 0.5, no repeated token trigram; ROUGE F1 %, rouge-score stemmed), at the CPU-hours of its training so far (pretraining included), beside the extractive yardsticks on the same papers."
banner done "outputs in $out, curve in $export_dir"
