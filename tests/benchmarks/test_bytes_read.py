"""Bytes one decoding step reads (terraformer/benchmarks/bytes_read.py),
against hand counts: dense and sparse LMs, an encoder-decoder's caches, the
Terraformer's decoder cache buckets, int8 rows of a kernel layer."""
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer.benchmarks import bytes_read
from terraformer.benchmarks import decode_speed
from terraformer.decoding import step as decode_step
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.ops import bucket_for
from terraformer.layers.sparse_ff import SparseFF
from terraformer.models import Terraformer

from bench_models import (  # tests/bench_models.py
    D, D_FF, F, HEADS, LOWRANK, MAX_LEN, N, S, S_LOSS, SPARSE, V, encdec, lm,
    random_tokens)

F32 = 4


def _lm_step_bytes(n_layers, position, sparse):
  """Bytes one LM step at `position` reads, counted by hand (float32)."""
  bucket = bucket_for(position + 1, MAX_LEN)
  embedding = D * F32 + D * F32 + 4   # token row, position row, its index
  layer_norm = 2 * D * F32
  cache = 2 * bucket * D * F32 + 4    # K, V prefix (heads x d_head = D)
  if sparse:
    m = D // S
    attention = ((D * S + D * m + D) * F32              # D, E, b
                 + 2 * (F * F * m * m + m) * F32         # Q, K conv F x F
                 + (F * m * m + m) * F32                 # V conv F x 1
                 + (F - 1) * D * F32 + cache)            # conv state
    blocks = D_FF // N
    ff = ((D * LOWRANK + LOWRANK * D_FF + D_FF + D) * F32  # C1, C2, c, b2
          + 2 * blocks * D * F32)                        # rows of W1ᵀ, W2
    logits = (D * S_LOSS + D * V // S_LOSS + V) * F32
  else:
    attention = 4 * (D * D + D) * F32 + cache
    ff = (D * D_FF + D_FF + D_FF * D + D) * F32
    logits = (D * V + V) * F32
  return (embedding + n_layers * (2 * layer_norm + attention + ff)
          + layer_norm + logits)


@pytest.mark.parametrize('sparse', [False, True])
def test_step_bytes_match_hand_count(sparse):
  model = lm(n_layers=2, **(SPARSE if sparse else {}))
  result = decode_speed.measure_model(model, tokens=3, prompt_len=70,
                                      repeats=1)
  # Timed positions 70, 71, 72: the 128-position cache bucket.
  expected = np.mean([_lm_step_bytes(2, p, sparse) for p in (70, 71, 72)])
  assert result['bytes_per_token'] == pytest.approx(expected)
  fresh = lm(n_layers=2, **(SPARSE if sparse else {}))
  assert result['n_params'] == sum(
      np.size(w) for w in jax.tree_util.tree_leaves(
          fresh.init(shapes.ShapeDtype((1, 1), np.int32))[0]))


def test_encoder_decoder_step_bytes_match_hand_count():
  model = encdec(n_layers=2)
  sig = decode_step.predict_signature(model, prompt_len=9)
  weights, state = model.init(sig)
  step = decode_step.make_step(model)
  first = (random_tokens((1, 9), 0), np.zeros((1, 1), np.int32))
  _, state = step(first, weights, state, jax.random.PRNGKey(0))
  by_layer = bytes_read.step_bytes(model, weights, state, position=1)
  lin = 9
  self_attention = 4 * (D * D + D) * F32 + 2 * 64 * D * F32 + 4
  cross_attention = (2 * (D * D + D) * F32      # queries, output layer
                     + 2 * lin * D * F32)       # cached keys, values
  ff = (D * D_FF + D_FF + D_FF * D + D) * F32
  layer = 3 * 2 * D * F32 + self_attention + cross_attention + ff
  top = (D * F32 + D * F32 + 4                  # embedding, positions
         + lin * D * F32 + lin                  # cached encoder output, mask
         + 2 * D * F32 + (D * V + V) * F32)     # final norm, logits
  assert sum(by_layer.values()) == 2 * layer + top
  assert by_layer['Cache'] == 2 * 2 * lin * D * F32 + lin * D * F32 + lin


def test_terraformer_decoder_cache_bytes_are_its_filled_bucket():
  model = Terraformer(input_vocab_size=V, d_model=D, d_ff=D_FF,
                      n_encoder_layers=1, n_decoder_layers=2, n_heads=HEADS,
                      dropout=0.0, max_len=MAX_LEN, ff_sparsity=N,
                      d_lowrank=LOWRANK, encoder_attention_type='full',
                      decoder_attention_type='full', predict_mem_len=200,
                      d_sru=8, mode='predict')
  prompt_len = 9
  sig = decode_step.predict_signature(model, prompt_len)
  weights, state = model.init(sig)
  step = decode_step.make_step(model)
  first = (random_tokens((1, prompt_len), 0), np.zeros((1, 1), np.int32))
  _, state = step(first, weights, state, jax.random.PRNGKey(0))
  # The cache holds the 9 encoder positions, then the decoder's: decoder
  # position p is cache index 9 + p, and the step reads the smallest
  # bucket (64, 128, 200) holding indices 0..9 + p.
  per_position = 2 * D * F32 + HEADS    # keys, values, validity (bool)
  for position, bucket in ((1, 64), (54, 64), (55, 128), (150, 200)):
    by_layer = bytes_read.step_bytes(model, weights, state, position,
                                     encoder_len=prompt_len)
    # Two self-attention layers per decoder block (the second one attends
    # to the encoder positions), two blocks.
    assert by_layer['CausalDotProductAttention'] == 2 * 2 * (
        bucket * per_position + 4)


def test_int8_sparse_ff_step_bytes_match_hand_count():
  """int8 storage (terraformer/kernels): a selected row is D bytes + its
  float32 scale, for W1ᵀ and W2 each."""
  layer = SparseFF(D_FF, N, LOWRANK, mode='predict')
  weights, state = layer.init(shapes.ShapeDtype((1, 1, D), np.float32))
  kernel_installer.install(layer)
  stored = kernel_layers.store_weights(layer, weights, 'int8')
  blocks = D_FF // N
  expected = ((D * LOWRANK + LOWRANK * D_FF + D_FF + D) * F32
              + 2 * blocks * (D * 1 + F32))
  assert bytes_read.step_bytes(layer, stored, state, 0) == {
      'KernelSparseFF': expected}
  f32 = bytes_read.step_bytes(layer, weights, state, 0)['KernelSparseFF']
  assert f32 - expected == 2 * blocks * (D * (F32 - 1) - F32)
