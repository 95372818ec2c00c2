"""Each fused kernel's operands: one list (`kernels.operands`), checked
against the C++ binding's own account (`tf_kernel_signature`, made from the
layouts its handlers read their operands by), the aliases of the caches
derived from it by name, and the layers' arguments named by it.

(The wrappers pass their arrays by these names, `Kernel.arrays` refusing a
missing or unknown one: every fused call of tests/kernels/test_fused_steps.py
goes through that check too.)
"""
import dataclasses

import jax
import jax.numpy as jnp
import pytest
from trax import shapes

from terraformer import kernels
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.kernels import operands
from terraformer.layers.attention import SelfAttention
from terraformer.layers.sparse_ff import SparseFF


@pytest.fixture(autouse=True)
def _library():
  assert kernels.available(), kernels.unavailable_reason()


@pytest.mark.parametrize('kernel', operands.KERNELS, ids=lambda k: k.key)
def test_each_kernels_list_is_the_bindings(kernel):
  """Names and element types of the operands, names of the results and
  the results written in place, in binding order: the C++ layout's."""
  assert kernels.signature(kernel.key) == (kernel.operands, kernel.results,
                                           kernel.in_place)


def test_the_check_sees_a_changed_list():
  """Two operands swapped, one renamed, one dropped, or a cache no longer
  written in place: each differs from the binding."""
  block = operands.TERRAFORMER_BLOCK
  ops = list(block.operands)
  ops[3], ops[4] = ops[4], ops[3]
  changed = [
      dataclasses.replace(block, operands=tuple(ops)),
      dataclasses.replace(block, operands=block.operands[:-1] + (
          ('sru.up_bias2', 'f32'),)),
      dataclasses.replace(block, operands=block.operands[:-1]),
      dataclasses.replace(block, in_place=block.in_place[1:])]
  real = kernels.signature(block.key)
  for kernel in changed:
    assert (kernel.operands, kernel.results, kernel.in_place) != real
  assert kernels.signature('tf_no_such_kernel') is None


@pytest.mark.parametrize('kernel', operands.KERNELS, ids=lambda k: k.key)
def test_aliases_pair_each_cache_with_its_result(kernel):
  """Operand i aliases result j where both have the cache's name: the
  attention caches (keys, values), nothing else."""
  aliases = kernel.aliases()
  assert len(aliases) == len(kernel.in_place)
  for i, j in aliases.items():
    assert kernel.names[i] == kernel.results[j] in kernel.in_place
    assert kernel.names[i].rsplit('.', 1)[-1] in operands.CACHES
  has_attention = any(name.endswith('keys') for name in kernel.names)
  assert bool(aliases) == has_attention


def test_a_call_takes_every_operand_by_name_and_no_other():
  kernel = operands.SPARSE_FF_KERNEL
  values = {name: jnp.zeros((1,)) for name in kernel.names}
  assert len(kernel.arrays(values)) == len(kernel.operands)
  with pytest.raises(ValueError, match=r"missing \['b2'\]"):
    kernel.arrays({k: v for k, v in values.items() if k != 'b2'})
  with pytest.raises(ValueError, match=r"unknown \['bias'\]"):
    kernel.arrays(dict(values, bias=jnp.zeros((1,))))


def _names(kernel, exclude=()):
  return {n for n in kernel.names if n not in exclude}


def test_the_layers_name_the_operands_as_the_lists_do(gemv_isa):
  """A sparse QKV attention's and a sparse FF block's step arguments are
  their kernel's operands by name (the norm, x and the attributes aside)."""
  gemv_isa(kernels.best_gemv_isa())
  layer = SelfAttention(64, 4, 'full', 4, causal=True, mode='predict',
                        predict_mem_len=16)
  x = (jnp.ones((1, 1, 64)), jnp.array([1]))
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(0))
  kernel_installer.install(layer)
  stored = kernel_layers.store_weights(layer, weights, 'q8')
  arguments, _ = layer.step_arguments(x[0], stored, state)
  assert set(arguments) == _names(
      operands.SPARSE_QKV_ATTENTION,
      ('x', 'norm_scale', 'norm_bias')) | {'qk_width', 'v_width'}
  ff = SparseFF(128, 8, 4, mode='predict')
  weights, _ = ff.init(shapes.signature(x[0]), rng=jax.random.PRNGKey(0))
  kernel_installer.install(ff)
  arguments = ff.step_arguments(x[0], kernel_layers.store_weights(
      ff, weights, 'q8'))
  assert set(arguments) == _names(
      operands.SPARSE_FF_KERNEL, ('x', 'norm_scale', 'norm_bias')) | {'block'}
