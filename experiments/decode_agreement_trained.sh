#!/usr/bin/env bash
# What the fused kernels and bf16 / int8 / Q8 weights do to a trained model's
# greedy decode (docs/decoding-speed.md): the main job's model, trained as
# `bash scripts/main.sh` trains it (STAGES=finetune: 400 steps body ->
# abstract), decoded by every kernel and storage variant, each fed XLA
# float32's 64 greedy tokens for the first test paper's opening (512 tokens):
# max |delta logit| and greedy agreement (`terraformer-bench --agreement
# --checkpoint --prompt_file --variants`). The model's decoder attends with
# LSH; a second pass decodes the same weights with full decoder attention
# (Terraformer.decoder_attention_type = 'full'), the attention whose 'q8'
# step makes a decoder block one kernel call (tf_terraformer_block), each
# variant against XLA float32 of that model.
#
# Cost: about 0.15 core-hours on the 2-core CPU (the training ~6 minutes, the
# agreement ~3); any machine (nothing timed; run it on one core: taskset -c 1).
# Short version (3 training steps, 4 tokens; no results file):
#   SHORT=1 bash experiments/decode_agreement_trained.sh
# Writes OUT/main/finetune (the checkpoint), OUT/paper.txt,
# OUT/agreement{,_full}.{txt,json} and results/decode_agreement_trained.json
# (tables variants, variants_full). Rerunning resumes
# the training and reuses OUT/agreement.txt (delete it to rerun).
#   bash experiments/decode_agreement_trained.sh [OUT]
#   (OUT: runs/experiments/decode_agreement_trained)
NAME=decode_agreement_trained
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tokens=64
train_args=()
if [[ -n "$SHORT" ]]; then
  tokens=4
  train_args=(--steps=3)
fi
banner "the main job's training -> $out/main/finetune"
OUTPUT_DIR="$out/main" STAGES=finetune bash scripts/main.sh ${train_args[@]+"${train_args[@]}"}
.venv/bin/python -c "from terraformer.evaluation import rouge; open('$out/paper.txt', 'w').write(rouge.paper_pairs('test')[0][0])"
# agreement FILE VARIANTS [ARGS...]: every variant vs XLA float32 over
# $tokens tokens of the paper's opening -> $out/FILE.{txt,json}.
agreement() {
  local file=$1 variants=$2
  shift 2
  into "$out/$file.txt" .venv/bin/terraformer-bench --agreement \
    --checkpoint="$out/main/finetune" --config_file=gin/main/finetune.gin \
    "$@" --variants="$variants" \
    --prompt_file="$out/paper.txt" --prompt_len=512 --tokens="$tokens" \
    --json="$out/$file.json"
}
# The docs' columns: the decode path (the model's label) and its agreement.
columns=(--columns="model,max |delta logit| vs the first,greedy agreement ($tokens tokens)"
         --rename='model=decode path')
banner "every kernel and storage variant vs XLA float32, $tokens tokens"
agreement agreement xla,ffi,ffi:bfloat16,ffi:int8,ffi:q8,xla:q8
tabulate agreement variants "$out/agreement.json" "${columns[@]}" \
  --label=finetune+xla='XLA, float32 (reference)' \
  --label=finetune+ffi='kernels, float32' \
  --label=finetune+ffi_bfloat16='kernels, bf16 weights' \
  --label=finetune+ffi_int8='kernels, int8 weights' \
  --label=finetune+ffi_q8='kernels, Q8 weights' \
  --label=finetune+xla_q8='XLA, Q8 weights' \
  --figure=int8_agreement="kernels, int8 weights:greedy agreement ($tokens tokens)" \
  --figure=q8_agreement="kernels, Q8 weights:greedy agreement ($tokens tokens)"
banner "the same, full decoder attention (one kernel call per block in Q8)"
agreement agreement_full xla,ffi,ffi:q8,xla:q8 \
  --config="Terraformer.decoder_attention_type='full'"
tabulate agreement variants_full "$out/agreement_full.json" "${columns[@]}" \
  --label=finetune+xla='XLA, float32 (reference)' \
  --label=finetune+ffi='kernels, float32' \
  --label=finetune+ffi_q8='kernels, Q8 weights (a block per call)' \
  --label=finetune+xla_q8='XLA, Q8 weights' \
  --figure=block_q8_agreement="kernels, Q8 weights (a block per call):greedy agreement ($tokens tokens)"
record --caption=variants_full="The same weights decoded with full decoder attention instead of LSH (Terraformer.decoder_attention_type = 'full': the attention of the 17B Terraformer, whose 'q8' decoder blocks are one tf_terraformer_block call each), every decode path fed that model's XLA float32 greedy tokens." \
  --caption=variants="The main job's model (1.14M parameters, 400 steps body -> abstract), every decode path fed the XLA float32 model's 64 greedy tokens for the first test paper's opening (512 tokens)."
banner done "outputs in $out"
