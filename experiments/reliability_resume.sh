#!/usr/bin/env bash
# Exact resume when the resume step is also an eval step
# (docs/reliability.md): the sparse LM of gin/tiny/lm_sparse.gin shrunk to
# the smallest size that builds it, dropout 0.1 (every step draws from the
# loop's rng), evaluating every 3 steps and checkpointing every 2: 3 steps,
# then resumed to 6, against 6 straight; every weight, model state, optimizer
# slot and the rng must be bit-identical, and so must the train losses and
# eval metrics of steps 1, 3 and 6. It is the lm_sparse cell of the resume
# sweep (tests/training/test_resume_sweep.py), run alone; on failure it
# prints how many arrays it compared and how many differ, which
# results/reliability_resume.json (table resume) records from pytest's JUnit
# XML.
#
# Cost: about 0.05 core-hours on the 2-core CPU; any machine.
# Short version: none (this is the short one).
# Writes OUT/pytest.txt, OUT/junit.xml, OUT/resume.json and
# results/reliability_resume.json.
#   bash experiments/reliability_resume.sh [OUT]
#   (OUT: runs/experiments/reliability_resume)
NAME=reliability_resume
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

banner "3 + 3 steps vs 6, an eval at the resume step, dropout 0.1"
into "$out/pytest.txt" .venv/bin/python -m pytest -q -p no:cacheprovider \
  -o junit_logging=system-out --junitxml="$out/junit.xml" \
  'tests/training/test_resume_sweep.py::test_resume_equals_straight[tiny/lm_sparse.gin]'
tabulate pytest resume "$out/junit.xml" \
  --figure=now='tests/training/test_resume_sweep.py:printed (measured)'
record --caption="resume=gin/tiny/lm_sparse.gin shrunk, dropout 0.1, eval every 3 steps, checkpoint every 2: 3 + 3 steps against 6 straight, every weight, model state, optimizer slot and the rng compared, and the train losses and eval metrics of steps 1, 3 and 6 (tests/training/test_resume_sweep.py, its lm_sparse cell)."
banner done "outputs in $out"
