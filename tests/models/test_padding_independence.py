"""Real positions' logits do not depend on how much padding the inputs have.

The same real input tokens, padded to two lengths (and, in one batch, a
second example of another real length), must give the same logits (<= 1e-5)
in eval and in predict mode, for the Terraformer (full attention) and the
encoder-decoder ScalingTransformer (dense and sparse QKV).
"""
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer.trax_bridge import compat
from terraformer.models import ScalingTransformer
from terraformer.models import Terraformer

from decode_steps import decode_logits  # tests/models/
from decode_steps import init_predict_model

compat.apply()

VOCAB = 64
TERRAFORMER = dict(input_vocab_size=VOCAB, d_model=32, d_ff=64,
                   n_encoder_layers=1, n_decoder_layers=1, n_heads=4,
                   dropout=0.0, max_len=64, d_sru=8, ff_sparsity=8,
                   d_lowrank=4, encoder_attention_type='full',
                   decoder_attention_type='full', predict_mem_len=32)
SCALING = dict(input_vocab_size=VOCAB, d_model=32, d_ff=64,
               n_encoder_layers=1, n_decoder_layers=1, n_heads=4,
               dropout=0.0, max_len=32)
TARGET_LEN = 4


def _batch(pad_to):
  """Two examples with 5 and 3 real input tokens, padded to `pad_to`."""
  rs = np.random.RandomState(0)
  inputs = np.zeros((2, pad_to), np.int32)
  inputs[0, :5] = rs.randint(1, VOCAB, 5)
  inputs[1, :3] = rs.randint(1, VOCAB, 3)
  targets = rs.randint(1, VOCAB, (2, TARGET_LEN)).astype(np.int32)
  return inputs, targets


def _eval_logits(build, weights_from, pad_to):
  inputs, targets = _batch(pad_to)
  model = build('eval')
  model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(1))
  if weights_from is not None:
    model.weights = weights_from.weights
  return model, np.asarray(model((inputs, targets))[0])


def _predict_logits(build, weights, pad_to):
  inputs, targets = _batch(pad_to)
  model = init_predict_model(build, weights, len(inputs), inputs)
  return decode_logits(model, targets, inputs)


def _check(build):
  reference, short = _eval_logits(build, None, 6)
  _, long = _eval_logits(build, reference, 11)
  np.testing.assert_allclose(long, short, atol=1e-5, rtol=0)
  for pad_to in (6, 11):
    np.testing.assert_allclose(
        _predict_logits(build, reference.weights, pad_to), short,
        atol=1e-5, rtol=0)


@pytest.mark.parametrize('config', [
    dict(),
    dict(attention_sparsity=4),
    dict(use_sru=False, ff_sparsity=0),
], ids=['sru_sparse_ff', 'sparse_qkv', 'plain'])
def test_terraformer_padding_independent(config):
  _check(lambda mode: Terraformer(mode=mode, **{**TERRAFORMER, **config}))


@pytest.mark.parametrize('sparsity', [0, 4], ids=['dense', 'sparse_qkv'])
def test_scaling_transformer_padding_independent(sparsity):
  _check(lambda mode: ScalingTransformer(
      mode=mode, attention_sparsity=sparsity, **SCALING))


def test_padding_changes_logits_without_the_mask():
  """The check can fail: a real token where padding was changes the logits."""
  build = lambda mode: Terraformer(mode=mode, **TERRAFORMER)
  model, short = _eval_logits(build, None, 6)
  inputs, targets = _batch(6)
  inputs[1, 3] = 7
  other = np.asarray(model((inputs, targets))[0])
  assert np.abs(other[1] - short[1]).max() > 1e-3
  np.testing.assert_allclose(other[0], short[0], atol=1e-5, rtol=0)
