#!/usr/bin/env bash
# XLA's memory analysis of the compiled FSDP training step per device
# (docs/many-devices.md): `terraformer-info --devices=N --compiled` compiles
# the real step (ShardedTrainer, Adam) for N forced CPU devices from shapes
# only (nothing allocated), global batch 8 x 1024 tokens: the 800M dense
# Scaling Transformer on 1 device, the sparse FF+QKV+loss one on 1 and 8, and
# on 8 with terraformer.train.fsdp_gather_weights = True (every weight
# gathered whole at the start of the step, so that XLA splits the
# activations along the batch).
#
# Cost: about 0.6 core-hours on the 2-core CPU (compiling: 4-10 minutes per
# cell); any machine.
# Short version (1 + 1 layers of the sparse model on 8 devices; no results
# file): SHORT=1 bash experiments/many_devices_fsdp_memory.sh
# Writes OUT/<cell>.json (terraformer-info --json), OUT/compiled.json and
# results/many_devices_fsdp_memory.json (table compiled). Rerunning reuses
# the cells done.
#   bash experiments/many_devices_fsdp_memory.sh [OUT]
#   (OUT: runs/experiments/many_devices_fsdp_memory)
NAME=many_devices_fsdp_memory
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

gather=--config=terraformer.train.fsdp_gather_weights=True
# label|gin|devices|extra binding
cells=(
  '`gin/scaling_800m/dense.gin`|scaling_800m/dense|1|'
  '`gin/scaling_800m/sparse_ff_qkv_loss.gin`|scaling_800m/sparse_ff_qkv_loss|1|'
  '`gin/scaling_800m/sparse_ff_qkv_loss.gin`|scaling_800m/sparse_ff_qkv_loss|8|'
  '`gin/scaling_800m/sparse_ff_qkv_loss.gin`, `fsdp_gather_weights`|scaling_800m/sparse_ff_qkv_loss|8|'"$gather"
)
short=()
if [[ -n "$SHORT" ]]; then
  cells=("${cells[2]}")
  short=(--config=ScalingTransformer.n_encoder_layers=1
         --config=ScalingTransformer.n_decoder_layers=1)
fi
pairs=()
for cell in "${cells[@]}"; do
  IFS='|' read -r label config devices binding <<< "$cell"
  json="$out/${config//\//_}_${devices}${binding:+_gather}.json"
  banner "$label on $devices device(s): compiling the FSDP step"
  into "$json" .venv/bin/terraformer-info --config_file="gin/$config.gin" \
    --devices="$devices" --compiled --batch_size=8 --length=1024 --json \
    ${binding:+"$binding"} "${short[@]}"
  pairs+=("$label=$json")
done
tabulate compiled compiled "${pairs[@]}" \
  --columns='config,devices,arguments (weights + slots + batch),temporaries,peak'
record
banner done "outputs in $out"
