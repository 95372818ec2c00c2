"""Long-input mechanisms inside the models: encoder pooling
(Transpooler / Pyramidion), blockwise and composite slice attention."""
import gin
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer.trax_bridge import compat
from terraformer.cli import common
from terraformer.errors import TerraformerError
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM
from terraformer.models import Terraformer

from decode_steps import eval_and_decode_logits  # tests/models/

compat.apply()

VOCAB = 64
TERRAFORMER = dict(input_vocab_size=VOCAB, d_model=32, d_ff=64,
                   n_encoder_layers=2, n_decoder_layers=1, n_heads=4,
                   dropout=0.0, max_len=64, ff_sparsity=8, d_lowrank=4,
                   loss_sparsity=4, d_sru=8, encoder_attention_type='full',
                   decoder_attention_type='full', predict_mem_len=32)
ENCDEC = dict(input_vocab_size=VOCAB, d_model=32, d_ff=64, n_encoder_layers=2,
              n_decoder_layers=1, n_heads=4, dropout=0.0, max_len=32,
              d_lowrank=4, ff_sparsity=8, loss_sparsity=4)


def _tokens(shape, seed):
  return np.random.RandomState(seed).randint(1, VOCAB, size=shape).astype(
      np.int32)


def _eval_and_predict_logits(make, inputs, targets):
  """Logits of the eval forward pass and of token-by-token decoding."""
  return eval_and_decode_logits(make, targets, inputs,
                                rng=jax.random.PRNGKey(3))


@pytest.mark.parametrize('schedule', [{1: 4}, {0: 8, 1: 2}],
                         ids=['transpooler', 'pyramidion'])
def test_pooled_terraformer_decodes_as_it_evaluates(schedule):
  inputs, targets = _tokens((2, 16), 1), _tokens((2, 5), 2)
  inputs[0, 11:] = 0
  full, steps, _ = _eval_and_predict_logits(
      lambda mode: Terraformer(mode=mode, encoder_pooling=schedule,
                               **TERRAFORMER), inputs, targets)
  assert full.shape == (2, 5, VOCAB)
  np.testing.assert_allclose(steps, full, atol=2e-4, rtol=2e-4)


def _find(layer, prefix):
  if layer.name.startswith(prefix):
    return layer
  for sub in layer.sublayers:
    found = _find(sub, prefix)
    if found is not None:
      return found
  return None


def test_gradients_reach_the_pooling_scorer():
  inputs, targets = _tokens((2, 8), 3), _tokens((2, 4), 4)
  model = Terraformer(mode='eval', encoder_pooling={1: 2}, **TERRAFORMER)
  model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(5))
  scorer_w = _find(model, 'StreamPooling').weights[0][0]
  leaves, tree = jax.tree_util.tree_flatten(model.weights)
  (index,) = [i for i, leaf in enumerate(leaves) if leaf is scorer_w]

  def loss(w):
    weights = jax.tree_util.tree_unflatten(
        tree, leaves[:index] + [w] + leaves[index + 1:])
    logits = model.pure_fn((inputs, targets), weights, model.state,
                           jax.random.PRNGKey(0))[0][0]
    return jax.numpy.sum(jax.nn.log_softmax(logits)[..., 1])

  grad = np.asarray(jax.grad(loss)(scorer_w))
  assert grad.shape == (32,) and np.abs(grad).max() > 1e-6


def test_blockwise_encoder_with_one_block_is_full_attention():
  inputs, targets = _tokens((2, 8), 6), _tokens((2, 4), 7)
  inputs[1, 6:] = 0
  logits = {}
  weights = None
  for attention in ('full', 'blockwise'):
    model = Terraformer(mode='eval', **{**TERRAFORMER,
                                        'encoder_attention_type': attention,
                                        'block_len': 8})
    model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(8))
    if weights is None:
      weights = jax.tree_util.tree_leaves(model.weights)
    else:
      model.weights = jax.tree_util.tree_unflatten(
          jax.tree_util.tree_structure(model.weights), weights)
    logits[attention] = np.asarray(model((inputs, targets))[0])
  np.testing.assert_allclose(logits['blockwise'], logits['full'], atol=1e-5)


def test_blockwise_blocks_do_not_talk():
  """Blocks of 4: changing a token of the first block leaves the encoder
  outputs of the second block's tokens alone (one encoder layer)."""
  from terraformer.layers.attention import SelfAttention  # pylint: disable=g-import-not-at-top
  layer = SelfAttention(32, 4, 'blockwise', causal=False, block_len=4,
                        mode='eval')
  x = np.random.RandomState(9).randn(1, 8, 32).astype(np.float32)
  mask = np.ones((1, 8), bool)
  layer.init(shapes.signature((x, mask)), rng=jax.random.PRNGKey(1))
  y = np.asarray(layer((x, mask)))
  x2 = x.copy()
  x2[0, 1] += 1.0
  y2 = np.asarray(layer((x2, mask)))
  np.testing.assert_array_equal(y2[0, 4:], y[0, 4:])
  assert np.abs(y2[0, :4] - y[0, :4]).max() > 1e-3


def test_cst_terraformer_decodes_as_it_evaluates():
  inputs, targets = _tokens((2, 8), 10), _tokens((2, 6), 11)
  inputs[0, 5:] = 0  # each example decodes at its own positions
  full, steps, _ = _eval_and_predict_logits(
      lambda mode: Terraformer(mode=mode, **{
          **TERRAFORMER, 'encoder_attention_type': 'cst',
          'decoder_attention_type': 'cst', 'cst_slice_len': 4,
          'cst_extension': 3}), inputs, targets)
  np.testing.assert_allclose(steps, full, atol=2e-4, rtol=2e-4)


def test_cst_language_model_decodes_as_it_evaluates():
  tokens = _tokens((2, 12), 12)
  config = dict(vocab_size=VOCAB, d_model=32, d_ff=64, n_layers=2, n_heads=4,
                dropout=0.0, max_len=16, ff_sparsity=8, d_lowrank=4,
                loss_sparsity=4, attention_type='cst', cst_slice_len=4,
                cst_extension=3)
  full, steps, _ = eval_and_decode_logits(
      lambda mode: ScalingTransformerLM(mode=mode, **config), tokens,
      rng=jax.random.PRNGKey(13))
  np.testing.assert_allclose(steps, full, atol=2e-4, rtol=2e-4)


CST_LM = dict(vocab_size=VOCAB, d_model=32, d_ff=64, n_layers=2, n_heads=4,
              dropout=0.0, max_len=16, d_lowrank=4, attention_type='cst',
              cst_slice_len=4, cst_extension=1)


@pytest.mark.parametrize('positions', [True, False])
def test_cst_language_model_positions_only_from_its_tables(positions):
  """positions=False (CST's form, §4.2): MS-VIPE is the only position
  signal. Local only (α 1, no global branch), a slice then reads its own
  tokens through tables relative to the slice: the same inputs one slice
  later give the same logits. Trax's table of absolute positions breaks
  that."""
  big_l = CST_LM['cst_slice_len']
  tokens = _tokens((1, 2 * big_l), 14)
  # Inputs are shifted right: slice 0 reads (0, t_0..t_2), slice 1 reads
  # (t_3..t_6); make them equal.
  tokens[0, big_l - 1] = 0
  tokens[0, big_l:2 * big_l - 1] = tokens[0, :big_l - 1]
  gin.bind_parameter('terraformer.CompositeSliceAttention.use_global', False)
  try:
    model = ScalingTransformerLM(mode='eval', positions=positions, **CST_LM)
    model.init(shapes.signature(tokens), rng=jax.random.PRNGKey(15))
    logits = np.asarray(model(tokens))
  finally:
    gin.clear_config()
  same = np.allclose(logits[0, big_l:], logits[0, :big_l], atol=1e-5)
  assert same == (not positions)


def test_language_model_without_positions_decodes_as_it_evaluates():
  full, steps, model = eval_and_decode_logits(
      lambda mode: ScalingTransformerLM(mode=mode, positions=False,
                                        **dict(CST_LM, cst_extension=3)),
      _tokens((2, 12), 16), rng=jax.random.PRNGKey(17))
  np.testing.assert_allclose(steps, full, atol=2e-4, rtol=2e-4)
  # No (max_len, d_model) table of positions.
  shapes_of = [np.shape(w) for w in jax.tree_util.tree_leaves(model.weights)]
  assert (16, 32) not in shapes_of


@pytest.mark.parametrize('attention', ['blockwise', 'cst', 'lsh'])
def test_pooled_encoder_decoder_decodes_as_it_evaluates(attention):
  inputs, targets = _tokens((2, 16), 14), _tokens((2, 5), 15)
  inputs[1, 9:] = 0
  full, steps, _ = _eval_and_predict_logits(
      lambda mode: ScalingTransformer(
          mode=mode, encoder_attention_type=attention, block_len=8,
          cst_slice_len=4, lsh_chunk_len=4, lsh_n_hashes=2,
          encoder_pooling={0: 8, 1: 4}, **ENCDEC),
      inputs, targets)
  np.testing.assert_allclose(steps, full, atol=2e-4, rtol=2e-4)


def test_lsh_encoder_reads_the_input_and_hashes_by_its_eval_key():
  """The encoder-decoder's LSH encoder: a fixed eval key gives the same
  logits twice; another key hashes otherwise (other logits); the encoder
  input reaches the logits."""
  inputs, targets = _tokens((2, 16), 18), _tokens((2, 4), 19)
  logits = {}
  for seed in (0, 5):
    model = ScalingTransformer(mode='eval', encoder_attention_type='lsh',
                               lsh_chunk_len=4, lsh_eval_seed=seed, **ENCDEC)
    model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(20))
    if seed == 0:
      weights = model.weights
      again = np.asarray(model((inputs, targets))[0])
    model.weights = weights
    logits[seed] = np.asarray(model((inputs, targets))[0])
  np.testing.assert_array_equal(logits[0], again)
  assert np.abs(logits[5] - logits[0]).max() > 1e-5
  changed = inputs.copy()
  changed[:, 3] = changed[:, 3] % (VOCAB - 1) + 1
  model.weights = weights
  assert np.abs(np.asarray(model((changed, targets))[0])
                - logits[5]).max() > 1e-5


@pytest.mark.parametrize('build, message', [
    (lambda: Terraformer(n_encoder_layers=2, encoder_pooling={2: 4}),
     'not an encoder block index'),
    (lambda: Terraformer(n_encoder_layers=2, encoder_pooling={0: 4, 1: 8}),
     'must shrink'),
    (lambda: Terraformer(decoder_attention_type='blockwise'),
     'encoder (bidirectional) attention'),
    (lambda: Terraformer(encoder_attention_type='cst', attention_sparsity=4),
     'set attention_sparsity=0'),
    (lambda: ScalingTransformerLM(attention_type='lsh'),
     "attention_type must be one of ('full', 'cst')"),
    (lambda: ScalingTransformer(encoder_attention_type='cst',
                                attention_sparsity=4),
     'set encoder_attention_sparsity=0'),
])
def test_configuration_errors_are_one_line(build, message):
  with pytest.raises(TerraformerError) as error:
    build()
  # gin appends its own context on the lines after ours.
  assert message in str(error.value).splitlines()[0]


def test_non_power_of_two_ratio_is_a_clear_error():
  """Raised in the layer's init, where Trax wraps it in a LayerError; the
  CLIs print its one line (`common.wrapped_user_error`)."""
  inputs, targets = _tokens((1, 12), 16), _tokens((1, 4), 17)
  model = Terraformer(mode='eval', encoder_pooling={1: 4}, **TERRAFORMER)
  with pytest.raises(Exception) as error:
    model.init(shapes.signature((inputs, targets)))
  assert common.wrapped_user_error(error.value) == (
      'successive-halving top-k pools n=12 representations to k=4: the ratio '
      'n/k must be a power of 2 (1, 2, 4, ...), got 3')
  assert common.wrapped_user_error(ValueError('unrelated')) is None


# Pyramidion's scorer ablation (App. A, Table 4) and the paper's decoder
# without positions (App. C.1): switches of ScalingTransformer.
TINY_ENCDEC = dict(input_vocab_size=VOCAB, d_model=16, d_ff=32,
                   n_encoder_layers=2, n_decoder_layers=1, n_heads=2,
                   dropout=0.0, max_len=32, encoder_pooling={0: 4})


def _n_weights(model, inputs, targets):
  model.init(shapes.signature((inputs, targets)), rng=jax.random.PRNGKey(4))
  return [np.shape(w) for w in jax.tree_util.tree_leaves(model.weights)]


def test_scorer_switches_change_only_the_pooling_weights():
  inputs, targets = _tokens((2, 16), 21), _tokens((2, 3), 22)
  shapes_of = {scorer: _n_weights(ScalingTransformer(
      mode='eval', pooling_scorer=scorer, **TINY_ENCDEC), inputs, targets)
               for scorer in ('linear', 'nonlinear', 'random', 'mean')}
  default = _n_weights(ScalingTransformer(mode='eval', **TINY_ENCDEC),
                       inputs, targets)
  assert shapes_of['linear'] == default
  # The linear scorer's w [d] and b []; RoBERTa's head adds W1 [d, d], b1.
  assert len(default) - len(shapes_of['random']) == 2
  assert len(shapes_of['random']) == len(shapes_of['mean'])
  assert len(shapes_of['nonlinear']) - len(default) == 2
  assert (16, 16) in shapes_of['nonlinear']
  normed = _n_weights(ScalingTransformer(
      mode='eval', pooling_scorer_norm=True, **TINY_ENCDEC), inputs, targets)
  assert len(normed) - len(default) == 2  # The scorer's LayerNorm.
  with pytest.raises(TerraformerError, match='pooling_scorer'):
    ScalingTransformer(pooling_scorer='power', **TINY_ENCDEC)


def test_decoder_without_positions_decodes_as_it_evaluates():
  inputs, targets = _tokens((2, 16), 23), _tokens((2, 4), 24)
  inputs[1, 10:] = 0
  config = dict(TINY_ENCDEC, decoder_positions=False,
                pooling_scorer='nonlinear', pooling_scorer_norm=True)
  full, steps, model = _eval_and_predict_logits(
      lambda mode: ScalingTransformer(mode=mode, **config), inputs, targets)
  np.testing.assert_allclose(steps, full, atol=2e-4, rtol=2e-4)
  # One positions table less than the default model (the decoder's).
  with_positions = _n_weights(ScalingTransformer(
      mode='eval', **dict(config, decoder_positions=True)), inputs, targets)
  got = [np.shape(w) for w in jax.tree_util.tree_leaves(model.weights)]
  assert len(with_positions) - len(got) == 1
  assert with_positions.count((32, 16)) - got.count((32, 16)) == 1
