#!/usr/bin/env bash
# The fused decode kernels against XLA, layer by layer
# (docs/decoding-speed.md): each layer the kernels replace, at the 800M and
# 17B shapes, one token, random weights: XLA's float32 code and the kernel
# layer with float32, bfloat16 and int8 weights, called in turn in one
# process (median and min over 21 calls); x bound = the median over (weight
# bytes read / the GEMV bandwidth measured in the same process). Then the
# compute-bound Q8 product (the 17B sparse QKV's multiplicative layer, 64
# rows) alone, on one thread, on each Q8 path the CPU has, against the peak
# multiply-add rate of that path's int8 instruction measured in the same
# process. `python -m terraformer.benchmarks.kernels --json` prints and
# writes the rows; the tables are made from its JSON.
#
# Cost: about 0.01 core-hours on the 2-core CPU (30 seconds); needs a quiet machine.
# Short version (3 calls each; prints only): SHORT=1 bash experiments/decode_kernel_layers.sh
# Writes OUT/kernels.txt and OUT/kernels.json (the CLI's), and the tables.
#   bash experiments/decode_kernel_layers.sh [OUT]
#   (OUT: runs/experiments/decode_kernel_layers)
NAME=decode_kernel_layers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

repeats=21
[[ -n "$SHORT" ]] && repeats=3
banner "kernel vs XLA per layer, $repeats calls each"
into "$out/kernels.txt" .venv/bin/python -m terraformer.benchmarks.kernels \
  --repeats="$repeats" --json="$out/kernels.json"
tabulate kernel_layers layers "$out/kernels.json" \
  --label=800m_loss='800M sparse loss [4,1024] x [1024,8025]' \
  --label=800m_ff='800M sparse FF block (d_ff 6144, N 64)' \
  --label=800m_dense_ff='800M dense FF [1024] x [1024,4096]' \
  --label=17b_loss='17B sparse loss [4,9216] x [9216,8025]' \
  --label=17b_dense_qkv='17B dense projection [9216] x [9216,9216]' \
  --label=17b_qkv_mult='17B sparse QKV multiplicative layer [64,9216] x [9216,144]' \
  --figure=loss_17b_q8_vs_xla='17B sparse loss [4,9216] x [9216,8025]:ffi q8 vs xla f32' \
  --figure=dense_17b_q8_vs_xla='17B dense projection [9216] x [9216,9216]:ffi q8 vs xla f32' \
  --figure=qkv_mult_17b_q8='17B sparse QKV multiplicative layer [64,9216] x [9216,144]:ffi q8 ms (x bound)'
tabulate kernel_products products "$out/kernels.json" \
  --label=17b_qkv_mult='17B sparse QKV multiplicative layer'
record --caption=products="The compute-bound Q8 product alone (activations quantized before the clock starts), one thread, median of $repeats calls, on each Q8 path this CPU has, against the peak multiply-add rate of that path's int8 instruction (VNNI's vpdpbusd, AVX2's maddubs + madd + add, a scalar multiply-add; registers only) measured in the same process; quiet machine." \
  --caption=layers="Each layer the kernels replace, one token, random weights: XLA's float32 code and the kernel layer with float32, bfloat16, int8 and q8 weights (q8: int8 activations too; the sparse FF block reads it as int8), called in turn in one process, median of $repeats calls (x bound: the median over the weight bytes read / the GEMV bandwidth measured in the same process); quiet machine."
banner done "outputs in $out"
