"""LocalConv and the models' local_conv_len switch (not in the papers)."""
import jax
import numpy as np
import pytest
from trax import shapes

from terraformer.errors import TerraformerError
from terraformer.layers import LocalConv
from terraformer.models import ScalingTransformer
from terraformer.models import ScalingTransformerLM

TINY = dict(d_model=16, d_ff=32, n_heads=2, dropout=0.0, max_len=32,
            d_lowrank=4)


def test_each_position_sums_itself_and_the_positions_before():
  x = np.random.RandomState(0).randn(2, 6, 8).astype(np.float32)
  layer = LocalConv(8, kernel_size=3, mode='eval')
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  kernel, bias = (np.asarray(w) for w in layer.weights)
  assert kernel.shape == (3, 1, 8, 8)
  padded = np.pad(x, ((0, 0), (2, 0), (0, 0)))
  # y_t = b + x_{t-2} K_0 + x_{t-1} K_1 + x_t K_2 (zeros before the start).
  expected = bias + sum(padded[:, h:h + 6] @ kernel[h, 0] for h in range(3))
  np.testing.assert_allclose(np.asarray(layer(x)), expected, atol=1e-5)


def test_predict_steps_equal_the_whole_sequence():
  x = np.random.RandomState(1).randn(2, 5, 8).astype(np.float32)
  layer = LocalConv(8, kernel_size=3, mode='eval')
  layer.init(shapes.signature(x), rng=jax.random.PRNGKey(1))
  step = LocalConv(8, kernel_size=3, mode='predict')
  step.init(shapes.signature(x[:, :1]))
  step.weights = layer.weights
  steps = [np.asarray(step(x[:, i:i + 1])) for i in range(5)]
  np.testing.assert_allclose(np.concatenate(steps, axis=1),
                             np.asarray(layer(x)), atol=1e-5)


def _local_convs(layer):
  found = int(layer.name == 'ModuleConv_3x1')
  return found + sum(_local_convs(s) for s in layer.sublayers)


@pytest.mark.parametrize('build, n_attentions', [
    (lambda c: ScalingTransformerLM(vocab_size=40, n_layers=2,
                                    local_conv_len=c, **TINY), 2),
    (lambda c: ScalingTransformerLM(vocab_size=40, n_layers=2,
                                    attention_type='cst', cst_slice_len=4,
                                    cst_extension=1, local_conv_len=c,
                                    **TINY), 2),
    (lambda c: ScalingTransformer(input_vocab_size=40, n_encoder_layers=2,
                                  n_decoder_layers=1,
                                  encoder_attention_type='blockwise',
                                  block_len=4, encoder_pooling={1: 4},
                                  local_conv_len=c, **TINY), 3),
])
def test_one_local_conv_before_each_self_attention(build, n_attentions):
  tokens = np.random.RandomState(2).randint(1, 40, (2, 16)).astype(np.int32)
  with_conv, without = build(3), build(0)
  assert _local_convs(with_conv) == n_attentions
  assert _local_convs(without) == 0
  inputs = tokens if with_conv.n_in == 1 else (tokens, tokens[:, :4])
  with_conv.init(shapes.signature(inputs), rng=jax.random.PRNGKey(0))
  out = with_conv(inputs)
  logits = out[0] if isinstance(out, tuple) else out
  assert np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize('value', [-1, True, 2.0])
def test_bad_local_conv_len_is_one_clear_error(value):
  with pytest.raises(TerraformerError, match='local_conv_len'):
    ScalingTransformerLM(vocab_size=40, n_layers=1, local_conv_len=value,
                         **TINY)
