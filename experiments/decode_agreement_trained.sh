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
# Quality as 8-bit CPU runtimes report it (`terraformer-bench --quality`):
# every path teacher-forced on the reference abstracts of the 27 test papers
# (inputs 512 tokens, targets cut to 128 as in training): log-perplexity of
# the references, mean KL divergence to XLA float32's next-token
# distributions, share of positions with its top token; with LSH and with
# full decoder attention.
#
# Cost: about 0.3 core-hours on the 2-core CPU (the training ~8 minutes, the
# agreement ~3, the quality ~8); any machine (nothing timed; run it on one
# core: taskset -c 1).
# Short version (3 training steps, 4 tokens, 2 papers; no results file):
#   SHORT=1 bash experiments/decode_agreement_trained.sh
# Writes OUT/main/finetune (the checkpoint), OUT/paper.txt,
# OUT/agreement{,_full}.{txt,json}, OUT/quality{,_full}.{txt,json} and
# results/decode_agreement_trained.json (tables variants, variants_full,
# quality, quality_full). Rerunning resumes the training and reuses
# OUT/agreement.txt and OUT/quality.txt (delete them to rerun).
#   bash experiments/decode_agreement_trained.sh [OUT]
#   (OUT: runs/experiments/decode_agreement_trained)
NAME=decode_agreement_trained
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

tokens=64
train_args=()
papers=()
if [[ -n "$SHORT" ]]; then
  tokens=4
  train_args=(--steps=3)
  papers=(--max_examples=2)
fi
banner "the main job's training -> $out/main/finetune"
OUTPUT_DIR="$out/main" STAGES=finetune bash scripts/main.sh ${train_args[@]+"${train_args[@]}"}
.venv/bin/python -c "from terraformer.evaluation import rouge; open('$out/paper.txt', 'w').write(rouge.paper_pairs('test')[0][0])"
# compare MODE FILE VARIANTS [ARGS...]: terraformer-bench --MODE of every
# variant against XLA float32, the trained weights -> $out/FILE.{txt,json}.
compare() {
  local mode=$1 file=$2 variants=$3
  shift 3
  into "$out/$file.txt" .venv/bin/terraformer-bench --"$mode" \
    --checkpoint="$out/main/finetune" --config_file=gin/main/finetune.gin \
    "$@" --variants="$variants" --json="$out/$file.json"
}
# agreement FILE VARIANTS [ARGS...]: over $tokens tokens of the paper's
# opening.
agreement() {
  compare agreement "$@" --prompt_file="$out/paper.txt" --prompt_len=512 \
    --tokens="$tokens"
}
# Each variant's label in the docs' tables (LSH; full decoder attention).
labels=(--label=finetune+xla='XLA, float32 (reference)'
        --label=finetune+ffi='kernels, float32'
        --label=finetune+ffi_bfloat16='kernels, bf16 weights'
        --label=finetune+ffi_int8='kernels, int8 weights'
        --label=finetune+ffi_q8='kernels, Q8 weights'
        --label=finetune+xla_q8='XLA, Q8 weights')
full_labels=(--label=finetune+xla='XLA, float32 (reference)'
             --label=finetune+ffi='kernels, float32'
             --label=finetune+ffi_q8='kernels, Q8 weights (a block per call)'
             --label=finetune+xla_q8='XLA, Q8 weights')
# The docs' columns: the decode path (the model's label) and its agreement.
columns=(--columns="model,max |delta logit| vs the first,greedy agreement ($tokens tokens)"
         --rename='model=decode path')
banner "every kernel and storage variant vs XLA float32, $tokens tokens"
agreement agreement xla,ffi,ffi:bfloat16,ffi:int8,ffi:q8,xla:q8
tabulate agreement variants "$out/agreement.json" "${columns[@]}" \
  "${labels[@]}" \
  --figure=int8_agreement="kernels, int8 weights:greedy agreement ($tokens tokens)" \
  --figure=q8_agreement="kernels, Q8 weights:greedy agreement ($tokens tokens)"
banner "the same, full decoder attention (one kernel call per block in Q8)"
agreement agreement_full xla,ffi,ffi:q8,xla:q8 \
  --config="Terraformer.decoder_attention_type='full'"
tabulate agreement variants_full "$out/agreement_full.json" "${columns[@]}" \
  "${full_labels[@]}" \
  --figure=block_q8_agreement="kernels, Q8 weights (a block per call):greedy agreement ($tokens tokens)"
# quality FILE VARIANTS [ARGS...]: teacher-forced on the test papers'
# abstracts.
quality() {
  compare quality "$@" --split=test ${papers[@]+"${papers[@]}"}
}
quality_columns=(--columns='model,log-perplexity,delta vs the first,mean KL vs the first,same top token'
                 --rename='model=decode path')
banner "quality: every path teacher-forced on the test papers' abstracts"
quality quality xla,ffi,ffi:bfloat16,ffi:int8,ffi:q8,xla:q8
tabulate quality quality "$out/quality.json" "${quality_columns[@]}" \
  "${labels[@]}" \
  --figure=q8_log_perplexity_delta='kernels, Q8 weights:delta vs the first' \
  --figure=q8_mean_kl='kernels, Q8 weights:mean KL vs the first' \
  --figure=q8_same_top_token='kernels, Q8 weights:same top token'
banner "quality with full decoder attention"
quality quality_full xla,ffi,ffi:q8,xla:q8 \
  --config="Terraformer.decoder_attention_type='full'"
tabulate quality quality_full "$out/quality_full.json" "${quality_columns[@]}" \
  "${full_labels[@]}" \
  --figure=block_q8_log_perplexity_delta='kernels, Q8 weights (a block per call):delta vs the first'
record --caption=quality="Quality as 8-bit CPU runtimes report it: the main job's model teacher-forced on the reference abstracts of the 27 test papers (inputs 512 tokens, targets cut to 128 as in training; terraformer-bench --quality), every decode path's log-perplexity of the references (nats per token) and, against XLA float32, its change, the mean KL divergence KL(float32 || path) of the next-token distributions (nats per position) and the share of positions with float32's top token." \
  --caption=quality_full="The same with full decoder attention (Terraformer.decoder_attention_type = 'full'), each path against that model's XLA float32." \
  --caption=variants_full="The same weights decoded with full decoder attention instead of LSH (Terraformer.decoder_attention_type = 'full': the attention of the 17B Terraformer, whose 'q8' decoder blocks are one tf_terraformer_block call each), every decode path fed that model's XLA float32 greedy tokens." \
  --caption=variants="The main job's model (1.14M parameters, 400 steps body -> abstract), every decode path fed the XLA float32 model's 64 greedy tokens for the first test paper's opening (512 tokens)."
banner done "outputs in $out"
