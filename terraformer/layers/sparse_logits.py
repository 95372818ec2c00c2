"""Sparse loss layer: multiplicative final projection to the vocabulary (§3.3)."""
import gin

from terraformer.layers.multiplicative_dense import MultiplicativeDense


@gin.configurable(module='terraformer')
def SparseLogits(vocab_size, n_modules=4):
  """The d_model -> vocab dense layer replaced by a multiplicative one (§3.3, 6.2).

  S = `n_modules` modules of size vocab_size / S, plus a bias per token:
  d_model * (S + vocab_size / S) + vocab_size weights instead of
  (d_model + 1) * vocab_size.
  """
  if vocab_size % n_modules:
    raise ValueError(f'vocab_size={vocab_size} is not a multiple of the loss '
                     f'sparsity S={n_modules}.')
  return MultiplicativeDense(n_modules, vocab_size // n_modules, use_bias=True)
