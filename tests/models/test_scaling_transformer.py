"""Scaling Transformer models: shapes, training step, predict == eval."""
import numpy as np
import pytest
import jax
from trax import shapes

from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM

from decode_steps import eval_and_decode_logits  # tests/models/

TINY = dict(d_model=32, d_ff=64, n_heads=4, dropout=0.0, max_len=16,
            d_lowrank=4)
VARIANTS = {
    'dense': {},
    'sparse_ff': dict(ff_sparsity=8),
    'sparse_qkv': dict(attention_sparsity=4),
    'sparse_ff_qkv': dict(ff_sparsity=8, attention_sparsity=4),
    'sparse_ff_qkv_loss': dict(ff_sparsity=8, attention_sparsity=4,
                               loss_sparsity=4),
    'local_conv': dict(local_conv_len=3),
}
VOCAB = 64


def _tokens(shape, seed=0):
  return np.random.RandomState(seed).randint(1, VOCAB, size=shape).astype(
      np.int32)


def _lm(variant, mode):
  return ScalingTransformerLM(vocab_size=VOCAB, n_layers=2, mode=mode,
                              **TINY, **VARIANTS[variant])


def _encdec(variant, mode):
  return ScalingTransformer(input_vocab_size=VOCAB, n_encoder_layers=2,
                            n_decoder_layers=2, mode=mode, **TINY,
                            **VARIANTS[variant])


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_lm_predict_matches_eval_forward(variant):
  tokens = _tokens((2, 10))
  full_logits, step_logits, _ = eval_and_decode_logits(
      lambda mode: _lm(variant, mode), tokens, rng=jax.random.PRNGKey(1))
  np.testing.assert_allclose(step_logits, full_logits, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize('variant', ['dense', 'sparse_ff_qkv_loss',
                                     'local_conv'])
def test_encoder_decoder_predict_matches_eval_forward(variant):
  inputs, targets = _tokens((2, 7), seed=1), _tokens((2, 6), seed=2)
  inputs[0, 5:] = 0  # padding in the encoder input must be masked
  full_logits, step_logits, _ = eval_and_decode_logits(
      lambda mode: _encdec(variant, mode), targets, inputs,
      rng=jax.random.PRNGKey(2))
  np.testing.assert_allclose(step_logits, full_logits, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize('variant', ['dense', 'local_conv'])
def test_encoder_padding_is_masked(variant):
  inputs, targets = _tokens((1, 5), seed=3), _tokens((1, 4), seed=4)
  padded = np.pad(inputs, ((0, 0), (0, 3)))
  model = _encdec(variant, 'eval')
  model.init(shapes.signature((padded, targets)), rng=jax.random.PRNGKey(0))
  logits_padded, _ = model((padded, targets))
  logits, _ = model((inputs, targets))
  np.testing.assert_allclose(np.asarray(logits_padded), np.asarray(logits),
                             atol=1e-5)


@pytest.mark.parametrize('variant', ['dense', 'sparse_ff_qkv_loss',
                                     'local_conv'])
def test_lm_is_causal(variant):
  tokens = _tokens((1, 8))
  changed = tokens.copy()
  changed[0, 5] = (changed[0, 5] % (VOCAB - 1)) + 1
  model = _lm(variant, 'eval')
  model.init(shapes.signature(tokens), rng=jax.random.PRNGKey(0))
  a, b = np.asarray(model(tokens)), np.asarray(model(changed))
  # Inputs are shifted right: changing token 5 changes logits from 6 on.
  np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-5)
  assert not np.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize('encoder', ['causal', 'bidirectional'])
def test_sparse_encoder_is_padding_independent(encoder):
  inputs, targets = _tokens((1, 5), seed=6), _tokens((1, 4), seed=7)
  logits = []
  for pad in (0, 3, 6):
    padded = np.pad(inputs, ((0, 0), (0, pad)))
    model = ScalingTransformer(
        input_vocab_size=VOCAB, n_encoder_layers=2, n_decoder_layers=1,
        mode='eval', sparse_encoder_attention=encoder, **TINY,
        **VARIANTS['sparse_ff_qkv_loss'])
    model.init(shapes.signature((padded, targets)), rng=jax.random.PRNGKey(0))
    logits.append(np.asarray(model((padded, targets))[0]))
  for other in logits[1:]:
    np.testing.assert_allclose(other, logits[0], atol=1e-5)


def test_encoder_decoder_shares_the_embedding_without_output_vocab():
  signature = (shapes.ShapeDtype((1, 5), np.int32),) * 2
  shared = _encdec('dense', 'eval')
  shared.init(signature)
  separate = ScalingTransformer(input_vocab_size=VOCAB, output_vocab_size=VOCAB,
                                n_encoder_layers=2, n_decoder_layers=2,
                                mode='eval', **TINY)
  separate.init(signature)
  n_shared = sum(np.size(w) for w in jax.tree_util.tree_leaves(shared.weights))
  n_separate = sum(np.size(w)
                   for w in jax.tree_util.tree_leaves(separate.weights))
  assert n_separate - n_shared == VOCAB * TINY['d_model']
