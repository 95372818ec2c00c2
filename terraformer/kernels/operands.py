"""The fused kernels' operands and results, by name, in binding order.

One list per group of operands that a kernel's step reads (names and element
types, as the C++ lists of `operands.h` give them) and one `Kernel` per fused
kernel: its operands (single ones and groups, a group's under a prefix,
'a.keys') and its results, some written in place into the operand of their
name. The wrappers (`terraformer.kernels`) pass their arrays by these names
and alias the caches from them; the layers (`kernels.layers`,
`kernels.block_layers`) hand them their arguments by these names. Changing a
kernel's operands is one list here and the C++ (its group's list in
`operands.h`, or its layout in `ffi.cc` / `fused_blocks.cc`);
tests/kernels/test_operands.py checks both against each other
(`kernels.signature`, the library's own account).
"""
import dataclasses

import jax
import jax.numpy as jnp

# The element types of the lists, as the library names them, and the dtype
# an operand is converted to (None: left as it is, float32, bfloat16 or int8).
DTYPES = {'f32': jnp.float32, 's8': jnp.int8, 's32': jnp.int32,
          'pred': jnp.bool_, 'any': None}

NORM = (('norm_scale', 'f32'), ('norm_bias', 'f32'))
# x [T, d] -> y: C1 [d, r], C2 [r, F] (float32, or packed with its scales
# c2_scale [F]), c [F], W1ᵀ and W2 [F, d] (any storage) with their row scales
# s1, s2 [F], b2 [d]; the LayerNorm before the block.
SPARSE_FF = (('c1', 'f32'), ('c2', 'any'), ('c2_scale', 'f32'), ('c', 'f32'),
             ('w1t', 'any'), ('w2', 'any'), ('b2', 'f32'), ('s1', 'f32'),
             ('s2', 'f32')) + NORM
# Sparse QKV's multiplicative layer (D int8 [S, d] and its row scales, E
# packed with its scales and bias) and its kept inputs.
MULTIPLICATIVE = (('d', 's8'), ('d_scale', 'f32'), ('e', 's8'),
                  ('e_scale', 'f32'), ('e_bias', 'f32'), ('kept', 'f32'))
# Sparse QKV: that, the Q/K kernels and the V kernel packed with their
# scales and biases.
SPARSE_QKV = MULTIPLICATIVE + (('qk', 's8'), ('qk_scale', 'f32'),
                               ('qk_bias', 'f32'), ('v', 's8'),
                               ('v_scale', 'f32'), ('v_bias', 'f32'))
# A causal attention's key/value caches, valid keys, position; the
# LayerNorm before it.
CACHE = (('keys', 'f32'), ('values', 'f32'), ('valid', 'pred'),
         ('idx', 's32')) + NORM
# A cross-attention's sparse queries: the multiplicative layer and kept
# inputs, the Q kernel packed with its scales and bias.
SPARSE_Q = MULTIPLICATIVE + (('q', 's8'), ('q_scale', 'f32'),
                             ('q_bias', 'f32'))
# The encoder's keys (transposed), values and padding mask; the LayerNorm
# before the cross-attention.
ENCODER = (('keys_t', 'f32'), ('values', 'f32'), ('mask', 'f32')) + NORM
# The Terraformer's low-rank SRU path: its LayerNorm, the dense layers down
# and up (packed W, scales, bias) around the cell's W, b and state c.
SRU = NORM + (('down', 's8'), ('down_scale', 'f32'), ('down_bias', 'f32'),
              ('w', 'f32'), ('b', 'f32'), ('c', 'f32'), ('up', 's8'),
              ('up_scale', 'f32'), ('up_bias', 'f32'))


def group(prefix, operands):
  """`operands` (names and types) under `prefix`: 'prefix.name'."""
  return tuple((f'{prefix}.{name}', dtype) for name, dtype in operands)


def prefixed(prefix, values):
  """{name: value} under `prefix`: {'prefix.name': value}."""
  return {f'{prefix}.{name}': value for name, value in values.items()}


@dataclasses.dataclass(frozen=True)
class Kernel:
  """A fused kernel's FFI target, operands and results in binding order.

  `operands`: (name, element type) pairs; `results`: names (float32);
  `in_place`: the results written into the operand of their name (aliased
  to it); `key`: its name for `kernels.signature` (the target, or
  'target:variant').
  """
  target: str
  operands: tuple
  results: tuple
  in_place: tuple = ()
  variant: str = ''

  @property
  def key(self):
    return f'{self.target}:{self.variant}' if self.variant else self.target

  @property
  def names(self):
    return tuple(name for name, _ in self.operands)

  def aliases(self):
    """{operand index: result index} of the results written in place."""
    return {self.names.index(name): self.results.index(name)
            for name in self.in_place}

  def arrays(self, values):
    """The operands in binding order from {name: array}, each converted to
    its element type; every name given, and no other."""
    missing = [n for n in self.names if n not in values]
    unknown = sorted(set(values) - set(self.names))
    if missing or unknown:
      raise ValueError(f'{self.target}: operands missing {missing}, '
                       f'unknown {unknown}')
    return [values[name] if DTYPES[dtype] is None
            else jnp.asarray(values[name], DTYPES[dtype])
            for name, dtype in self.operands]

  def __call__(self, values, shapes, **attributes):
    """{result name: array} of the call on `values` ({operand name: array})
    with `attributes`; `shapes`: {result name: shape}."""
    if set(shapes) != set(self.results):
      raise ValueError(f'{self.target}: results {sorted(shapes)}, not '
                       f'{sorted(self.results)}')
    out = tuple(jax.ShapeDtypeStruct(tuple(shapes[name]), jnp.float32)
                for name in self.results)
    call = jax.ffi.ffi_call(self.target, out if len(out) > 1 else out[0],
                            input_output_aliases=self.aliases() or None)
    results = call(*self.arrays(values), **attributes)
    return dict(zip(self.results, results if len(out) > 1 else (results,)))


def _names(prefix, names):
  return tuple(f'{prefix}.{name}' for name in names)


# What a sparse QKV attention step writes: its caches (in place) and kept
# inputs.
CACHES = ('keys', 'values')
ATTENTION_RESULTS = CACHES + ('kept',)

SPARSE_FF_KERNEL = Kernel('tf_sparse_ff', (('x', 'f32'),) + SPARSE_FF, ('y',))
SPARSE_QKV_KERNEL = Kernel('tf_sparse_qkv', (('x', 'f32'),) + SPARSE_QKV,
                           ('q', 'k', 'v', 'kept'))
SPARSE_QKV_ATTENTION = Kernel(
    'tf_sparse_qkv_attention', (('x', 'f32'),) + SPARSE_QKV + CACHE,
    ('y',) + ATTENTION_RESULTS, in_place=CACHES)
TERRAFORMER_BLOCK = Kernel(
    'tf_terraformer_block',
    (('x1', 'f32'), ('x2', 'f32')) + group('a', SPARSE_QKV + CACHE)
    + group('b', SPARSE_QKV + CACHE) + group('ff', SPARSE_FF)
    + group('sru', SRU),
    ('x1', 'x2') + _names('a', ATTENTION_RESULTS)
    + _names('b', ATTENTION_RESULTS) + ('sru.c',),
    in_place=_names('a', CACHES) + _names('b', CACHES))
SCALING_BLOCK = Kernel(
    'tf_scaling_block',
    (('x', 'f32'),) + group('attention', SPARSE_QKV + CACHE)
    + group('ff', SPARSE_FF),
    ('y',) + _names('attention', ATTENTION_RESULTS),
    in_place=_names('attention', CACHES))
SCALING_BLOCK_CROSS = dataclasses.replace(
    SCALING_BLOCK,
    operands=(SCALING_BLOCK.operands[:1 + len(SPARSE_QKV + CACHE)]
              + group('cross', SPARSE_Q + ENCODER) + group('ff', SPARSE_FF)),
    results=SCALING_BLOCK.results + ('cross.kept',), variant='cross')
KERNELS = (SPARSE_FF_KERNEL, SPARSE_QKV_KERNEL, SPARSE_QKV_ATTENTION,
           TERRAFORMER_BLOCK, SCALING_BLOCK, SCALING_BLOCK_CROSS)
