"""CrossAttention: Trax's tl.PureAttention, keys and values split once when
decoding."""
import os

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from trax import layers as tl
from trax import shapes

from terraformer import config
from terraformer.cli import common
from terraformer.layers.cross_attention import CrossAttention

GIN_DIR = os.path.join(os.path.dirname(__file__), '..', '..', 'gin')

B, L, D, H = 2, 7, 16, 4


def _inputs(seed, q_len=1):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(B, q_len, D)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  # Example 0 has 5 real encoder positions, example 1 all 7.
  mask = jnp.asarray(np.arange(L)[None] < np.array([[5], [7]]))
  return q, k, v, mask[:, None, None, :]


@pytest.mark.parametrize('mode', ['train', 'eval'])
def test_other_modes_are_traxs_layer(mode):
  layer, trax_layer = (CrossAttention(n_heads=H, mode=mode),
                       tl.PureAttention(n_heads=H, mode=mode))
  x = _inputs(0, q_len=3)
  sig = shapes.signature(x)
  layer.init(sig)
  trax_layer.init(sig)
  np.testing.assert_array_equal(layer(x)[0], trax_layer(x)[0])


def test_decoding_steps_equal_traxs_layer_and_read_the_first_calls_keys():
  """Step 1 gets the encoder's k, v (new); later steps get the same k, v
  from tl.Cache: each output equals Trax's on the same inputs, and the
  layer attends with the keys and values it split at step 1."""
  layer = CrossAttention(n_heads=H, mode='predict')
  trax_layer = tl.PureAttention(n_heads=H, mode='predict')
  q, k, v, mask = _inputs(1)
  sig = shapes.signature((q, k, v, mask))
  _, state = layer.init(sig)
  trax_layer.init(sig)
  assert not state  # Empty until the first call, as tl.Cache's slot.
  for step in range(3):
    q = _inputs(10 + step)[0]
    y, m = layer((q, k, v, mask))
    y_trax, _ = trax_layer((q, k, v, mask))
    np.testing.assert_allclose(y, y_trax, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(m, mask)
  keys_t, values = layer.state
  assert keys_t.shape == (B, H, D // H, L) and values.shape == (B, H, L, D // H)
  # Later calls read the state, not their k and v.
  y_state, _ = layer((q, k * 0, v * 0, mask))
  np.testing.assert_allclose(y_state, y_trax, rtol=1e-6, atol=1e-6)


def test_masked_positions_get_no_weight():
  layer = CrossAttention(n_heads=H, mode='predict')
  q, k, v, mask = _inputs(2)
  layer.init(shapes.signature((q, k, v, mask)))
  y, _ = layer((q, k, v, mask))
  layer2 = CrossAttention(n_heads=H, mode='predict')
  layer2.init(shapes.signature((q, k, v, mask)))
  # Example 0's positions 5, 6 are padding: changing them changes nothing.
  v2 = v.at[0, 5:].set(100.0)
  k2 = k.at[0, 5:].set(-100.0)
  y2, _ = layer2((q, k2, v2, mask))
  np.testing.assert_allclose(y2[0], y[0], rtol=1e-6, atol=1e-6)


def test_the_compiled_step_copies_no_key_or_value():
  """After the first call, a jitted step (its state donated, as the decoder
  step's) has no transpose or copy of the keys or values: that is what the
  layer is for. Trax's layer has them."""
  q, k, v, mask = _inputs(3)
  big = [f'f32[{B},{H},{L},{D // H}]', f'f32[{B},{H},{D // H},{L}]',
         f'f32[{B},{L},{H},{D // H}]', f'f32[{B},{L},{D}]']

  def copies(layer):
    layer.init(shapes.signature((q, k, v, mask)))
    layer((q, k, v, mask))

    def step(q, k, v, state):
      return layer.pure_fn((q, k, v, mask), (), state, jax.random.PRNGKey(0))

    hlo = jax.jit(step, donate_argnums=3).lower(
        q, k, v, layer.state).compile().as_text()
    ops = [line.split(' = ', 1)[1] for line in hlo.splitlines()
           if ' = ' in line]
    return [op for op in ops
            if any(op.startswith(s) for s in big)
            and ('transpose(' in op or ' copy(' in op
                 or 'fusion(' in op and 'copy' in op.split('calls=')[-1])]

  assert not copies(CrossAttention(n_heads=H, mode='predict'))
  assert copies(tl.PureAttention(n_heads=H, mode='predict'))


@pytest.mark.parametrize('enabled', [True, False])
def test_gin_switch_picks_the_models_layer(enabled):
  """`cross_attention_split_once.enabled = False` builds the model with
  Trax's tl.PureAttention (what the decoding-speed comparison times)."""
  common.setup()
  config.parse_gin([os.path.join(GIN_DIR, 'tiny', 'encdec_sparse.gin')],
                   [f'terraformer.cross_attention_split_once.enabled = '
                    f'{enabled}'])
  try:
    model = config.model_from_config()(mode='predict')
  finally:
    gin.clear_config()
  kinds = {type(layer) for layer in _sublayers(model)}
  assert (CrossAttention in kinds) == enabled
  assert (tl.PureAttention in kinds) != enabled


def _sublayers(layer):
  yield layer
  for sub in layer.sublayers:
    yield from _sublayers(sub)
