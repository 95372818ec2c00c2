#!/usr/bin/env bash
# The main job, offline on the papers bundled with `aclsum` (settings in
# gin/main/):
#   1. (only with STAGES naming it) pretrain a tiny Terraformer with
#      single-word masking (T5 sentinels) on the paper bodies of the train
#      split                                        -> $OUTPUT_DIR/pretrain
#   2. train it body -> abstract on the train papers (from the pretraining
#      checkpoint when stage 1 runs)                -> $OUTPUT_DIR/finetune
#   3. summarize held-out test papers, print ROUGE beside the extractive
#      baselines on the same papers (lead-3, lead-k matched to the abstract's
#      length, 3 random sentences), fluency figures and one summary
#   4. time dense vs sparse decoding (batch 1)      -> $OUTPUT_DIR/bench.txt
# At this budget (~400 training steps) pretraining costs more than it gives:
# experiments/main_job_tuning.sh compares the settings on validation papers.
# Rerunning resumes: training continues from the last checkpoint in its
# directory (or says it is done), evaluation is skipped while its output is
# newer than the fine-tuned checkpoint, the benchmark while bench.txt exists.
#
# Environment: OUTPUT_DIR (default runs/main); STAGES (default
# "finetune eval bench": run only these; "pretrain finetune eval bench" for
# the paper's pretrain-then-fine-tune recipe); BENCH_ARGS (default
# "--tokens=16 --repeats=3"). Extra arguments go to both terraformer-train
# stages (e.g. --steps=N); the gin ones (--config=..., --config_file=...) to
# terraformer-eval too.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"

out="${OUTPUT_DIR:-runs/main}"
stages=" ${STAGES:-finetune eval bench} "
read -r -a bench_args <<< "${BENCH_ARGS:---tokens=16 --repeats=3}"
train_args=("$@")
gin_args=()
for arg in "$@"; do
  case "$arg" in --config=*|--config_file=*) gin_args+=("$arg") ;; esac
done
mkdir -p "$out"

banner() {
  printf '\n=== [%s] stage %s: %s ===\n' "$(date +%H:%M:%S)" "$1" "$2"
}
wants() { [[ "$stages" == *" $1 "* ]]; }

if wants pretrain; then
  banner 1/4 "pretrain (masked words) on the train papers' bodies -> $out/pretrain"
  .venv/bin/terraformer-train --config_file=gin/main/pretrain.gin \
    --output_dir="$out/pretrain" ${train_args[@]+"${train_args[@]}"}
fi

if wants finetune; then
  init=()
  if wants pretrain; then
    banner 2/4 "train body -> abstract from $out/pretrain -> $out/finetune"
    init=(--config="INIT_CHECKPOINT = '$out/pretrain'")
  else
    banner 2/4 "train body -> abstract -> $out/finetune"
  fi
  .venv/bin/terraformer-train --config_file=gin/main/finetune.gin \
    ${init[@]+"${init[@]}"} --output_dir="$out/finetune" \
    ${train_args[@]+"${train_args[@]}"}
fi

if wants eval; then
  banner 3/4 "summarize held-out test papers, ROUGE beside lead-3, lead-k matched, random sentences"
  log="$out/finetune/eval_test.txt"
  if [[ -f "$log" && "$log" -nt "$out/finetune/model.pkl.gz" ]]; then
    echo "(up to date: $log)"
    cat "$log"
  else
    .venv/bin/terraformer-eval --config_file=gin/main/finetune.gin \
      --output_dir="$out/finetune" --print_examples=1 \
      ${gin_args[@]+"${gin_args[@]}"} > "$log.tmp"
    mv "$log.tmp" "$log"
    cat "$log"
  fi
fi

if wants bench; then
  banner 4/4 "decoding speed, dense vs sparse (batch 1)"
  log="$out/bench.txt"
  if [[ -f "$log" ]]; then
    echo "(done before: $log; delete it to rerun)"
  else
    .venv/bin/terraformer-bench --config_file=gin/main/bench_dense.gin \
      --config_file=gin/main/bench_sparse.gin "${bench_args[@]}" > "$log.tmp"
    mv "$log.tmp" "$log"
  fi
  cat "$log"
fi
banner done "outputs in $out"
