"""Importing Trax 1.4.1 checkpoints: Trax's models are the oracle.

Each test builds a Trax model with random weights, saves it with Trax's
checkpoint writer, imports it into our model of the matching config and
compares eval logits (within 1e-4) and greedy decodes (identical) with Trax.
"""
import functools

import numpy as np
import pytest

from terraformer.decoding import search as decoding
from terraformer.loading import model as loading_model
from terraformer.trax_bridge import checkpoint_import as trax_import
from terraformer.errors import TerraformerError
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM
from terraformer.models import Terraformer

import trax_checkpoints as tc

VOCAB = 20
LENGTH = 8
BATCH = 2
LM = dict(d_model=16, d_ff=32, n_heads=4, max_len=32, dropout=0.0)
LM_VARIANTS = {
    # name: (Trax kwargs, our kwargs)
    'dense': ({}, {}),
    'sparse_ff_qkv_loss': (
        dict(ff_sparsity=(4, 4), attention_sparsity=4, loss_sparsity=4),
        dict(ff_sparsity=4, d_lowrank=4, attention_sparsity=4,
             attention_kernel_size=3, loss_sparsity=4)),
}


def _tokens(shape, seed):
  return np.random.RandomState(seed).randint(
      1, VOCAB, size=shape).astype(np.int32)


def _trax_lm_checkpoint(tmp_path, variant, n_layers=2, seed=0):
  trax_kwargs, _ = LM_VARIANTS[variant]
  signature = tc.int_signature((BATCH, LENGTH))
  model = tc.trax_lm('eval', vocab_size=VOCAB, n_layers=n_layers, **LM,
                     **trax_kwargs)
  weights = tc.random_weights(model, signature, seed=seed)
  path = tc.save_with_trax(model, str(tmp_path / 'trax'), (signature,))
  return model, weights, path


def _our_lm(variant, mode, n_layers=2):
  _, ours = LM_VARIANTS[variant]
  return ScalingTransformerLM(vocab_size=VOCAB, n_layers=n_layers, mode=mode,
                              **LM, **ours)


@pytest.mark.parametrize('variant', sorted(LM_VARIANTS))
def test_lm_import_matches_trax(variant, tmp_path):
  trax_model, _, path = _trax_lm_checkpoint(tmp_path, variant)
  weights, step = trax_import.load_trax_into(_our_lm(variant, 'eval'), path)
  assert step == 7

  tokens = _tokens((BATCH, LENGTH), seed=1)
  ours = tc.with_weights(_our_lm(variant, 'eval'), weights,
                         tc.int_signature((BATCH, LENGTH)))
  want = np.asarray(trax_model(tokens))
  got = np.asarray(ours(tokens))
  assert got.shape == want.shape
  max_diff = float(np.max(np.abs(got - want)))
  print(f'{variant}: max |dlogit| {max_diff:.2e}')
  assert max_diff < 1e-4

  want_tokens = tc.trax_greedy_lm(trax_model, BATCH, LENGTH)
  predict = loading_model.with_weights(_our_lm(variant, 'predict'), weights,
                                       tc.int_signature((BATCH, 1)))
  got_tokens = decoding.decode(predict, max_length=LENGTH, batch_size=BATCH,
                               eos_id=None)
  np.testing.assert_array_equal(np.asarray(got_tokens), want_tokens)


def test_mismatched_checkpoint_names_the_first_weight(tmp_path):
  _, _, path = _trax_lm_checkpoint(tmp_path, 'dense')
  wider = ScalingTransformerLM(vocab_size=VOCAB, n_layers=2, mode='eval',
                               **dict(LM, d_ff=48))
  with pytest.raises(TerraformerError) as error:
    trax_import.load_trax_into(wider, path)
  message = str(error.value)
  assert '\n' not in message
  # Embedding, positions, then block 0: LayerNorm (2), Dense q/k/v/o (8),
  # then block 1 (the FF half): LayerNorm (2), the first Dense kernel.
  assert 'Trax weight 14 of' in message
  assert 'Residual[1]/Dense/kernel' in message
  assert 'checkpoint (16, 32) vs expected (16, 48)' in message


def test_fewer_layers_in_the_checkpoint_is_an_error(tmp_path):
  _, _, path = _trax_lm_checkpoint(tmp_path, 'dense', n_layers=1)
  with pytest.raises(TerraformerError, match='does not match the model'):
    trax_import.load_trax_into(_our_lm('dense', 'eval', n_layers=2), path)


ENCDEC = dict(d_model=16, d_ff=32, n_heads=4, max_len=32, dropout=0.0,
              n_encoder_layers=2, n_decoder_layers=2)
ENCDEC_VARIANTS = {
    'dense': ({}, {}),
    # Sparse QKV in the encoder (causal, as Trax), the decoder and the
    # cross-attention queries, with sparse FF and loss.
    'sparse_ff_qkv_loss': (
        dict(ff_sparsity=(4, 4), attention_sparsity=4, loss_sparsity=4),
        dict(ff_sparsity=4, d_lowrank=4, attention_sparsity=4,
             attention_kernel_size=3, loss_sparsity=4)),
}


def _our_encdec(variant, mode):
  _, ours = ENCDEC_VARIANTS[variant]
  return ScalingTransformer(input_vocab_size=VOCAB, mode=mode, **ENCDEC,
                            **ours)


@pytest.mark.parametrize('variant', sorted(ENCDEC_VARIANTS))
def test_encoder_decoder_import_matches_trax(variant, tmp_path):
  trax_kwargs, _ = ENCDEC_VARIANTS[variant]
  signature = tc.int_signature((BATCH, LENGTH), (BATCH, LENGTH))
  trax_model = tc.trax_encdec('eval', input_vocab_size=VOCAB, **ENCDEC,
                              **trax_kwargs)
  tc.random_weights(trax_model, signature, seed=3)
  path = tc.save_with_trax(trax_model, str(tmp_path / 'trax'), signature)
  weights, _ = trax_import.load_trax_into(_our_encdec(variant, 'eval'), path)

  inputs = _tokens((BATCH, LENGTH), seed=4)
  inputs[0, 5:] = 0  # Padding.
  targets = _tokens((BATCH, LENGTH), seed=5)
  ours = tc.with_weights(_our_encdec(variant, 'eval'), weights, signature)
  want = np.asarray(trax_model((inputs, targets))[0])
  got = np.asarray(ours((inputs, targets))[0])
  max_diff = float(np.max(np.abs(got - want)))
  print(f'encoder-decoder {variant}: max |dlogit| {max_diff:.2e}')
  assert max_diff < 1e-4

  want_tokens = tc.trax_greedy_encdec(trax_model, inputs, LENGTH)
  predict = loading_model.with_weights(
      _our_encdec(variant, 'predict'), weights,
      tc.int_signature((BATCH, LENGTH), (BATCH, 1)))
  got_tokens = decoding.decode(predict, [list(inputs[0, :5]), list(inputs[1])],
                               max_length=LENGTH, input_length=LENGTH,
                               eos_id=None)
  np.testing.assert_array_equal(np.asarray(got_tokens), want_tokens)


TERRAFORMER = dict(d_model=16, d_ff=32, n_heads=4, max_len=32, dropout=0.0,
                   n_encoder_layers=2, n_decoder_layers=2)
TERRAFORMER_VARIANTS = {
    # name: (Trax kwargs, our kwargs). Full attention is Trax's efficient
    # tl.SelfAttention without chunking (its default chunk_len=None).
    'full': (dict(encoder_attention_type=tc.tl.SelfAttention,
                  encoder_decoder_attention_type=tc.tl.SelfAttention),
             dict(encoder_attention_type='full',
                  decoder_attention_type='full', use_sru=False)),
    'sru_sparse_ff_loss': (
        dict(encoder_attention_type=tc.tl.SelfAttention,
             encoder_decoder_attention_type=tc.tl.SelfAttention,
             ff_use_sru=(1, 8), ff_sparsity=(4, 4), loss_sparsity=4),
        dict(encoder_attention_type='full', decoder_attention_type='full',
             use_sru=True, d_sru=8, ff_sparsity=4, d_lowrank=4,
             loss_sparsity=4)),
}


def _our_terraformer(variant, mode):
  _, ours = TERRAFORMER_VARIANTS[variant]
  return Terraformer(input_vocab_size=VOCAB, mode=mode, predict_mem_len=32,
                     **TERRAFORMER, **ours)


def _trax_terraformer_checkpoint(tmp_path, variant, seed=6):
  trax_kwargs, _ = TERRAFORMER_VARIANTS[variant]
  signature = tc.int_signature((BATCH, LENGTH), (BATCH, LENGTH))
  model = tc.trax_terraformer_model('eval', VOCAB, **TERRAFORMER,
                                    **trax_kwargs)
  tc.random_weights(model, signature, seed=seed)
  path = tc.save_with_trax(model, str(tmp_path / 'trax'), signature)
  return model, path


@pytest.mark.parametrize('variant', sorted(TERRAFORMER_VARIANTS))
def test_terraformer_import_matches_trax(variant, tmp_path):
  trax_model, path = _trax_terraformer_checkpoint(tmp_path, variant)
  weights, _ = trax_import.load_trax_into(_our_terraformer(variant, 'eval'),
                                          path)

  signature = tc.int_signature((BATCH, LENGTH), (BATCH, LENGTH))
  inputs = _tokens((BATCH, LENGTH), seed=7)
  inputs[0, 5:] = 0  # Padding.
  targets = _tokens((BATCH, LENGTH), seed=8)
  ours = tc.with_weights(_our_terraformer(variant, 'eval'), weights,
                         signature)
  want = np.asarray(trax_model((inputs, targets))[0])
  got = np.asarray(ours((inputs, targets))[0])
  assert got.shape == want.shape
  max_diff = float(np.max(np.abs(got - want)))
  print(f'terraformer {variant}: max |dlogit| {max_diff:.2e}')
  assert max_diff < 1e-4

  want_tokens = tc.trax_greedy_encdec(trax_model, inputs, LENGTH)
  predict = loading_model.with_weights(
      _our_terraformer(variant, 'predict'), weights,
      tc.int_signature((BATCH, LENGTH), (BATCH, 1)))
  got_tokens = decoding.decode(predict, [list(inputs[0, :5]), list(inputs[1])],
                               max_length=LENGTH, input_length=LENGTH,
                               eos_id=None)
  np.testing.assert_array_equal(np.asarray(got_tokens), want_tokens)


def test_mismatched_terraformer_checkpoint_names_the_first_weight(tmp_path):
  _, path = _trax_terraformer_checkpoint(tmp_path, 'full')
  _, ours = TERRAFORMER_VARIANTS['full']
  wider = Terraformer(input_vocab_size=VOCAB, mode='eval',
                      **dict(TERRAFORMER, d_ff=48), **ours)
  with pytest.raises(TerraformerError) as error:
    trax_import.load_trax_into(wider, path)
  message = str(error.value)
  assert '\n' not in message
  # Trax's order: the shared embedding (1), encoder positions (33), decoder
  # positions (33), then encoder block 0: attention half (LayerNorm 2,
  # w_q w_k w_v w_o), feed-forward half (LayerNorm 2, the first Dense).
  assert 'Trax weight 75 of' in message
  assert 'ReversibleHalfResidual[1]/Dense/kernel' in message
  assert 'checkpoint (16, 32) vs expected (16, 48)' in message


def test_terraformer_lsh_import_matches_trax_with_the_same_hashing(tmp_path):
  """LSH in both stacks, eval mode: equal when Trax hashes with our keys.

  Our eval hashes with keys drawn from `lsh_eval_seed` + the attention's
  index (encoder: + 0; decoder block i: + 1 + 2i, + 2 + 2i); Trax's
  LSHSelfAttention keeps per-head keys in its state and advances them on
  every call, so the oracle's keys are set to ours before each call.
  Greedy decoding is not compared: our LSH decoding hashes the growing
  cache and does not reproduce the evaluation pass (model docstring).
  """
  # Ours attends to 1 chunk before (and, in the encoder, 1 after).
  lsh = dict(chunk_len=4, n_buckets=4, n_hashes=1, n_chunks_before=1,
             n_chunks_after=0)
  signature = tc.int_signature((BATCH, LENGTH), (BATCH, LENGTH))
  trax_model = tc.trax_terraformer_model(
      'eval', VOCAB, lsh=lsh,
      encoder_attention_type=functools.partial(tc.tl.LSHSelfAttention,
                                               n_chunks_after=1),
      encoder_decoder_attention_type=tc.tl.LSHSelfAttention, **TERRAFORMER)
  tc.random_weights(trax_model, signature, seed=9)
  path = tc.save_with_trax(trax_model, str(tmp_path / 'trax'), signature)

  seed = 5
  ours_kwargs = dict(encoder_attention_type='lsh',
                     decoder_attention_type='lsh', use_sru=False,
                     lsh_chunk_len=4, lsh_n_buckets=4, lsh_n_hashes=1,
                     lsh_eval_seed=seed, **TERRAFORMER)
  weights, _ = trax_import.load_trax_into(
      Terraformer(input_vocab_size=VOCAB, mode='eval', **ours_kwargs), path)
  ours = tc.with_weights(
      Terraformer(input_vocab_size=VOCAB, mode='eval', **ours_kwargs),
      weights, signature)

  inputs = _tokens((BATCH, LENGTH), seed=10)
  inputs[0, 5:] = 0  # Padding.
  targets = _tokens((BATCH, LENGTH), seed=11)
  got = np.asarray(ours((inputs, targets))[0])
  layers = tc.lsh_layers(trax_model)
  n_enc = TERRAFORMER['n_encoder_layers']
  assert len(layers) == n_enc + 2 * TERRAFORMER['n_decoder_layers']
  offsets = [0] * n_enc + list(range(1, len(layers) - n_enc + 1))
  for layer, offset in zip(layers, offsets):
    tc.set_hashing_keys(layer, seed + offset)
  want = np.asarray(trax_model((inputs, targets))[0])
  max_diff = float(np.max(np.abs(got - want)))
  print(f'terraformer lsh: max |dlogit| {max_diff:.2e}')
  assert max_diff < 1e-4
