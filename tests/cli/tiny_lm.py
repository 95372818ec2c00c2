"""A tiny LM config for CLI tests: a gin-registered synthetic stream.

Gin files load it with `import tiny_lm` (tests/cli must be on sys.path).
"""
import gin
import numpy as np

from terraformer import errors

VOCAB = 32
D_MODEL, D_FF, N_LAYERS, MAX_LEN = 16, 32, 1, 64


@gin.configurable(module='tiny_lm')
def counting_stream(batch_size=4, length=16, seed=0, empty=False):
  """Rows count up mod VOCAB from a random start; `empty` is a user error."""
  if empty:
    raise errors.TerraformerError('corpus is empty')
  rng = np.random.RandomState(seed)
  while True:
    start = rng.randint(0, VOCAB, size=(batch_size, 1))
    x = ((start + np.arange(length)[None]) % VOCAB).astype(np.int32)
    yield x, x, np.ones_like(x, np.float32)


CONFIG = f"""
import tiny_lm

terraformer.train.model = @trax.models.TransformerLM
TransformerLM.vocab_size = {VOCAB}
TransformerLM.d_model = {D_MODEL}
TransformerLM.d_ff = {D_FF}
TransformerLM.n_layers = {N_LAYERS}
TransformerLM.n_heads = 2
TransformerLM.max_len = {MAX_LEN}
TransformerLM.dropout = 0.0

terraformer.train.train_stream = @train/counting_stream
terraformer.train.eval_stream = @eval/counting_stream
eval/counting_stream.seed = 1

multifactor.factors = 'constant'
multifactor.constant = 0.01

terraformer.train.steps = 100
terraformer.train.eval_every = 1
terraformer.train.eval_batches = 1
terraformer.train.checkpoint_every = 100
terraformer.train.random_seed = 0

count_parameters.length = 16
"""


def transformer_lm_params(vocab=VOCAB, d_model=D_MODEL, d_ff=D_FF,
                          n_layers=N_LAYERS, max_len=MAX_LEN):
  """Parameters of trax.models.TransformerLM, by layer class, by hand."""
  d = d_model
  dense_per_layer = 4 * (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)
  return {
      'Embedding': vocab * d,
      'PositionalEncoding': max_len * d,  # Trax stores the table as weights.
      'LayerNorm': (2 * n_layers + 1) * 2 * d,
      'Dense': n_layers * dense_per_layer + d * vocab + vocab,
  }


def write_config(tmp_path, text=CONFIG, name='tiny.gin'):
  path = tmp_path / name
  path.write_text(text)
  return str(path)
