#!/usr/bin/env bash
# Per-device memory plans of FSDP training (docs/many-devices.md): weights,
# Adam's two slots and an activation estimate (the residual stream of every
# block, batch 8 x 1024 tokens x d_model floats) per device, from shapes only
# (`terraformer-info --devices=N`), for the 17B Terraformer
# (gin/terraformer/17b.gin) on 1, 8 and 64 devices, the 800M Terraformer
# (gin/terraformer/c4_800m.gin) on 1 and 8, and the 800M sparse FF+QKV+loss
# Scaling Transformer on 1, 8 and 64.
#
# Cost: about 0.1 core-hours on the 2-core CPU (nothing is run); any machine.
# Short version (the 800M Terraformer on 8 devices; no results file):
#   SHORT=1 bash experiments/many_devices_memory_plan.sh
# Writes OUT/<config>_<N>.json (terraformer-info --json), OUT/plan.json and
# results/many_devices_memory_plan.json (table plan). Rerunning reuses them.
#   bash experiments/many_devices_memory_plan.sh [OUT]
#   (OUT: runs/experiments/many_devices_memory_plan)
NAME=many_devices_memory_plan
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cells=(terraformer/17b:1 terraformer/17b:8 terraformer/17b:64
       terraformer/c4_800m:1 terraformer/c4_800m:8
       scaling_800m/sparse_ff_qkv_loss:1 scaling_800m/sparse_ff_qkv_loss:8
       scaling_800m/sparse_ff_qkv_loss:64)
[[ -n "$SHORT" ]] && cells=(terraformer/c4_800m:8)
pairs=()
for cell in "${cells[@]}"; do
  config=${cell%:*} devices=${cell#*:}
  json="$out/${config//\//_}_$devices.json"
  banner "gin/$config.gin on $devices device(s)"
  into "$json" .venv/bin/terraformer-info --config_file="gin/$config.gin" \
    --devices="$devices" --batch_size=8 --length=1024 --json
  pairs+=("\`gin/$config.gin\`=$json")
done
tabulate plan plan "${pairs[@]}"
record
banner done "outputs in $out"
