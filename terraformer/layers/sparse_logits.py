"""Sparse loss layer: multiplicative final projection to the vocabulary (§3.3)."""
import gin
from trax import layers as tl

from terraformer.layers.multiplicative_dense import MultiplicativeDense


@gin.configurable(module='terraformer')
def SparseLogits(vocab_size, n_modules=4):
  """The d_model -> vocab dense layer replaced by a multiplicative one (§3.3, 6.2).

  S = `n_modules` modules of size M = ceil(vocab_size / S), plus a bias per
  output: d_model * (S + M) + S * M weights instead of (d_model + 1) *
  vocab_size. When S does not divide the vocabulary (e.g. 32100 = 32000
  pieces + 100 T5 sentinels with S = 8) the last S * M - vocab_size outputs
  are computed and dropped.

  When S divides the vocabulary this is Trax 1.4.1's loss-sparsity layer of
  `ConfigurableTransformer(LM)(loss_sparsity=S)` with its default
  `loss_sparsity_type='mult'`: `SparseDenseWithOptions` ->
  `FactoredDense(S, d_model, vocab_size)`, weights (D [S, d_model],
  E [d_model, M], b [vocab_size]) in Trax's order. Trax rejects vocabularies
  that S does not divide; the padding here has no Trax counterpart.
  """
  if n_modules < 1 or n_modules > vocab_size:
    raise ValueError(f'loss sparsity S={n_modules} must be in '
                     f'[1, vocab_size={vocab_size}].')
  d_module = -(-vocab_size // n_modules)
  logits = MultiplicativeDense(n_modules, d_module, use_bias=True)
  if n_modules * d_module == vocab_size:
    return logits
  return tl.Serial(
      logits,
      tl.Fn(f'DropPaddedLogits_{vocab_size}', lambda x: x[..., :vocab_size]))
