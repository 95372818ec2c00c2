"""The benchmarks' random weights (terraformer/benchmarks/weight_factory.py):
shapes filled without init, run-once weights shared, int8/bf16 made directly
in the decode storage, the gin switch between the two."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from terraformer import errors
from terraformer import kernels
from terraformer.benchmarks import decode_speed
from terraformer.benchmarks import weight_factory
from terraformer.decoding import step as decode_step
from terraformer.kernels import layers as kernel_layers

from bench_models import D, D_FF, SPARSE, encdec, lm  # tests/bench_models.py


def test_random_weights_fill_the_shapes():
  model = lm(**SPARSE)
  sig = decode_step.predict_signature(model)
  weight_shapes, _ = decode_step.init_shapes(model, sig)
  weights = weight_factory.random_weights(weight_shapes, seed=3)
  leaves = jax.tree_util.tree_leaves(weights)
  assert [(l.shape, l.dtype) for l in leaves] == [
      (s.shape, s.dtype) for s in jax.tree_util.tree_leaves(weight_shapes)]
  assert all(np.isfinite(np.asarray(l)).all() for l in leaves)
  assert np.std(np.asarray(leaves[0])) > 0


def test_random_weights_share_only_what_decoding_never_reads():
  model = encdec(n_layers=2)
  sig = decode_step.predict_signature(model, prompt_len=5)
  weight_shapes, _ = decode_step.init_shapes(model, sig)
  weights = weight_factory.random_weights(weight_shapes, model=model)
  run_once = jax.tree_util.tree_leaves(
      weight_factory._run_once_mask(model, weight_shapes))  # pylint: disable=protected-access
  leaves = jax.tree_util.tree_leaves(weights)
  stepped = [id(l) for l, once in zip(leaves, run_once) if not once]
  assert len(set(stepped)) == len(stepped)
  # Encoder (1 block + embedding + norm) and the 2 blocks' cross-attention
  # keys and values run once; their [D, D] matrices share one array.
  once = [l for l, flag in zip(leaves, run_once) if flag]
  square = [l for l in once if l.shape == (D, D)]
  assert len(square) == 4 + 2 * 2 and len({id(l) for l in square}) == 1
  unique = {id(l): l.nbytes for l in leaves}
  assert weight_factory.weights_memory(weight_shapes, model) == sum(
      unique.values())
  assert weight_factory.weights_memory(weight_shapes) == sum(
      l.nbytes for l in leaves)


@pytest.mark.parametrize('storage', ['int8', 'bfloat16'])
def test_stored_random_weights_have_store_weights_structure(storage,
                                                            monkeypatch):
  # A small block: matrices repeat rows, the embedding repeats its block.
  monkeypatch.setattr(weight_factory, 'RANDOM_BLOCK', 3 * D_FF)
  model = encdec(**SPARSE)
  weight_shapes, _ = decode_step.init_shapes(
      model, decode_step.predict_signature(model, prompt_len=5))
  decode_step.make_step(model, options=('ffi', storage))  # Installs layers.
  converted = kernel_layers.store_weights(
      model, weight_factory.random_weights(weight_shapes, model=model), storage)
  direct = weight_factory.random_stored_weights(model, weight_shapes, storage)
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
  period = max(1, weight_factory.RANDOM_BLOCK // rows.shape[1])
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
    model = encdec(**SPARSE)
    decode_step.bind_options(model, (path, 'int8'))
    weight_factory.bind_bench_weights(model, 'stored')
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
    weight_factory.bench_weights('float64')


def test_noise_is_relative_to_each_arrays_rms_and_refused_when_stored():
  weights = {'w': np.full((128, 64), -2.0, np.float32),
             'v': np.full((64,), 0.5, np.float32),
             'ids': np.arange(4, dtype=np.int32)}
  noisy = weight_factory.with_noise(weights, 0.1, seed=3)
  for key, rms in (('w', 2.0), ('v', 0.5)):
    delta = np.asarray(noisy[key]) - weights[key]
    assert np.std(delta) == pytest.approx(0.1 * rms, rel=0.25)
    assert abs(np.mean(delta)) < 0.05 * rms
    assert noisy[key].dtype == np.float32
  np.testing.assert_array_equal(noisy['ids'], weights['ids'])
  np.testing.assert_array_equal(
      weight_factory.with_noise(weights, 0.1, seed=3)['w'], noisy['w'])
  # Random weights made in their storage take no noise (nor given weights).
  model = lm(n_layers=1)
  decode_step.bind_options(model, ('xla', 'int8'))
  weight_factory.bind_bench_weights(model, 'stored', noise=0.1)
  shapes_ = decode_step.init_shapes(model, decode_step.predict_signature(
      model, 3))
  with pytest.raises(errors.TerraformerError, match='no noise'):
    weight_factory.decode_weights(model, shapes_[0])
