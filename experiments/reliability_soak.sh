#!/usr/bin/env bash
# The kill -9 soak of crash-safe training (docs/reliability.md;
# terraformer/training/soak.py): trains the tiny LM of gin/tiny/soak.gin
# 1500 steps uninterrupted (the reference), then trains it again in another
# folder, SIGKILLs it 50 times a random 0-4 s after its first progress line
# (checkpoint every 5 steps, so many kills land mid-save) and restarts it
# after each kill; checks every restart (resumed from the newest committed
# checkpoint on disk at the kill, at most one checkpoint interval lost, no
# traceback) and, at the end, that the weights, optimizer slots and last
# progress line equal the reference's. Extra arguments go to the soak, e.g.
# --random_draws (sparse FF, QKV and loss with dropout 0.1: every step draws
# from the loop's rng) or --config=BINDING.
#
# Cost: about 0.7 core-hours on the 2-core CPU (21 minutes); any machine.
# Short version (2 kills, 60 steps; no results file):
#   SHORT=1 bash experiments/reliability_soak.sh
# Writes OUT/{reference,run} (the two trainings), OUT/soak.txt (a line per
# kill and the summary), OUT/soak.json and results/reliability_soak.json
# (table soak). The soak starts over when run again unless OUT/soak.txt
# exists (delete it to soak again).
#   bash experiments/reliability_soak.sh [OUT] [SOAK FLAGS...]
#   (OUT: runs/experiments/reliability_soak)
NAME=reliability_soak
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
shift $(( $# > 0 ? 1 : 0 ))

size=(--kills=50 --steps=1500 --checkpoint_every=5 --max_delay=4)
[[ -n "$SHORT" ]] && size=(--kills=2 --steps=60 --checkpoint_every=5 --max_delay=4)
banner "soak: ${size[*]} $*"
into "$out/soak.txt" .venv/bin/python -m terraformer.training.soak \
  --work_dir="$out" "${size[@]}" "$@"
summary=$(grep '^soak: ' "$out/soak.txt" | tail -n 1)
row=$(sed -E 's/^soak: ([0-9]+) kills \(([0-9]+) mid-save\), ([0-9]+) clean resumes, steps lost max ([0-9]+) mean ([0-9.]+) \(checkpoint interval ([0-9]+)\), final weights and slots (bit-identical|DIFFERENT)[a-z ]* the uninterrupted run.*final eval line ([A-Za-z]+), ([0-9]+) failure.*$/"\1", "\2", "\3", "\4 \/ \5 (interval \6)", "\7", "\8", "\9"/' <<< "$summary")
printf '{"columns": ["kills", "of them mid-save", "clean resumes", "steps lost, max / mean", "final weights and slots vs the run never resumed", "final eval line", "failures"], "rows": [[%s]]}\n' \
  "$row" > "$out/soak.json"
record --table=soak="$out/soak.json"
banner done "outputs in $out"
