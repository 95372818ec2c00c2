"""decode_step (the jitted donating step, cheap init) and decode_speed (bytes
read per step, timing)."""
import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from trax import shapes
from trax.models.research import configurable_transformer as ct

from terraformer.benchmarks import decode_speed
from terraformer.decoding import step as decode_step
from terraformer import errors
from terraformer import kernels
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.ops import bucket_for
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM

V, D, D_FF, HEADS, MAX_LEN, LOWRANK = 64, 32, 64, 4, 128, 4
N, S, F, S_LOSS = 8, 4, 3, 4
SPARSE = dict(ff_sparsity=N, attention_sparsity=S, attention_kernel_size=F,
              loss_sparsity=S_LOSS)
F32 = 4


def _lm(n_layers=2, mode='predict', **sparsity):
  return ScalingTransformerLM(vocab_size=V, d_model=D, d_ff=D_FF,
                              n_layers=n_layers, n_heads=HEADS, dropout=0.0,
                              max_len=MAX_LEN, d_lowrank=LOWRANK, mode=mode,
                              **sparsity)


def _encdec(n_layers=2, mode='predict', **sparsity):
  return ScalingTransformer(input_vocab_size=V, d_model=D, d_ff=D_FF,
                            n_encoder_layers=1, n_decoder_layers=n_layers,
                            n_heads=HEADS, dropout=0.0, max_len=MAX_LEN,
                            d_lowrank=LOWRANK, mode=mode, **sparsity)


def _tokens(shape, seed):
  return np.random.RandomState(seed).randint(1, V, size=shape).astype(
      np.int32)


# --- Cheap initialization ---------------------------------------------------


@pytest.mark.parametrize('build', [
    functools.partial(_encdec, **SPARSE), _lm,
    lambda: ct.ConfigurableTransformerLM(V, d_model=D, d_ff=D_FF, n_layers=1,
                                         n_heads=HEADS, max_len=MAX_LEN,
                                         dropout=0.0, ff_sparsity=(N, 4),
                                         mode='predict'),
])
def test_zero_state_is_the_initial_state(build):
  model = build()
  sig = decode_step.predict_signature(model, prompt_len=5)
  weight_shapes, state_shapes = decode_step.init_shapes(model, sig)
  weights, state = model.init(sig)
  same = lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype)
  assert jax.tree_util.tree_structure(weight_shapes) == (
      jax.tree_util.tree_structure(weights))
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      same, weight_shapes, weights)))
  zeros = decode_step.zero_state(state_shapes)
  assert jax.tree_util.tree_structure(zeros) == (
      jax.tree_util.tree_structure(state))
  for ours, real in zip(jax.tree_util.tree_leaves(zeros),
                        jax.tree_util.tree_leaves(state)):
    assert same(ours, real)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(real))


def test_random_weights_fill_the_shapes():
  model = _lm(**SPARSE)
  sig = decode_step.predict_signature(model)
  weight_shapes, _ = decode_step.init_shapes(model, sig)
  weights = decode_speed.random_weights(weight_shapes, seed=3)
  leaves = jax.tree_util.tree_leaves(weights)
  assert [(l.shape, l.dtype) for l in leaves] == [
      (s.shape, s.dtype) for s in jax.tree_util.tree_leaves(weight_shapes)]
  assert all(np.isfinite(np.asarray(l)).all() for l in leaves)
  assert np.std(np.asarray(leaves[0])) > 0


def test_random_weights_share_only_what_decoding_never_reads():
  model = _encdec(n_layers=2)
  sig = decode_step.predict_signature(model, prompt_len=5)
  weight_shapes, _ = decode_step.init_shapes(model, sig)
  weights = decode_speed.random_weights(weight_shapes, model=model)
  run_once = jax.tree_util.tree_leaves(
      decode_speed._run_once_mask(model, weight_shapes))  # pylint: disable=protected-access
  leaves = jax.tree_util.tree_leaves(weights)
  stepped = [id(l) for l, once in zip(leaves, run_once) if not once]
  assert len(set(stepped)) == len(stepped)
  # Encoder (1 block + embedding + norm) and the 2 blocks' cross-attention
  # keys and values run once; their [D, D] matrices share one array.
  once = [l for l, flag in zip(leaves, run_once) if flag]
  square = [l for l in once if l.shape == (D, D)]
  assert len(square) == 4 + 2 * 2 and len({id(l) for l in square}) == 1
  unique = {id(l): l.nbytes for l in leaves}
  assert decode_speed.weights_memory(weight_shapes, model) == sum(
      unique.values())
  assert decode_speed.weights_memory(weight_shapes) == sum(
      l.nbytes for l in leaves)


@pytest.mark.parametrize('storage', ['int8', 'bfloat16'])
def test_stored_random_weights_have_store_weights_structure(storage,
                                                            monkeypatch):
  # A small block: matrices repeat rows, the embedding repeats its block.
  monkeypatch.setattr(decode_speed, 'RANDOM_BLOCK', 3 * D_FF)
  model = _encdec(**SPARSE)
  weight_shapes, _ = decode_step.init_shapes(
      model, decode_step.predict_signature(model, prompt_len=5))
  decode_step.make_step(model, options=('ffi', storage))  # Installs layers.
  converted = kernel_layers.store_weights(
      model, decode_speed.random_weights(weight_shapes, model=model), storage)
  direct = decode_speed.random_stored_weights(model, weight_shapes, storage)
  assert (jax.tree_util.tree_structure(direct) ==
          jax.tree_util.tree_structure(converted))
  leaves = jax.tree_util.tree_leaves(direct)
  assert [(l.shape, l.dtype) for l in leaves] == [
      (l.shape, l.dtype) for l in jax.tree_util.tree_leaves(converted)]
  stored = [l for l in leaves if l.dtype == jnp.dtype(storage)]
  assert stored and all(np.isfinite(np.asarray(l, np.float32)).all()
                        for l in leaves)
  big = max(stored, key=lambda l: l.size)
  rows = np.asarray(big, np.float32).reshape(big.shape[0], -1)
  period = max(1, decode_speed.RANDOM_BLOCK // rows.shape[1])
  assert rows.shape[0] > period  # The repeated case is exercised.
  np.testing.assert_array_equal(rows[period:], rows[:-period])
  assert len(np.unique(rows[:period])) > 20
  if storage == 'int8':
    # Each row spans -127..127 like a quantized random row.
    for q in stored:
      q = np.abs(np.asarray(q, np.int32)).reshape(q.shape[0], -1)
      assert np.all(q.max(axis=1) == 127)
  # Values spread like the converted float32 matrices of the same shape.
  std = lambda tree: np.std(np.concatenate([
      np.asarray(l, np.float32).ravel()
      for l in jax.tree_util.tree_leaves(tree) if l.dtype == storage]))
  assert abs(std(direct) / std(converted) - 1) < 0.2


def test_model_with_stored_random_weights_decodes_on_both_paths():
  assert kernels.available(), kernels.unavailable_reason()
  decodes = []
  for path in ('ffi', 'xla'):
    model = _encdec(**SPARSE)
    decode_step.bind_options(model, (path, 'int8'))
    decode_speed.bind_bench_weights(model, 'stored')
    timer = decode_speed.DecodeTimer(model, tokens=12, prompt_len=5, seed=0)
    memory = timer.memory_by_kind()
    assert any('int8' in kind for kind in memory)
    decodes.append((timer.decode_path,) + timer.logits())
    timer.close()
  (ffi_path, ffi_logits, ffi_tokens), (xla_path, xla_logits, xla_tokens) = (
      decodes)
  assert ffi_path.startswith('ffi') and xla_path.startswith('xla')
  assert ffi_tokens == xla_tokens and len(set(ffi_tokens)) > 1
  np.testing.assert_allclose(ffi_logits, xla_logits, rtol=0, atol=1e-5)


def test_bench_weights_refuses_unknown_source():
  with pytest.raises(errors.TerraformerError, match='bench_weights.created'):
    decode_speed.bench_weights('float64')


# --- The jitted step --------------------------------------------------------


def test_fast_predict_matches_eval_forward_and_donates_the_state():
  inputs, targets = _tokens((1, 7), seed=1), _tokens((1, 6), seed=2)
  eval_model = _encdec(mode='eval', **SPARSE)
  eval_model.init(shapes.signature((inputs, targets)),
                  rng=jax.random.PRNGKey(1))
  full_logits = np.asarray(eval_model((inputs, targets))[0])

  model = _encdec(**SPARSE)
  _, state = model.init((shapes.signature(inputs),
                         shapes.ShapeDtype((1, 1), np.int32)))
  fast = decode_step.FastPredict(model, eval_model.weights, state)
  shifted = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for i in range(targets.shape[1]):
    old_state = fast.state
    steps.append(np.asarray(fast((inputs, shifted[:, i:i + 1]))[0]))
    if i:  # After the first call: caches were updated in place.
      assert all(leaf.is_deleted()
                 for leaf in jax.tree_util.tree_leaves(old_state))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full_logits,
                             atol=2e-4, rtol=2e-4)


def test_check_model():
  with pytest.raises(errors.TerraformerError, match='not a Trax layer'):
    decode_step.check_model(object())
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.TerraformerError, match='3 inputs'):
    decode_step.check_model(tl.Select([0], n_in=3))


# --- Bytes a step reads: against hand counts --------------------------------


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
  model = _lm(n_layers=2, **(SPARSE if sparse else {}))
  result = decode_speed.measure_model(model, tokens=3, prompt_len=70,
                                      repeats=1)
  # Timed positions 70, 71, 72: the 128-position cache bucket.
  expected = np.mean([_lm_step_bytes(2, p, sparse) for p in (70, 71, 72)])
  assert result['bytes_per_token'] == pytest.approx(expected)
  fresh = _lm(n_layers=2, **(SPARSE if sparse else {}))
  assert result['n_params'] == sum(
      np.size(w) for w in jax.tree_util.tree_leaves(
          fresh.init(shapes.ShapeDtype((1, 1), np.int32))[0]))


def test_encoder_decoder_step_bytes_match_hand_count():
  model = _encdec(n_layers=2)
  sig = decode_step.predict_signature(model, prompt_len=9)
  weights, state = model.init(sig)
  step = decode_step.make_step(model)
  _, state = step((_tokens((1, 9), 0), np.zeros((1, 1), np.int32)), weights,
                  state, jax.random.PRNGKey(0))
  by_layer = decode_speed.step_bytes(model, weights, state, position=1)
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


def test_benchmark_fields_are_consistent():
  spec = decode_speed.ModelSpec('tiny', _lm(n_layers=2), _lm(n_layers=0), 2)
  result = decode_speed.benchmark(spec, tokens=2, prompt_len=3, repeats=2,
                                  bandwidth_gbps=10.0)
  assert (result['ms_per_token_min'] <= result['ms_per_token']
          <= result['ms_per_token_max'])
  # A dense block reads all its weights and the first 64-position bucket of
  # its K/V cache: count them from the arrays the two models are built with.
  token = shapes.ShapeDtype((1, 1), np.int32)
  weight_bytes = lambda model: sum(
      np.asarray(w).nbytes
      for w in jax.tree_util.tree_leaves(model.init(token)[0]))
  cache = 2 * 64 * D * F32 + 4
  assert result['bytes_per_block'] == (
      weight_bytes(_lm(n_layers=2)) - weight_bytes(_lm(n_layers=0))) / 2 + (
          cache)
  # Reading the bytes at 10 GB/s is a lower bound of the measured time.
  assert 0 < result['bound_ms_per_token'] < result['ms_per_token_min']


def test_gemv_bandwidth_is_positive():
  median, best = decode_speed.gemv_bandwidth(megabytes=8, repeats=3)
  assert 0 < median <= best


def test_terraformer_decoder_cache_bytes_are_its_filled_bucket():
  from terraformer.models import Terraformer   # pylint: disable=g-import-not-at-top
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
  _, state = step((_tokens((1, prompt_len), 0), np.zeros((1, 1), np.int32)),
                  weights, state, jax.random.PRNGKey(0))
  # The cache holds the 9 encoder positions, then the decoder's: decoder
  # position p is cache index 9 + p, and the step reads the smallest
  # bucket (64, 128, 200) holding indices 0..9 + p.
  per_position = 2 * D * F32 + HEADS    # keys, values, validity (bool)
  for position, bucket in ((1, 64), (54, 64), (55, 128), (150, 200)):
    by_layer = decode_speed.step_bytes(model, weights, state, position,
                                       encoder_len=prompt_len)
    # Two self-attention layers per decoder block (the second one attends
    # to the encoder positions), two blocks.
    assert by_layer['CausalDotProductAttention'] == 2 * 2 * (
        bucket * per_position + 4)


def test_op_counts_include_the_branch_a_conditional_runs():
  def f(i, x):
    branches = [lambda x: x + 1.0,
                lambda x: jnp.sin(jnp.exp(x) @ x.T) @ x + jnp.cos(x)]
    return jax.lax.switch(i, branches, x)
  x = jnp.ones((8, 8))
  text = jax.jit(f).lower(0, x).compile().as_text()
  counts = decode_speed.hlo_op_counts(text)
  assert counts['conditional'] == 1
  # The largest branch runs two dots: they count.
  assert counts.get('dot', 0) + counts.get('fusion', 0) >= 3
  entry_only = text[text.index('\nENTRY'):]
  assert ' dot(' not in entry_only.split('\n}')[0]


def test_int8_sparse_ff_step_bytes_match_hand_count():
  """int8 storage (terraformer/kernels): a selected row is D bytes + its
  float32 scale, for W1ᵀ and W2 each."""
  from terraformer.kernels import layers as kernel_layers  # pylint: disable=g-import-not-at-top
  from terraformer.layers.sparse_ff import SparseFF  # pylint: disable=g-import-not-at-top
  layer = SparseFF(D_FF, N, LOWRANK, mode='predict')
  weights, state = layer.init(shapes.ShapeDtype((1, 1, D), np.float32))
  kernel_layers.install(layer)
  stored = kernel_layers.store_weights(layer, weights, 'int8')
  blocks = D_FF // N
  expected = ((D * LOWRANK + LOWRANK * D_FF + D_FF + D) * F32
              + 2 * blocks * (D * 1 + F32))
  assert decode_speed.step_bytes(layer, stored, state, 0) == {
      'KernelSparseFF': expected}
  f32 = decode_speed.step_bytes(layer, weights, state, 0)['KernelSparseFF']
  assert f32 - expected == 2 * blocks * (D * (F32 - 1) - F32)
