"""A trained checkpoint (Trax's `model.pkl.gz`) as a model in any mode.

`load_model` builds the configured model function in the mode asked for
(predict for decoding, eval for perplexity) and gives it the checkpoint's
weights, placed by the model's weight signature and checked array by array
against it: a checkpoint of another config is one error line, never a
partial load. `load_weights` reads them for a model built elsewhere (the
benchmarks), `with_weights` gives a model weights already in memory.
"""
import jax
import jax.numpy as jnp
from trax import layers as tl

from terraformer import errors
from terraformer.checkpoint import format as checkpoint_format
from terraformer.decoding import search as decoding


def checkpoint_path(output_dir):
  """`output_dir/model.pkl.gz`; TerraformerError if it is missing."""
  return checkpoint_format.checkpoint_file(
      output_dir, what=None if output_dir else '--output_dir',
      hint='; train one with terraformer-train --output_dir=...')


def load_model(model_fn, output_dir, mode, signature):
  """Builds `model_fn(mode=mode)` with the weights of the checkpoint.

  The weights are placed by the model's weight signature (no random init);
  the state is fresh (empty predict caches).

  Returns:
    (model, step of the checkpoint).
  """
  model = model_fn(mode=mode)
  weights, step = load_weights(model, output_dir, signature)
  return with_weights(model, weights, signature), step


def load_weights(model, output_dir, signature):
  """The checkpoint's weights as `model`'s weights tree (checked array by
  array against its weight signature; the model is left unchanged).

  Returns:
    (weights, step of the checkpoint).
  """
  path = checkpoint_path(output_dir)
  flat, step = checkpoint_format.load_flat_weights(path)
  weights_sig = decoding.weights_signature(model, signature)
  n_expected = len(tl.flatten_weights_and_state(weights_sig, ())[0])
  if len(flat) != n_expected:
    raise errors.TerraformerError(
        f'checkpoint {path} has {len(flat)} weight arrays, the configured '
        f'model {n_expected}: was it trained with this config?')
  weights, _ = tl.unflatten_weights_and_state(
      flat, (), (weights_sig, ()), weights_only=True)
  for got, want in zip(jax.tree_util.tree_leaves(weights),
                       jax.tree_util.tree_leaves(weights_sig)):
    if tuple(got.shape) != tuple(want.shape):
      raise errors.TerraformerError(
          f'checkpoint {path}: weight of shape {tuple(got.shape)} where the '
          f'configured model has {tuple(want.shape)}: was it trained with '
          'this config?')
  return weights, step


def with_weights(model, weights, signature):
  """Gives an uninitialized `model` these weights and a fresh state."""
  model.state = decoding.initial_state(model, signature)
  model.weights = jax.tree_util.tree_map(jnp.asarray, weights)
  return model
