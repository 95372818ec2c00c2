#!/usr/bin/env bash
# Runs RUNS sequential 2-process x 2-CPU-device terraformer-train jobs on
# localhost (gin/tiny/soak.gin, 12 steps, checkpoint every 2) and counts the
# ones that hang (a process still running after 90 s is killed) or fail.
# Usage: bash scripts/multiprocess_stress.sh RUNS WORK_DIR
# The environment passes through (e.g. PJRT_NPROC=2 for the old thread pool).
set -uo pipefail
runs=${1:?RUNS}; work=${2:?WORK_DIR}; hangs=0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"; mkdir -p "$work"
for r in $(seq 1 "$runs"); do
  out="$work/run$r"; rm -rf "$out" "$out".p*.log; port=$((47600 + RANDOM % 700))
  start=$(date +%s)
  for i in 0 1; do
    XLA_FLAGS=--xla_force_host_platform_device_count=2 timeout -s KILL 90 \
      .venv/bin/python -m terraformer.cli.train --config_file=gin/tiny/soak.gin \
      --config=terraformer.train.random_seed=1 \
      --config=terraformer.train.checkpoint_every=2 --output_dir="$out" \
      --steps=12 --coordinator_address=127.0.0.1:$port --num_processes=2 \
      --process_id=$i > "$out.p$i.log" 2>&1 &
  done
  wait
  steps=$(grep -c '^step ' "$out.p0.log"); finished=$(grep -c '^Done' "$out.p0.log")
  if [[ "$steps" == 12 && "$finished" == 1 ]]; then result=ok; rm -rf "$out"
  else result=HANG; hangs=$((hangs + 1)); fi
  echo "run $r: $result, $steps progress lines, $(( $(date +%s) - start )) s"
done
echo "$hangs hangs of $runs runs (PJRT_NPROC=${PJRT_NPROC:-unset})"
