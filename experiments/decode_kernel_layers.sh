#!/usr/bin/env bash
# The fused decode kernels against XLA, layer by layer
# (docs/decoding-speed.md): each layer the kernels replace, at the 800M and
# 17B shapes, one token, random weights: XLA's float32 code and the kernel
# layer with float32, bfloat16 and int8 weights, called in turn in one
# process (median and min over 21 calls); x bound = the median over (weight
# bytes read / the GEMV bandwidth measured in the same process).
# `python -m terraformer.benchmarks.kernels` prints the table; it writes no
# JSON, so results/decode_kernel_layers.json (table layers) is transcribed
# from its output.
#
# Cost: about 0.1 core-hours on the 2-core CPU; needs a quiet machine.
# Short version (3 calls each; prints only): SHORT=1 bash experiments/decode_kernel_layers.sh
# Writes OUT/layers.txt.
#   bash experiments/decode_kernel_layers.sh [OUT]
#   (OUT: runs/experiments/decode_kernel_layers)
NAME=decode_kernel_layers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

repeats=21
[[ -n "$SHORT" ]] && repeats=3
banner "kernel vs XLA per layer, $repeats calls each"
into "$out/layers.txt" .venv/bin/python -m terraformer.benchmarks.kernels \
  --repeats="$repeats"
banner done "outputs in $out"
