#!/usr/bin/env bash
# Every layer and model against the authors' Trax 1.4.1 code as the oracle
# (docs/parity.md): the equality tests on identical weights
# (tests/layers/test_trax_parity.py: layers in train mode with the same rng,
# eval and predict, and their gradients; tests/trax_bridge/
# test_checkpoint_import.py: whole models saved by Trax's own Loop, imported,
# eval logits and 8 greedy tokens x 2 rows compared, printing each model's
# max |delta logit|; tests/models/test_padding_independence.py). The
# tolerances are the tests' assertions; results/parity_layers.json (table
# parity) holds them beside the max |delta| measured.
#
# Cost: about 0.2 core-hours on the 2-core CPU; any machine.
# Short version (the layer tests only; prints only):
#   SHORT=1 bash experiments/parity_layers.sh
# Writes OUT/pytest.txt (the tests' output with the printed deltas).
#   bash experiments/parity_layers.sh [OUT]  (OUT: runs/experiments/parity_layers)
NAME=parity_layers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tests=(tests/layers/test_trax_parity.py tests/trax_bridge/test_checkpoint_import.py
       tests/models/test_padding_independence.py)
[[ -n "$SHORT" ]] && tests=(tests/layers/test_trax_parity.py)
banner "equality with Trax 1.4.1: ${tests[*]}"
into "$out/pytest.txt" .venv/bin/python -m pytest -q -s -p no:cacheprovider \
  "${tests[@]}"
grep 'max |dlogit|' "$out/pytest.txt" || true
banner done "outputs in $out"
