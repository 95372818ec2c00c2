"""Trax 1.4.1 models with random weights, saved by Trax's checkpoint writer.

Test helper (Trax's research models are the oracle here only). The checkpoint
files are written by `trax.supervised.training.Loop.save_checkpoint` itself,
run on a minimal stand-in for the Loop (building a real Loop costs ~20 s per
model on this machine; `test_trax_import.py` also does that once).
"""
import os
import types

import gin
import jax
import numpy as np
from trax import fastmath
from trax import layers as tl
from trax import shapes
from trax.supervised import history as trax_history
from trax.supervised import training as trax_training

from terraformer.trax_bridge import compat

compat.apply()

# pylint: disable=g-import-not-at-top,wrong-import-position
from trax.layers.research import sparsity as trax_sparsity
from trax.models.research import configurable_transformer as trax_ct
from trax.models.research import terraformer as trax_terraformer
# pylint: enable=g-import-not-at-top,wrong-import-position


def trax_lm(mode, attention_sparsity=0, length_kernel_size=3, **kwargs):
  """ConfigurableTransformerLM; sparse QKV attention if attention_sparsity."""
  with gin.unlock_config():
    gin.clear_config()
    if attention_sparsity:
      gin.bind_parameter('MultiplicativeConvCausalAttention.sparsity',
                         attention_sparsity)
      gin.bind_parameter(
          'MultiplicativeConvCausalAttention.length_kernel_size',
          length_kernel_size)
      kwargs['attention_type'] = (
          trax_sparsity.MultiplicativeConvCausalAttention)
    return trax_ct.ConfigurableTransformerLM(mode=mode, **kwargs)


def trax_encdec(mode, attention_sparsity=0, length_kernel_size=3,
                **kwargs):
  """ConfigurableTransformer; all attention sparse if attention_sparsity."""
  with gin.unlock_config():
    gin.clear_config()
    if attention_sparsity:
      gin.bind_parameter('MultiplicativeConvCausalAttention.sparsity',
                         attention_sparsity)
      gin.bind_parameter(
          'MultiplicativeConvCausalAttention.length_kernel_size',
          length_kernel_size)
      kwargs['encoder_attention_type'] = (
          trax_sparsity.MultiplicativeConvCausalAttention)
      kwargs['encoder_decoder_attention_type'] = (
          trax_sparsity.MultiplicativeConvCausalAttention)
      kwargs['enc_dec_attention_sparsity'] = attention_sparsity
    return trax_ct.ConfigurableTransformer(mode=mode, **kwargs)


def trax_terraformer_model(mode, input_vocab_size, lsh=None, **kwargs):
  """ConfigurableTerraformer (attention types as Trax classes in kwargs).

  lsh: gin parameters of `LSHSelfAttention` (chunk_len, n_buckets, ...).
  """
  with gin.unlock_config():
    gin.clear_config()
    for name, value in (lsh or {}).items():
      gin.bind_parameter(f'LSHSelfAttention.{name}', value)
    return trax_terraformer.ConfigurableTerraformer(input_vocab_size,
                                                    mode=mode, **kwargs)


def lsh_layers(model):
  """Trax's LSHSelfAttention layers of `model`, in order."""
  if type(model).__name__ == 'LSHSelfAttention':
    return [model]
  return [l for sub in model.sublayers for l in lsh_layers(sub)]


def set_hashing_keys(layer, seed):
  """Sets the per-head hashing keys in `layer`'s state (Trax advances them
  on every call) to those drawn from `seed`, as our `LSHCore` does in eval."""
  *rest, keys = layer.state
  fixed = jax.random.split(jax.random.PRNGKey(seed), keys.shape[0])
  layer.state = (*rest, fixed.reshape(keys.shape).astype(keys.dtype))


def random_weights(model, signature, seed=0, scale=0.5):
  """Initializes `model` and replaces every weight by N(0, scale²) noise."""
  model.init(signature)
  leaves, tree = jax.tree_util.tree_flatten(model.weights)
  rng = np.random.RandomState(seed)
  leaves = [(scale * rng.randn(*np.shape(w))).astype(np.float32)
            for w in leaves]
  model.weights = jax.tree_util.tree_unflatten(tree, leaves)
  return model.weights


def save_with_trax(model, output_dir, input_signature, step=7):
  """Writes `model`'s weights with Trax's `Loop.save_checkpoint`."""
  os.makedirs(output_dir, exist_ok=True)
  loop = types.SimpleNamespace(
      _output_dir=output_dir, is_chief=True, _model=model,
      _eval_model=model, _use_memory_efficient_trainer=False,
      _trainer_per_task=[types.SimpleNamespace(slots=())],
      _batch_signature=input_signature, _history=trax_history.History(),
      step=step)
  loop._to_bits = lambda ws: trax_training.Loop._to_bits(loop, ws)  # pylint: disable=protected-access
  trax_training.Loop.save_checkpoint(loop, 'model')
  return os.path.join(output_dir, 'model.pkl.gz')


def with_weights(model, weights, signature):
  """`model` (any mode) initialized for `signature`, then given `weights`."""
  model.init(signature)
  model.weights = weights
  return model


def flat(tree):
  return [np.asarray(w) for w in fastmath.tree_flatten(tree)]


def int_signature(*shape_list):
  sigs = tuple(shapes.ShapeDtype(s, np.int32) for s in shape_list)
  return sigs[0] if len(sigs) == 1 else sigs


def trax_greedy_lm(eval_model, batch, length):
  """Greedy decoding by re-running the Trax eval model on the prefix."""
  tokens = np.zeros((batch, length), np.int32)
  for t in range(length):
    logits = np.asarray(eval_model(tokens))
    tokens[:, t] = np.argmax(logits[:, t], axis=-1)
  return tokens


def trax_greedy_encdec(eval_model, inputs, length):
  tokens = np.zeros((inputs.shape[0], length), np.int32)
  for t in range(length):
    logits = np.asarray(eval_model((inputs, tokens))[0])
    tokens[:, t] = np.argmax(logits[:, t], axis=-1)
  return tokens


__all__ = ['tl']
