#!/usr/bin/env bash
# Does a 2-process job hang on a 2-core CPU? (docs/many-devices.md, "CPU
# thread pool"): sequential jobs of 2 processes x 2 forced CPU devices on
# localhost (terraformer-train, gin/tiny/soak.gin, 12 steps, checkpoint every
# 2), each process killed if still running after 90 s; a job that does not
# print its 12 progress lines and `Done` counts as a hang. First with the
# thread pool terraformer sets (PJRT_NPROC: 4 x the local devices when the
# machine has fewer cores), then with PJRT_NPROC=2, XLA's own pool here.
#
# Cost: about 0.7 core-hours on the 2-core CPU (30 + 10 jobs, 22-90 s each);
# any machine with 2 cores.
# Short version (2 + 2 jobs; no results file):
#   SHORT=1 bash experiments/many_devices_stress.sh
# Writes OUT/<pool>/run<k>.p{0,1}.log (hung jobs' folders are kept),
# OUT/<pool>.txt (a line per job and the count), OUT/stress.json and
# results/many_devices_stress.json (table stress). Rerunning reuses a pool's
# count when OUT/<pool>.txt exists.
#   bash experiments/many_devices_stress.sh [OUT]
#   (OUT: runs/experiments/many_devices_stress)
NAME=many_devices_stress
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stress_jobs() {  # stress_jobs N DIR: N 2-process jobs, one after another; counts hangs.
  local n=$1 dir=$2 hangs=0 r i port start steps finished result
  mkdir -p "$dir"
  for r in $(seq 1 "$n"); do
    rm -rf "$dir/run$r" "$dir/run$r".p*.log
    port=$((47600 + RANDOM % 700))
    start=$(date +%s)
    for i in 0 1; do
      XLA_FLAGS=--xla_force_host_platform_device_count=2 timeout -s KILL 90 \
        .venv/bin/terraformer-train --config_file=gin/tiny/soak.gin \
        --config=terraformer.train.random_seed=1 \
        --config=terraformer.train.checkpoint_every=2 \
        --output_dir="$dir/run$r" --steps=12 \
        --coordinator_address=127.0.0.1:$port --num_processes=2 \
        --process_id=$i > "$dir/run$r.p$i.log" 2>&1 &
    done
    wait || true
    steps=$(grep -c '^step ' "$dir/run$r.p0.log" || true)
    finished=$(grep -c '^Done' "$dir/run$r.p0.log" || true)
    if [[ "$steps" == 12 && "$finished" == 1 ]]; then
      result=ok
      rm -rf "$dir/run$r"
    else
      result=HANG
      hangs=$((hangs + 1))
    fi
    echo "run $r: $result, $steps progress lines, $(( $(date +%s) - start )) s"
  done
  echo "$hangs hangs of $n runs"
}

n_fixed=30 n_old=10
[[ -n "$SHORT" ]] && n_fixed=2 n_old=2
banner "$n_fixed jobs, terraformer's thread pool"
into "$out/fixed.txt" env -u PJRT_NPROC -u NPROC bash -c \
  "$(declare -f stress_jobs); stress_jobs $n_fixed '$out/fixed'"
banner "$n_old jobs, PJRT_NPROC=2"
into "$out/nproc2.txt" env PJRT_NPROC=2 bash -c \
  "$(declare -f stress_jobs); stress_jobs $n_old '$out/nproc2'"
row() {  # row LABEL FILE: the table row of one pool.
  local times
  times=$(grep -o ', [0-9]* s$' "$2" | tr -dc '0-9\n' | sort -n | sed -n '1p;$p' | paste -sd-)
  printf '["%s", "%s", "%s s"]' "$1" "$(tail -n 1 "$2")" "$times"
}
printf '{"columns": ["thread pool", "hangs", "seconds per job (min-max)"], "rows": [%s, %s]}\n' \
  "$(row '4 threads per device (PJRT_NPROC=8)' "$out/fixed.txt")" \
  "$(row 'PJRT_NPROC=2' "$out/nproc2.txt")" > "$out/stress.json"
record --table=stress="$out/stress.json"
banner done "outputs in $out"
