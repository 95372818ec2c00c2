"""Builders both models use: embedding, logits, a layer run once to decode."""
from trax import layers as tl

from terraformer.layers.sparse_logits import SparseLogits


def Embedder(embedding, dropout, positions, mode, shared_axes=None):
  """Tokens -> vectors: `embedding`, dropout, then the `positions` layer.

  `shared_axes`: axes along which the dropout mask is shared (None: none).
  """
  return [embedding,
          tl.Dropout(rate=dropout, shared_axes=shared_axes, mode=mode),
          positions]


def Logits(vocab_size, loss_sparsity):
  """Vectors -> logits: dense, or the sparse output layer (§3.4)."""
  if loss_sparsity:
    return SparseLogits(vocab_size, loss_sparsity)
  return tl.Dense(vocab_size)


def CachedInPredict(layer, mode):
  """Runs `layer` once in predict mode and reuses its outputs (tl.Cache).

  Other modes wrap it in a one-layer Serial, so that the weight trees of all
  modes have the same structure as tl.Cache's.
  """
  return tl.Cache(layer) if mode == 'predict' else tl.Serial(layer)
