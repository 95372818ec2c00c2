#!/usr/bin/env bash
# The decoding step's output-layer product at 17B dimensions
# (docs/decoding-speed.md): the dense [1, d] x [d, V] product beside the
# sparse loss's [S, d] x [d, V / S] (S times fewer weight bytes, the same
# multiply-adds), XLA float32, jitted as the decode step runs them, median of
# 7 (experiments/decode_output_layer.py).
#
# Cost: seconds on the 2-core CPU; needs a quiet machine.
# Short version: none (it takes seconds).
# Writes OUT/dot.json and results/decode_output_layer.json (table dot).
#   bash experiments/decode_output_layer.sh [OUT]
#   (OUT: runs/experiments/decode_output_layer)
NAME=decode_output_layer
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
banner "17B output layer: dense vs sparse loss product"
.venv/bin/python experiments/decode_output_layer.py --json="$out/dot.json"
tabulated+=(--table="dot=$out/dot.json")
record --command="bash experiments/decode_output_layer.sh" --caption="dot=The decoding step's output-layer product at 17B dimensions (d 9216, vocab 32100, S = 4), XLA float32, jitted, median of 7."
banner done "outputs in $out"
