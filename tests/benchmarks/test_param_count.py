"""Shape-only parameter counting, checked against formulas and real inits."""
import copy
import json

import gin
import jax
import numpy as np
import pytest
import trax
from trax import fastmath
from trax import layers as tl
from trax import shapes

from terraformer import errors
from terraformer.benchmarks import param_count
from terraformer.trax_bridge import compat

import peak_rss  # tests/peak_rss.py


def lm(vocab=32, d_model=16, d_ff=32, n_layers=1, max_len=64):
  return lambda mode: trax.models.TransformerLM(
      vocab, d_model=d_model, d_ff=d_ff, n_layers=n_layers, n_heads=2,
      max_len=max_len, mode=mode)


def lm_formula(vocab=32, d_model=16, d_ff=32, n_layers=1, max_len=64):
  """TransformerLM parameters by layer class, by hand."""
  d = d_model
  per_layer = 4 * (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)
  return {
      'Embedding': vocab * d,
      'PositionalEncoding': max_len * d,
      'LayerNorm': (2 * n_layers + 1) * 2 * d,
      'Dense': n_layers * per_layer + d * vocab + vocab,
  }


def real_count(layer, signature):
  """Parameter count from a real (allocating) init."""
  weights, _ = layer.init(signature)
  return sum(int(np.size(w)) for w in fastmath.tree_flatten(weights)
             if hasattr(w, 'shape'))


@pytest.mark.parametrize('n_layers, d_ff', [(1, 32), (3, 48)])
def test_lm_matches_formula_and_real_init(n_layers, d_ff):
  count = param_count.count_parameters(lm(n_layers=n_layers, d_ff=d_ff),
                                       length=16)
  expected = lm_formula(n_layers=n_layers, d_ff=d_ff)
  assert count.by_layer == expected
  assert count.total == sum(expected.values())
  layer = lm(n_layers=n_layers, d_ff=d_ff)('eval')
  assert count.total == real_count(
      layer, shapes.ShapeDtype((1, 16), np.int32))


@pytest.mark.parametrize('output_vocab', [None, 24])
def test_encoder_decoder_signature_from_n_in(output_vocab):
  model = lambda mode: trax.models.Transformer(
      32, output_vocab_size=output_vocab, d_model=16, d_ff=32,
      n_encoder_layers=1, n_decoder_layers=2, n_heads=2, max_len=64,
      mode=mode)
  layer = model('eval')
  assert layer.n_in == 2
  signature = param_count.input_signature_for(layer, batch_size=2, length=8)
  assert [s.shape for s in signature] == [(2, 8), (2, 8)]
  count = param_count.count_parameters(model, length=8)
  assert count.total == real_count(layer, signature)
  d, v_out = 16, output_vocab or 32
  attention, ff = 4 * (d * d + d), (d * 32 + 32) + (32 * d + d)
  assert count.by_layer == {
      # Without output_vocab_size, Trax shares one embedding (counted once).
      'Embedding': 32 * d + (output_vocab or 0) * d,
      'PositionalEncoding': 2 * 64 * d,
      # Encoder: 1 x (attention, FF); decoder: 2 x (self, enc-dec, FF).
      'Dense': (attention + ff) + 2 * (2 * attention + ff) + d * v_out + v_out,
      'LayerNorm': (1 * 2 + 1 + 2 * 3 + 1) * 2 * d,
  }


def test_shared_layer_counted_once():
  dense = tl.Dense(4)
  model = tl.Serial(dense, tl.Relu(), dense, tl.LayerNorm())
  count = param_count.count_layer_params(
      model, shapes.ShapeDtype((2, 4), np.float32))
  assert count.by_layer == {'Dense': 4 * 4 + 4, 'LayerNorm': 2 * 4}
  assert count.total == 28


def test_model_is_left_untouched():
  layer = lm()('eval')
  signature = shapes.ShapeDtype((1, 16), np.int32)
  before = fastmath.tree_flatten((layer.weights, layer.state))
  param_count.count_layer_params(layer, signature)
  after = fastmath.tree_flatten((layer.weights, layer.state))
  assert before == after == []  # Still uninitialized: no tracers stored.
  layer.init(signature)  # And still usable.
  y = layer(np.zeros((1, 16), np.int32))
  assert y.shape == (1, 16, 32)
  assert not any(isinstance(x, jax.core.Tracer)
                 for x in jax.tree_util.tree_leaves(layer.weights))


_COUNT_800M = """
import json
import terraformer  # Before Trax: compat fix 0 (Trax imports in 4 s, not 25).
import trax
from terraformer.benchmarks import param_count
model = lambda mode: trax.models.TransformerLM(
    32000, d_model=2048, d_ff=8192, n_layers=16, n_heads=2, max_len=2048,
    mode=mode)
count = param_count.count_parameters(model, length=1024)
print(json.dumps({'by_layer': count.by_layer, 'total': count.total}))
"""


def test_800m_model_counted_without_allocating():
  """Counted in a child process whose own peak RSS is measured (os.wait4):
  float32 weights alone would be 3.6 GB; Python + Trax + TF take ~1 GB."""
  code, out, err, peak_kib = peak_rss.run_python(_COUNT_800M, timeout=600)
  assert code == 0, err[-3000:]
  result = json.loads(out.strip().splitlines()[-1])
  expected = lm_formula(vocab=32000, d_model=2048, d_ff=8192, n_layers=16,
                        max_len=2048)
  assert result['by_layer'] == expected
  assert result['total'] > 900e6
  assert peak_kib < 2.5 * 2**20, f'peak RSS {peak_kib / 2**20:.2f} GiB'


def test_model_from_gin_train_binding():
  from terraformer.training import loop as training  # pylint: disable=unused-import
  gin.clear_config()
  gin.parse_config([
      'terraformer.train.model = @trax.models.TransformerLM',
      'TransformerLM.vocab_size = 32', 'TransformerLM.d_model = 16',
      'TransformerLM.d_ff = 32', 'TransformerLM.n_layers = 2',
      'TransformerLM.n_heads = 2', 'TransformerLM.max_len = 64',
      'count_parameters.length = 16',
  ])
  try:
    count = param_count.count_parameters()
    expected = lm_formula(n_layers=2)
    assert count == param_count.ParamCount(expected, sum(expected.values()))
    gin.clear_config()
    with pytest.raises(errors.TerraformerError, match='no model configured'):
      param_count.count_parameters()
  finally:
    gin.clear_config()


def _plain_weight_shapes(model, signature):
  """weight_shapes with Trax's own init (compat fix 7 undone)."""
  scratch = copy.deepcopy(model)
  compat.undo('init_traces')
  try:
    return jax.eval_shape(
        lambda rng: scratch.init(signature, rng=rng)[0], jax.random.PRNGKey(0))
  finally:
    compat.apply()


def _leaf_shapes(tree):
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, [(tuple(x.shape), str(x.dtype)) for x in leaves]


@pytest.mark.parametrize('name', ['terraformer', 'scaling_lm_sparse',
                                  'scaling_encoder_decoder'])
def test_weight_shapes_equal_trax_init_shapes(name):
  """Tracing each sublayer's forward once per signature (compat fix 7) gives
  the weight tree of Trax's own init."""
  from terraformer.models import scaling_transformer  # pylint: disable=g-import-not-at-top
  from terraformer.models import terraformer  # pylint: disable=g-import-not-at-top
  small = dict(d_model=16, d_ff=32, n_heads=2, d_lowrank=4, max_len=64,
               dropout=0.1, mode='train')
  model = {
      'terraformer': lambda: terraformer.Terraformer(
          input_vocab_size=32, n_encoder_layers=2, n_decoder_layers=2,
          ff_sparsity=4, attention_sparsity=2, loss_sparsity=2, d_sru=8,
          lsh_chunk_len=8, predict_mem_len=48, predict_drop_len=16, **small),
      'scaling_lm_sparse': lambda: scaling_transformer.ScalingTransformerLM(
          vocab_size=32, n_layers=2, ff_sparsity=4, attention_sparsity=2,
          loss_sparsity=2, **small),
      'scaling_encoder_decoder': lambda: scaling_transformer.ScalingTransformer(
          input_vocab_size=32, n_encoder_layers=2, n_decoder_layers=2,
          ff_sparsity=4, **small),
  }[name]()
  signature = param_count.input_signature_for(model, batch_size=2, length=16)
  fast = param_count.weight_shapes(model, signature)
  assert _leaf_shapes(fast) == _leaf_shapes(
      _plain_weight_shapes(model, signature))
