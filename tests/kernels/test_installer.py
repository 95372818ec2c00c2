"""The installer finds the compositions a fused kernel runs by the marks
their builders set (`terraformer.layers.composites`), not by their shape,
and stops, changing nothing, at a marked layer that is not its composition.
"""
import collections

import pytest
from trax import layers as tl
from trax.layers import combinators as trax_combinators

from terraformer.kernels import block_layers
from terraformer.kernels import compositions
from terraformer.kernels import installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers import composites
from terraformer.layers import reversible as rev
from terraformer.layers.sparse_ff import SparseFF
from terraformer.models import ScalingTransformer
from terraformer.models import Terraformer


def _norm_branch_layers():
  return [tl.Select([0], n_in=2), tl.LayerNorm(),
          SparseFF(128, 8, 4, mode='predict'),
          tl.Dropout(rate=0.1, mode='predict')]


def test_a_composition_is_found_by_its_mark_not_its_shape():
  """The same LayerNorm, SparseFF, Dropout branch: unmarked, only its
  SparseFF becomes a kernel layer; marked NORM_BRANCH, the branch runs as
  one call (KernelNormSerial)."""
  plain = tl.Serial(*_norm_branch_layers())
  marked = composites.mark(tl.Serial(*_norm_branch_layers()),
                           composites.NORM_BRANCH)
  assert installer.install(plain) == 1
  assert type(plain) is trax_combinators.Serial  # pylint: disable=unidiomatic-typecheck
  assert isinstance(plain.sublayers[2], kernel_layers.KernelSparseFF)
  assert installer.install(marked) == 2
  assert isinstance(marked, block_layers.KernelNormSerial)


@pytest.mark.parametrize('name,layer,message', [
    (composites.SPARSE_QKV, tl.Serial(tl.Dense(8), tl.Dense(4)),
     r'Serial\(MultiplicativeDense, ModuleConv\): its sublayers are '
     r'\[Dense_8, Dense_4\]'),
    (composites.NORM_BRANCH, tl.Serial(tl.LayerNorm(), tl.Dense(8)),
     r'Serial\(\[Select\(\[0\]\),\] LayerNorm, f, Dropout\)'),
    (composites.SPARSE_QKV_CAUSAL_ATTENTION,
     tl.Serial(tl.Dense(8), tl.Dense(8), tl.Dense(8), tl.Dense(8)),
     r'causal attention, MergeHeads\)'),
    (composites.RESIDUAL, tl.Serial(tl.Dense(8), tl.Add()),
     r'tl\.Residual\(f\)'),
    (composites.TERRAFORMER_DECODER,
     rev.ReversibleSerial(tl.ReversibleSwap()),
     r'ReversibleSerial of decoder blocks'),
], ids=['sparse_qkv', 'norm_branch', 'sparse_qkv_causal_attention',
        'residual', 'terraformer_decoder'])
def test_a_marked_layer_that_is_not_its_composition_stops_the_install(
    name, layer, message):
  """The error names the layer, its mark and sublayers; no class changes,
  not even the SparseFF's outside it."""
  model = tl.Serial(SparseFF(128, 8, 4, mode='predict'),
                    composites.mark(layer, name))
  with pytest.raises(compositions.UnknownComposition,
                     match=f"is marked '{name}' but is not .*{message}"):
    installer.install(model)
  assert type(model.sublayers[0]) is SparseFF  # pylint: disable=unidiomatic-typecheck


def test_a_terraformer_without_decoder_blocks_installs_and_decodes():
  """The model a benchmark times for its per-block figures (no decoder
  blocks): its empty decoder stack is a stack of no blocks, left as it is
  (nothing to fuse); the rest becomes kernel layers."""
  model = Terraformer(
      input_vocab_size=96, d_model=64, d_ff=128, n_heads=4,
      n_encoder_layers=0, n_decoder_layers=0, dropout=0.0, max_len=64,
      ff_sparsity=8, d_lowrank=4, loss_sparsity=4, d_sru=8,
      encoder_attention_type='full', decoder_attention_type='full',
      predict_mem_len=64, mode='predict')
  counts = _installed(model)
  assert counts['KernelReversibleSerial'] == 0
  assert counts['KernelMultiplicativeDense'] == 1  # The sparse loss.
  decoders = []

  def walk(layer):
    if composites.name_of(layer) == composites.TERRAFORMER_DECODER:
      decoders.append(layer)
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  assert [type(d) for d in decoders] == [rev.ReversibleSerial]
  assert compositions.terraformer_decoder(decoders[0]) == []


def test_a_name_is_one_of_the_compositions():
  with pytest.raises(ValueError, match='not a composite name'):
    composites.mark(tl.Serial(), 'sparse_qvk')


def _installed(model):
  """{class name: count} of `model`'s layers after `install`."""
  installer.install(model)
  counts = collections.Counter()

  def walk(layer):
    counts[type(layer).__name__] += 1
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  return counts


def test_the_terraformers_builders_mark_its_decoder():
  """A Terraformer with sparse QKV (2 decoder blocks): the decoder's
  reversible stack (not the encoder's) runs its blocks fused, its 4 sparse
  QKV attentions and 6 residual branches (2 attentions and the sparse FF a
  block) as one call each."""
  model = Terraformer(
      input_vocab_size=96, d_model=64, d_ff=128, n_heads=4,
      n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, max_len=64,
      ff_sparsity=8, d_lowrank=4, loss_sparsity=4, d_sru=8,
      attention_sparsity=4, encoder_attention_type='full',
      decoder_attention_type='full', predict_mem_len=64, mode='predict')
  counts = _installed(model)
  assert counts['KernelReversibleSerial'] == 1
  assert counts['ReversibleSerial'] == 1  # The encoder's.
  assert counts['KernelSparseQKVAttention'] == 4
  assert counts['KernelNormSerial'] == 6


def test_the_scaling_transformers_builders_mark_its_blocks():
  """A Scaling Transformer with sparse QKV, sparse queries and sparse FF
  (2 decoder blocks): the Serial holding its decoder blocks runs each as
  one call (its attention, cross-attention and feed-forward residuals)."""
  model = ScalingTransformer(
      input_vocab_size=96, d_model=64, d_ff=128, n_encoder_layers=1,
      n_decoder_layers=2, n_heads=4, dropout=0.0, max_len=64, d_lowrank=8,
      ff_sparsity=8, attention_sparsity=4, loss_sparsity=4, mode='predict')
  counts = _installed(model)
  assert counts['KernelScalingBlocks'] == 1
  assert list(block_layers.scaling_block_starts(
      model.sublayers).values()) == [3, 3]
