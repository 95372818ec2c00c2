"""Tiny models trained for 2 steps with terraformer-train, for the decode and
eval CLI tests (session fixtures in conftest.py).

Each run is the repository's gin file plus bindings that shrink the model and
the data (inputs 64 tokens, targets 16, batch 2) on the offline papers and
the project's 2048-piece SentencePiece vocab.
"""
import contextlib
import io
import os
import re

from terraformer.cli import train as train_cli

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'gin')
INPUT_LEN, TARGET_LEN = 64, 16

_SEQ2SEQ_DATA = [
    f'seq2seq_stream.input_len = {INPUT_LEN}',
    f'seq2seq_stream.target_len = {TARGET_LEN}',
    'seq2seq_stream.batch_size = 2',
    'terraformer.train.eval_batches = 1',
]

ENCDEC = (os.path.join(GIN_DIR, 'tiny', 'encdec_sparse.gin'), [
    'ScalingTransformer.d_model = 32',
    'ScalingTransformer.d_ff = 64',
    'ScalingTransformer.n_encoder_layers = 1',
    'ScalingTransformer.n_decoder_layers = 1',
    'ScalingTransformer.d_lowrank = 4',
    'ScalingTransformer.ff_sparsity = 8',
    'ScalingTransformer.max_len = 128',
] + _SEQ2SEQ_DATA)

LM = (os.path.join(GIN_DIR, 'tiny', 'lm_sparse.gin'), [
    'ScalingTransformerLM.d_model = 32',
    'ScalingTransformerLM.d_ff = 64',
    'ScalingTransformerLM.n_layers = 1',
    'ScalingTransformerLM.d_lowrank = 4',
    'ScalingTransformerLM.ff_sparsity = 8',
    'ScalingTransformerLM.max_len = 64',
    'lm_stream.seq_len = 32',
    'lm_stream.batch_size = 2',
    'terraformer.train.eval_batches = 1',
])

# The Terraformer (LSH attention, reversible blocks, SRU) on the encoder-
# decoder data: LSH chunks of 16 divide the input (64) and input + target
# (80) lengths.
TERRAFORMER = (os.path.join(GIN_DIR, 'tiny', 'encdec_sparse.gin'), [
    'terraformer.train.model = @Terraformer',
    'Terraformer.input_vocab_size = %VOCAB_SIZE',
    'Terraformer.d_model = 32',
    'Terraformer.d_ff = 64',
    'Terraformer.n_heads = 2',
    'Terraformer.n_encoder_layers = 1',
    'Terraformer.n_decoder_layers = 1',
    'Terraformer.dropout = 0.0',
    'Terraformer.max_len = 128',
    'Terraformer.ff_sparsity = 8',
    'Terraformer.d_lowrank = 4',
    'Terraformer.lsh_chunk_len = 16',
    'Terraformer.predict_mem_len = 128',
    'Terraformer.predict_drop_len = 16',
    'Terraformer.d_sru = 8',
] + _SEQ2SEQ_DATA)


def config_args(run):
  """--config_file/--config arguments of a (gin file, bindings) pair."""
  gin_file, bindings = run
  return [f'--config_file={gin_file}'] + [f'--config={b}' for b in bindings]


def train(run, output_dir, steps=2):
  """Trains `run` with terraformer-train; returns its stdout."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code = train_cli.main(['terraformer-train', *config_args(run),
                           f'--output_dir={output_dir}', f'--steps={steps}'])
  assert code == 0, out.getvalue()
  return out.getvalue()


def last_eval_log_perplexity(train_stdout):
  """The eval log-perplexity that terraformer-train printed last."""
  values = re.findall(r'eval log_perplexity ([0-9.]+)', train_stdout)
  return float(values[-1])


def config_args_split(run):
  """(config files, bindings) of a run, as `config.parse_gin` takes them."""
  gin_file, bindings = run
  return [gin_file], list(bindings)
