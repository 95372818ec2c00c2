"""Shape-only parameter counts of a Trax model, grouped by layer class.

Weights are never allocated: `jax.eval_shape` runs `model.init` on abstract
values, so an 800M-parameter model is counted in seconds and little memory.
"""
import collections
import copy
import inspect

import gin
import jax
import numpy as np
from trax import layers as tl
from trax import shapes

from terraformer import config
from terraformer.training import fsdp
from terraformer.training import memory_plan

ParamCount = collections.namedtuple('ParamCount', ['by_layer', 'total'])


def input_signature_for(model, batch_size=1, length=512):
  """Default input signature from `model.n_in`.

  A decoder-only LM (n_in == 1) gets int32 tokens `(batch, length)`; an
  encoder-decoder (n_in >= 2) gets `(inputs, targets)` int32 tokens, and any
  further inputs (e.g. loss weights) as float32 of the same shape.
  """
  shape = (batch_size, length)
  sig = [shapes.ShapeDtype(shape, np.int32) for _ in range(min(model.n_in, 2))]
  sig += [shapes.ShapeDtype(shape, np.float32)
          for _ in range(model.n_in - len(sig))]
  return sig[0] if len(sig) == 1 else tuple(sig)


def weight_shapes(model, input_signature):
  """Returns the weights tree of `model` with `jax.ShapeDtypeStruct` leaves.

  `model.init` stores weights, state and rngs in the layers as a side effect;
  under `eval_shape` those would be tracers, so a copy of `model` is
  initialized and thrown away: `model` itself is left untouched. Each
  sublayer's forward is traced once per signature (compat fix 7).
  """
  scratch = copy.deepcopy(model)
  return jax.eval_shape(lambda rng: scratch.init(input_signature, rng=rng)[0],
                        jax.random.PRNGKey(0))


def _size(leaf):
  return int(np.prod(leaf.shape, dtype=np.int64))


def _count(layer, weights, counts):
  """Adds the parameters of `layer` (weights tree `weights`) to `counts`."""
  if isinstance(weights, dict) and weights == tl.GET_WEIGHTS_FROM_CACHE:
    return  # A shared layer: its weights are counted where first used.
  subs = layer.sublayers
  if subs and isinstance(weights, (tuple, list)) and len(weights) == len(subs):
    for sub, sub_weights in zip(subs, weights):
      _count(sub, sub_weights, counts)
    return
  n = sum(_size(leaf) for leaf in jax.tree_util.tree_leaves(weights))
  if n:
    counts[type(layer).__name__] += n


def count_layer_params(model, input_signature, shapes_out=None):
  """Counts the parameters of an (uninitialized) layer, by layer class.

  `shapes_out`, a list, receives the weights tree of shapes.
  """
  counts = collections.Counter()
  weights = weight_shapes(model, input_signature)
  if shapes_out is not None:
    shapes_out.append(weights)
  _count(model, weights, counts)
  by_layer = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
  return ParamCount(by_layer, sum(by_layer.values()))


@gin.configurable(module='terraformer')
def count_parameters(model=None, input_signature=None, batch_size=1,
                     length=512, mode='eval', shapes_out=None):
  """Counts parameters of a model function, by layer class and in total.

  Args:
    model: Trax model function taking `mode=`; by default the one bound to
      `train.model` in the gin config.
    input_signature: ShapeDtype (or tuple) the model is initialized on; by
      default derived from `model.n_in` (see `input_signature_for`).
    batch_size: batch size of the default input signature.
    length: sequence length of the default input signature.
    mode: mode the model is built in (weights do not depend on it).
    shapes_out: a list that receives the weights tree of shapes.

  Returns:
    ParamCount(by_layer={class name: count}, total=count).
  """
  model = model or config.model_from_config()
  layer = model(mode=mode)
  if input_signature is None:
    input_signature = input_signature_for(layer, batch_size, length)
  return count_layer_params(layer, input_signature, shapes_out)


def _model_setting(name, default):
  """A setting of the configured model function (gin binding or default)."""
  ref = config.model_reference()
  fn = getattr(ref, 'scoped_configurable_fn', ref)
  selector = getattr(ref, 'selector', getattr(fn, '__name__', ''))
  try:
    return gin.query_parameter(f'{selector}.{name}')
  except ValueError:
    parameter = inspect.signature(fn).parameters.get(name)
    if parameter is None or parameter.default is inspect.Parameter.empty:
      return default
    return parameter.default


def residual_stream_bytes(batch_size, length):
  """Activation estimate of a training step: the residual stream that every
  block of the configured model keeps for backpropagation (float32,
  batch x length x d_model per block). A lower bound for plain blocks
  (attention scores and FF intermediates not counted), an upper bound for
  reversible ones (they recompute their inputs)."""
  d_model = _model_setting('d_model', 0)
  blocks = sum(_model_setting(name, 0) or 0 for name in
               ('n_layers', 'n_encoder_layers', 'n_decoder_layers'))
  return 4 * batch_size * length * d_model * blocks


def device_memory(n_devices, batch_size=1, length=512, slots_per_weight=2):
  """ParamCount and the per-device `memory_plan.memory_plan` of the
  configured model, weights and slots FSDP-sharded over `n_devices`."""
  shapes_out = []
  count = count_parameters(shapes_out=shapes_out)
  plan = memory_plan.memory_plan(
      shapes_out[0], n_devices, slots_per_weight,
      residual_stream_bytes(batch_size, length))
  return count, plan


def compiled_step_memory(batch_size=1, length=512):
  """XLA's per-device memory of the FSDP training step of the configured
  model over all devices (`ShardedTrainer.compiled_step_memory`), compiled
  from shapes only: nothing is allocated. Adam, a global batch of
  `batch_size` x `length` tokens (inputs, targets, loss weights), and
  `terraformer.train.fsdp_gather_weights` as bound."""
  from trax import optimizers  # pylint: disable=g-import-not-at-top
  try:
    gather = gin.query_parameter('terraformer.train.fsdp_gather_weights')
  except ValueError:
    gather = False
  model = config.model_from_config()(mode='train')
  tokens = jax.ShapeDtypeStruct((batch_size, length), np.int32)
  batch = (tokens, tokens, jax.ShapeDtypeStruct(tokens.shape, np.float32))
  trainer = fsdp.ShardedTrainer(
      model, tl.WeightedCategoryCrossEntropy(), optimizers.Adam(),
      lambda step: 0.0, batch, abstract=True, gather_weights=gather)
  return trainer.compiled_step_memory()
