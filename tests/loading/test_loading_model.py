"""A checkpoint as a model: `load_model`, `with_weights`, `checkpoint_path`.

terraformer-decode and -eval load trained checkpoints end to end in
tests/cli/; here a tiny model's weights go through a checkpoint file.
"""
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer import errors
from terraformer.decoding import search as decoding
from terraformer.loading import model as loading_model
from terraformer.models import ScalingTransformer
from terraformer.trax_bridge import checkpoint_import

VOCAB = 30
TINY = dict(input_vocab_size=VOCAB, d_model=16, d_ff=32, n_heads=2,
            n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=32,
            d_lowrank=4, ff_sparsity=4, attention_sparsity=2,
            loss_sparsity=2)
EVAL_SIG = (shapes.ShapeDtype((2, 8), np.int32),) * 2
PREDICT_SIG = (shapes.ShapeDtype((1, 8), np.int32),
               shapes.ShapeDtype((1, 1), np.int32))


def _model(mode, **overrides):
  return ScalingTransformer(mode=mode, **dict(TINY, **overrides))


@pytest.fixture(scope='module')
def source():
  """An initialized eval-mode model: the weights every test loads."""
  model = _model('eval')
  model.init(EVAL_SIG, rng=jax.random.PRNGKey(3))
  return model


def _tokens():
  return np.random.RandomState(1).randint(2, VOCAB, (2, 8)).astype(np.int32)


def test_with_weights_gives_the_same_function(source):
  weights_sig = decoding.weights_signature(_model('eval'), EVAL_SIG)
  assert [w.shape for w in jax.tree_util.tree_leaves(weights_sig)] == [
      w.shape for w in jax.tree_util.tree_leaves(source.weights)]
  model = loading_model.with_weights(_model('eval'), source.weights, EVAL_SIG)
  x = _tokens()
  np.testing.assert_allclose(np.asarray(model((x, x))[0]),
                             np.asarray(source((x, x))[0]), atol=1e-6)
  # A predict-mode model with these weights decodes like one given them
  # after a normal init.
  predict = loading_model.with_weights(_model('predict'), source.weights,
                                       PREDICT_SIG)
  reference = _model('predict')
  reference.init(PREDICT_SIG)
  reference.weights = source.weights
  np.testing.assert_array_equal(
      decoding.decode(predict, x[:1], max_length=5, eos_id=None),
      decoding.decode(reference, x[:1], max_length=5, eos_id=None))


def test_load_model_reads_the_weights_and_step_of_a_checkpoint(source,
                                                                tmp_path):
  checkpoint_import.write_checkpoint(source.weights, str(tmp_path), step=7)
  model, step = loading_model.load_model(_model, str(tmp_path), 'eval',
                                         EVAL_SIG)
  assert step == 7
  x = _tokens()
  np.testing.assert_allclose(np.asarray(model((x, x))[0]),
                             np.asarray(source((x, x))[0]), atol=1e-6)
  # Every mode has the same weight tree (with_weights above decodes).
  predict, _ = loading_model.load_model(_model, str(tmp_path), 'predict',
                                        PREDICT_SIG)
  for got, want in zip(jax.tree_util.tree_leaves(predict.weights),
                       jax.tree_util.tree_leaves(source.weights), strict=True):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize('overrides, message', [
    (dict(n_decoder_layers=2), r'has \d+ weight arrays, the configured model'),
    (dict(d_ff=64), r'weight of shape \(\d+, 32\) where the configured model '
                    r'has \(\d+, 64\)'),
])
def test_load_model_refuses_a_checkpoint_of_another_config(
    source, tmp_path, overrides, message):
  checkpoint_import.write_checkpoint(source.weights, str(tmp_path))
  with pytest.raises(errors.TerraformerError,
                     match=message + '.*was it trained with this config'):
    loading_model.load_model(lambda mode: _model(mode, **overrides),
                             str(tmp_path), 'eval', EVAL_SIG)


def test_checkpoint_path_errors(tmp_path):
  with pytest.raises(errors.TerraformerError, match='no checkpoint'):
    loading_model.checkpoint_path(str(tmp_path))
  with pytest.raises(errors.TerraformerError, match='--output_dir'):
    loading_model.checkpoint_path('')
