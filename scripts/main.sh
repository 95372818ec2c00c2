#!/usr/bin/env bash
# The main job: trains a tiny sparse Scaling Transformer LM on the bundled
# papers (offline) and prints its eval log-perplexity as it falls. Rerunning
# resumes from the last checkpoint in the output directory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/env.sh"
cd "$root"
exec .venv/bin/terraformer-train --config_file=gin/tiny/lm_sparse.gin \
  --output_dir="${OUTPUT_DIR:-runs/tiny_lm_sparse}" "$@"
