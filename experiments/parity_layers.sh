#!/usr/bin/env bash
# Every layer and model against the authors' Trax 1.4.1 code as the oracle
# (docs/parity.md): the equality tests on identical weights
# (tests/layers/test_trax_parity.py: layers in train mode with the same rng,
# eval and predict, and their gradients; tests/trax_bridge/
# test_checkpoint_import.py: whole models saved by Trax's own Loop, imported,
# eval logits and 8 greedy tokens x 2 rows compared, printing each model's
# max |delta logit|; tests/models/test_padding_independence.py). The
# tolerances are the tests' assertions; results/parity_layers.json (table
# parity) holds, per test file, the tests passed and the max |delta logit|
# the model tests print (from pytest's JUnit XML).
#
# Cost: about 0.2 core-hours on the 2-core CPU; any machine.
# Short version (the layer tests only; writes no results file):
#   SHORT=1 bash experiments/parity_layers.sh
# Writes OUT/pytest.txt, OUT/junit.xml (the tests' output with the printed
# deltas), OUT/parity.json and results/parity_layers.json.
#   bash experiments/parity_layers.sh [OUT]  (OUT: runs/experiments/parity_layers)
NAME=parity_layers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tests=(tests/layers/test_trax_parity.py tests/trax_bridge/test_checkpoint_import.py
       tests/models/test_padding_independence.py)
models=tests/trax_bridge/test_checkpoint_import.py
if [[ -n "$SHORT" ]]; then
  tests=(tests/layers/test_trax_parity.py)
  models=tests/layers/test_trax_parity.py
fi
banner "equality with Trax 1.4.1: ${tests[*]}"
into "$out/pytest.txt" .venv/bin/python -m pytest -q -p no:cacheprovider \
  -o junit_logging=system-out --junitxml="$out/junit.xml" "${tests[@]}"
tabulate pytest parity "$out/junit.xml" \
  --figure=layers='tests/layers/test_trax_parity.py:passed' \
  --figure=models="$models:passed"
record --caption="parity=The equality tests against Trax 1.4.1 on identical weights (Trax's random weights copied into ours, biases and controller logits pushed to order 1): layers in train mode with the same rng, eval and predict, and their gradients, within 1e-5 (tests/layers/test_trax_parity.py); whole models saved by Trax's own Loop, imported, their eval logits within 1e-4 and 8 greedy tokens x 2 rows identical (tests/trax_bridge/test_checkpoint_import.py, which prints each model's max |delta logit|); padding independence (tests/models/test_padding_independence.py). The tolerances are the tests' assertions."
banner done "outputs in $out"
