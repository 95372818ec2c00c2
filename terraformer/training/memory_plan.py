"""Per-device memory of an FSDP-sharded model, from shapes only.

`terraformer-info --devices=N` prints it: weights and optimizer slots split
over N devices by `terraformer.training.fsdp.fsdp_spec`, plus an activation
estimate; nothing is allocated.
"""
import math

import jax
import numpy as np

from terraformer.training.fsdp import fsdp_spec


def _nbytes(leaf):
  return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


def _sharded_bytes(leaf, n_devices):
  """Bytes of `leaf` on one device under `fsdp_spec`."""
  spec = fsdp_spec(leaf.shape, n_devices)
  return _nbytes(leaf) // (n_devices if any(spec) else 1)


def memory_plan(weight_shapes, n_devices, slots_per_weight=2,
                activation_bytes=0):
  """Per-device bytes of an FSDP-sharded model, from shapes only.

  Args:
    weight_shapes: weights tree with `.shape`/`.dtype` leaves.
    n_devices: devices the weights and slots are split over.
    slots_per_weight: optimizer slots of a weight's size (Adam: 2).
    activation_bytes: activations of the global batch (split over devices).

  Returns:
    dict with total and per-device bytes of weights, slots, activations,
    their per-device sum, and the largest unsharded (replicated) leaf.
  """
  leaves = jax.tree_util.tree_leaves(weight_shapes)
  total = sum(_nbytes(x) for x in leaves)
  per_device = sum(_sharded_bytes(x, n_devices) for x in leaves)
  replicated = [x for x in leaves if n_devices > 1
                and not any(fsdp_spec(x.shape, n_devices))]
  plan = {
      'devices': n_devices,
      'weights_bytes': total,
      'weights_bytes_per_device': per_device,
      'slots_bytes_per_device': slots_per_weight * per_device,
      'activation_bytes_per_device': activation_bytes // n_devices,
      'replicated_bytes_per_device': sum(_nbytes(x) for x in replicated),
  }
  plan['total_bytes_per_device'] = (
      plan['weights_bytes_per_device'] + plan['slots_bytes_per_device']
      + plan['activation_bytes_per_device'])
  return plan
