"""Fine-tuning: initialize a model with the weights of a pretraining checkpoint.

§4.4: Terraformer is pretrained on C4 and fine-tuned on arXiv summarization.
`terraformer.train(init_checkpoint=...)` loads the weights of a Trax Loop
checkpoint (`model.pkl.gz` + `model.weights.npy.gz`) into a fresh Loop; the
optimizer state and the step start fresh. The checkpoint stores weights as a
flat list, so they are matched to the model in order; the first weight whose
shape differs (or that one side lacks) is reported by its path in the layer
tree, e.g. `Serial[3]/SparseFF.weights[2]: checkpoint (512, 128) vs model
(1024, 128)`.

A checkpoint of Trax's own models (Trax 1.4.1 `ConfigurableTransformerLM` /
`ConfigurableTransformer`, e.g. the paper's) is accepted too, with no switch:
the file format is the same (both are written by Trax's Loop), so a checkpoint
whose flat weights do not fit our model as they are is imported through
`terraformer.trax_bridge.checkpoint_import` (Trax's layouts mapped by name and shape). This is
unambiguous: where Trax's layout and ours differ (SparseFF's [d_model,
d_ff/N, N] and [N, d_ff/N, d_model] arrays vs our [d_ff, d_model] rows) the
shapes differ, and everywhere else they hold the same arrays in the same
order. When neither fits, the error names the first misfit of both.
"""
import jax
import jax.numpy as jnp
import numpy as np
from trax import fastmath
from trax import layers as tl

from terraformer.checkpoint import format as checkpoint_format
from terraformer.errors import TerraformerError

def checkpoint_file(path):
  """The `.pkl.gz` file of `init_checkpoint` (a directory or a file)."""
  return checkpoint_format.checkpoint_file(path, what='init_checkpoint')


def named_weights(layer, weights=None, path=None):
  """[(path, array)] of a layer's weights, in the checkpoint's flat order.

  A weight of sublayer `i` of a combinator is named `Parent[i]/Child`; the
  arrays of a layer are `Layer.weights` (one) or `Layer.weights[j]`.
  """
  weights = layer.weights if weights is None else weights
  path = path or layer.name
  sublayers = layer.sublayers
  if (sublayers and isinstance(weights, (tuple, list))
      and len(weights) == len(sublayers)):
    named = []
    for i, (sublayer, sub_weights) in enumerate(zip(sublayers, weights)):
      named += named_weights(sublayer, sub_weights,
                             f'{path}[{i}]/{sublayer.name}')
    return named
  leaves = fastmath.tree_flatten(weights)
  if len(leaves) == 1 and not isinstance(weights, (tuple, list, dict)):
    return [(f'{path}.weights', leaves[0])]
  return [(f'{path}.weights[{j}]', w) for j, w in enumerate(leaves)]


def _shape(x):
  return tuple(np.shape(x))


def match(checkpoint, model_named, source='checkpoint'):
  """Checks flat checkpoint weights against `named_weights` of the model.

  Returns the checkpoint arrays cast to the model's dtypes; raises a
  TerraformerError naming the first weight that differs in shape, or that
  only one side has.
  """
  for i, (name, w) in enumerate(model_named):
    if i >= len(checkpoint):
      raise TerraformerError(
          f'{source} does not match the model: {name}: missing in the '
          f'{source} (it has {len(checkpoint)} weight arrays, the model '
          f'{len(model_named)})')
    if _shape(checkpoint[i]) != _shape(w):
      raise TerraformerError(
          f'{source} does not match the model: {name}: checkpoint '
          f'{_shape(checkpoint[i])} vs model {_shape(w)}')
  if len(checkpoint) > len(model_named):
    raise TerraformerError(
        f'{source} does not match the model: it has {len(checkpoint)} weight '
        f'arrays, the model {len(model_named)}; the first extra one has shape '
        f'{_shape(checkpoint[len(model_named)])}')
  return [_as_dtype(c, w.dtype) for c, (_, w) in zip(checkpoint, model_named)]


def _as_dtype(array, dtype):
  return checkpoint_format.from_bits(array).astype(dtype, copy=False)


def init_weights(loop, path):
  """Sets the weights of `loop`'s model from checkpoint `path`.

  Only weights: state, optimizer slots and step are left as they are.
  Returns the number of weight arrays loaded.
  """
  model = loop.model
  named = named_weights(model)
  flat_model = fastmath.tree_flatten(model.weights)
  if len(named) != len(flat_model):  # A layer tree we cannot name.
    named = [(f'{model.name}.weights[#{i}]', w)
             for i, w in enumerate(flat_model)]
  checkpoint, _ = checkpoint_format.load_flat_weights(path, 'init_checkpoint')
  try:
    flat = match(checkpoint, named,
                 source=f'checkpoint {checkpoint_file(path)}')
  except TerraformerError as error:
    weights = _import_trax(model, checkpoint, error)
  else:
    weights, _ = tl.unflatten_weights_and_state(
        flat, (), (model.weights, ()), weights_only=True)
  loop.update_weights_and_state(weights=weights)
  return len(fastmath.tree_flatten(weights))


def _import_trax(model, checkpoint, error):
  """Weights of `model` from a Trax model's checkpoint, or one error."""
  from terraformer.trax_bridge import checkpoint_import as trax_import  # pylint: disable=g-import-not-at-top
  try:
    weights = trax_import.import_weights(model, checkpoint,
                                         source='Trax layout')
  except TerraformerError as trax_error:
    raise TerraformerError(
        f'{error}; nor as a Trax 1.4.1 checkpoint: {trax_error}') from None
  return jax.tree_util.tree_map(
      lambda w, ours: jnp.asarray(w, dtype=ours.dtype), weights,
      model.weights)
