"""Fused C++ decode kernels called through XLA's FFI.

The C++ sources next to this file (one extension: `ffi.cc` binds the
kernels, its header says which file holds what) are compiled by `pip install
-e .` (setup.py) into `_decode_kernels*.so`. It is loaded with ctypes and its
handlers registered with `jax.ffi` on first use; `available()` is False when
the library was not built (or fails to load), and callers then keep the XLA
path: importing this package never needs the library.

  skinny_matmul(x, g, w, scale, bias)  y[t, s*N+n] = sum_k x g[s] scale W
  sparse_ff(x, block, norm=None, **operands)  a sparse FF block (norm: the
      LayerNorm before it, in the same call)
  q8_matmul(x, packed, scale, g, bias)  skinny_matmul's product on int8
      weights packed output-major (`layers.pack_q8`) and int8 activations
  cache_attention(q, keys, values, idx, valid)  causal attention of a
      step's queries over a key/value cache read in place (its filled part)
  sparse_qkv(x, qk_width, v_width, **operands)  sparse QKV's step ('q8'):
      the multiplicative layer and the Q/K and V convolutions in one call
  sparse_qkv_attention(x, qk_width, v_width, norm=None, **operands)  that
      step, its keys and values written into their caches in place, and the
      attention over them, in one call
  terraformer_block(x1, x2, attentions, ff, sru)  a Terraformer decoder
      block's step ('q8'): both attentions, the sparse FF block, the SRU
      path and the reversible sums, in one call
  scaling_block(x, attention, ff[, cross])  a Scaling Transformer decoder
      block's step ('q8'): the attention, the sparse-query cross-attention
      over the encoder, the sparse FF block and the residual sums, in one
      call

The fused kernels (the last five) take their operands by name: the names of
`operands` (its lists, in the order the C++ binding reads them), which
`signature` checks against the library's own.

The kernels pick their instruction set at run time: `set_isa` / the float
kernels ('scalar', 'avx2', 'avx512'), `gemv_isa` / `set_gemv_isa` the Q8
GEMV ('scalar', 'avx2', 'avx512vnni', 'amx'; and 'amx-emulated', AMX's
tile code with each tile instruction done in plain C++, which any CPU runs:
how tests check that code without AMX). The environment variables
TERRAFORMER_ISA and TERRAFORMER_GEMV_ISA, read when the library loads,
force one too (a set the CPU lacks falls back to the best it has): how an
AVX-512 host times the AVX2 paths.
"""
import ctypes
import glob
import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from terraformer.kernels import operands as ops

_HERE = os.path.dirname(os.path.abspath(__file__))
_LIB_GLOB = '_decode_kernels*.so'
ISA_NAMES = ('scalar', 'avx2', 'avx512')
# In the order of the C++ levels (isa.h, GemvIsa).
GEMV_ISA_NAMES = ('scalar', 'avx2', 'avx512vnni', 'amx', 'amx-emulated')
# Paths that emulate instructions in plain C++, for tests: any CPU has them,
# and no benchmark times them.
GEMV_EMULATED = ('amx-emulated',)
ISA_ENV = 'TERRAFORMER_ISA'
GEMV_ISA_ENV = 'TERRAFORMER_GEMV_ISA'

_state = {'lib': None, 'tried': False, 'error': None}
# Kernels a library built from an older source may lack: the others still
# load, and callers of these keep XLA's code.
_OPTIONAL = ('tf_cache_attention', 'tf_sparse_qkv', 'tf_sparse_qkv_attention',
             'tf_terraformer_block', 'tf_scaling_block')


def library_path():
  """Path of the built library, or None."""
  found = sorted(glob.glob(os.path.join(_HERE, _LIB_GLOB)))
  return found[0] if found else None


def _load():
  if _state['tried']:
    return _state['lib']
  _state['tried'] = True
  path = os.environ.get('TERRAFORMER_KERNELS_LIB') or library_path()
  if path is None:
    _state['error'] = (f'no {_LIB_GLOB} in {_HERE}: build it with '
                       '`pip install -e .` (scripts/env.sh)')
    return None
  try:
    lib = ctypes.CDLL(path)
    for name in ('tf_skinny_matmul', 'tf_sparse_ff', 'tf_q8_matmul'):
      jax.ffi.register_ffi_target(
          name, jax.ffi.pycapsule(getattr(lib, name)), platform='cpu')
    for name in _OPTIONAL:
      if hasattr(lib, name):
        jax.ffi.register_ffi_target(
            name, jax.ffi.pycapsule(getattr(lib, name)), platform='cpu')
    lib.tf_set_isa.argtypes = [ctypes.c_int]
    lib.tf_set_isa.restype = ctypes.c_int
    lib.tf_set_parallel_bytes.argtypes = [ctypes.c_int64]
    lib.tf_set_parallel_bytes.restype = ctypes.c_int64
    lib.tf_set_gemv_isa.argtypes = [ctypes.c_int]
    lib.tf_set_gemv_isa.restype = ctypes.c_int
    lib.tf_best_gemv_isa.argtypes = []
    lib.tf_best_gemv_isa.restype = ctypes.c_int
    lib.tf_emulated_tdpbssd.argtypes = []
    lib.tf_emulated_tdpbssd.restype = ctypes.c_int64
    for name in ('tf_int8_peak_macs', 'tf_f32_peak_macs'):
      if hasattr(lib, name):
        getattr(lib, name).argtypes = [ctypes.c_int64]
        getattr(lib, name).restype = ctypes.c_double
    if hasattr(lib, 'tf_q8_product_macs'):
      lib.tf_q8_product_macs.argtypes = [ctypes.c_int64] * 4
      lib.tf_q8_product_macs.restype = ctypes.c_double
    if hasattr(lib, 'tf_kernel_signature'):
      lib.tf_kernel_signature.argtypes = [ctypes.c_char_p]
      lib.tf_kernel_signature.restype = ctypes.c_char_p
  except (OSError, AttributeError) as e:
    _state['error'] = f'cannot load {path}: {e}'
    return None
  for env, names, set_level in ((ISA_ENV, ISA_NAMES, lib.tf_set_isa),
                                (GEMV_ISA_ENV, GEMV_ISA_NAMES,
                                 lib.tf_set_gemv_isa)):
    forced = os.environ.get(env)
    if forced:
      if forced not in names:
        _state['error'] = f'{env}={forced!r}: not one of {names}'
        return None
      set_level(names.index(forced))
  _state['lib'] = lib
  return lib


def available():
  """True when the compiled kernels are loaded and registered."""
  return _load() is not None


def has_kernel(name):
  """True when the loaded library has the kernel `name` (`_OPTIONAL`)."""
  lib = _load()
  return lib is not None and hasattr(lib, name)


def signature(key):
  """The library's account of the fused kernel `key` (`operands.Kernel.key`):
  (operands as (name, element type) pairs, results as names, the results
  written in place), in binding order; None for a kernel it does not know
  (or a library built without `tf_kernel_signature`)."""
  lib = _load()
  if lib is None or not hasattr(lib, 'tf_kernel_signature'):
    return None
  text = lib.tf_kernel_signature(key.encode())
  if text is None:
    return None
  operand_lines, result_lines = text.decode().split('->\n')
  operands = tuple(tuple(line.split()) for line in operand_lines.splitlines())
  results = [line.split() for line in result_lines.splitlines()]
  return (operands, tuple(r[0] for r in results),
          tuple(r[0] for r in results if r[2:] == ['in_place']))


PEAK_KINDS = {'int8': 'tf_int8_peak_macs', 'float32': 'tf_f32_peak_macs'}


def peak_macs(kind='int8', threads=1, seconds=0.2):
  """Multiply-adds per second the kernels' instruction can issue: 'int8',
  the Q8 path in use (`gemv_isa()`: AMX's tdpbssd on whole tiles, VNNI's
  vpdpbusd, AVX2's maddubs + madd + add, a scalar multiply-add;
  'amx-emulated' times the emulated tdpbssd); 'float32', the float path's
  FMA (`set_isa()`).
  Registers only, on `threads` threads at once (ctypes releases the GIL),
  summed; each runs about `seconds`. The peak a compute-bound product can
  reach. None without the library (or a library built without the probe)."""
  lib = _load()
  if lib is None or not hasattr(lib, PEAK_KINDS[kind]):
    return None
  probe = getattr(lib, PEAK_KINDS[kind])
  iterations = 1 << 12
  while True:  # Rounds for `seconds`, from a run of at least 10 ms.
    start = time.perf_counter()
    probe(iterations)
    elapsed = time.perf_counter() - start
    if elapsed >= 0.01:
      break
    iterations *= 4
  iterations = max(1, int(iterations * seconds / elapsed))
  rates = [0.0] * threads

  def run(i):
    rates[i] = probe(iterations)

  workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
  for worker in workers:
    worker.start()
  for worker in workers:
    worker.join()
  return sum(rates)


def q8_product_macs(rows, k, n, repeats=20):
  """Multiply-adds per second of the Q8 product alone (rows x k activations,
  quantized before the clock starts, times a k x n packed weight), on the
  calling thread and the path in use: the median of `repeats` calls. With
  `peak_macs('int8')`, the share of the instruction's peak a product's
  kernel reaches. None without the library (or its probe)."""
  lib = _load()
  if lib is None or not hasattr(lib, 'tf_q8_product_macs'):
    return None
  return lib.tf_q8_product_macs(rows, k, n, repeats)


def unavailable_reason():
  """Why `available()` is False (None when it is True)."""
  _load()
  return _state['error']


def set_isa(name=None):
  """Instruction set the kernels use ('scalar', 'avx2', 'avx512'); None
  keeps it. A set this CPU lacks falls back to the best it has. Returns the
  one in use."""
  lib = _load()
  if lib is None:
    raise RuntimeError(unavailable_reason())
  level = -1 if name is None else ISA_NAMES.index(name)
  return ISA_NAMES[lib.tf_set_isa(level)]


def set_gemv_isa(name=None):
  """Instruction set of the Q8 GEMV (`q8_matmul`), one of GEMV_ISA_NAMES;
  None keeps it. A set this CPU lacks falls back to the best it has
  ('amx-emulated': every CPU has it). Returns the one in use."""
  lib = _load()
  if lib is None:
    raise RuntimeError(unavailable_reason())
  level = -1 if name is None else GEMV_ISA_NAMES.index(name)
  return GEMV_ISA_NAMES[lib.tf_set_gemv_isa(level)]


def gemv_isa():
  """The Q8 GEMV path the kernels take: 'amx' (tdpbssd for products of 16
  rows or more, vpdpbusd for fewer), 'avx512vnni' (vpdpbusd), 'avx2'
  (maddubs + madd), 'scalar' or 'amx-emulated'; None without the
  library."""
  return set_gemv_isa() if available() else None


def best_gemv_isa():
  """The best Q8 GEMV path this CPU has (the one the library starts with
  unless TERRAFORMER_GEMV_ISA says otherwise; never an emulated one)."""
  lib = _load()
  if lib is None:
    raise RuntimeError(unavailable_reason())
  return GEMV_ISA_NAMES[lib.tf_best_gemv_isa()]


def emulated_tdpbssd():
  """TDPBSSDs the emulated AMX tiles have run in this process (tests: the
  'amx-emulated' path took its tile code)."""
  lib = _load()
  if lib is None:
    raise RuntimeError(unavailable_reason())
  return lib.tf_emulated_tdpbssd()


def set_parallel_bytes(n_bytes=None):
  """Weight bytes from which a product is split over XLA's CPU thread pool
  (default 1 MiB; for 8 or more rows of x, as the multiplicative dense layer
  of sparse QKV has, rows x float32 bytes of W; also the bytes of a Q8
  call's float activations, and of the W1ᵀ and W2 rows a sparse FF step
  reads, from which those are split; a huge value keeps every call
  on one thread). None keeps it. Returns the value in use."""
  lib = _load()
  if lib is None:
    raise RuntimeError(unavailable_reason())
  return lib.tf_set_parallel_bytes(-1 if n_bytes is None else int(n_bytes))


def _require():
  if _load() is None:
    raise RuntimeError(unavailable_reason())


def _f32(a):
  return jnp.asarray(a, jnp.float32)


def skinny_matmul(x, w, g=None, scale=None, bias=None):
  """[..., K] -> [..., S * N]: y[s*N + n] = sum_k x[k] g[s,k] scale[k] W[k,n].

  `w` [K, N] float32, bfloat16 or int8; `g` [S, K] (default ones [1, K]);
  `scale` [K] per-row scales of `w` (int8); `bias` [S * N].
  """
  _require()
  k, n = w.shape
  g = jnp.ones((1, k), jnp.float32) if g is None else _f32(g)
  scale = jnp.ones((k,), jnp.float32) if scale is None else _f32(scale)
  bias = jnp.zeros((1,), jnp.float32) if bias is None else _f32(bias)
  lead = x.shape[:-1]
  out = jax.ShapeDtypeStruct(lead + (g.shape[0] * n,), jnp.float32)
  return jax.ffi.ffi_call('tf_skinny_matmul', out)(_f32(x), g, scale, w, bias)


def _norm_operands(norm):
  """A kernel's optional LayerNorm: (scale, bias, epsilon) or None ->
  ({'norm_scale', 'norm_bias'}, epsilon); none: scale [1]."""
  if norm is None:
    return (dict(norm_scale=jnp.ones((1,), jnp.float32),
                 norm_bias=jnp.zeros((1,), jnp.float32)), np.float32(0))
  scale, bias, epsilon = norm
  return (dict(norm_scale=scale, norm_bias=bias),
          np.float32(epsilon))  # An F32 attribute.


def sparse_ff(x, block, norm=None, **operands):
  """The predict-mode sparse FF block (paper §3.1) of tokens x [..., d].

  `operands`: `operands.SPARSE_FF`'s by name: c1, c2, c, w1t, w2, b2; s1 and
  s2 (W1ᵀ's and W2's row scales; None or absent: ones); c2_scale (None or
  absent: C2 is float32 [r, F]; else C2 is packed by `layers.pack_q8` and
  these are its F scales, the controller's (x C1) C2 the Q8 product).
  `norm` (scale [d], bias [d], epsilon): the block's input is first
  `tl.LayerNorm`-ed (the LayerNorm before it, in the same call).
  """
  _require()
  values, epsilon = _sparse_ff_values(operands, norm)
  return ops.SPARSE_FF_KERNEL(dict(values, x=x), {'y': x.shape},
                              block=int(block), epsilon=epsilon)['y']


def _sparse_ff_values(operands, norm=None):
  """The sparse FF's operands by name, defaults filled in (`sparse_ff`), and
  the norm's epsilon."""
  values = dict(operands)
  ones = jnp.ones((values['w1t'].shape[0],), jnp.float32)
  for scales in ('s1', 's2'):
    if values.get(scales) is None:
      values[scales] = ones
  if values.get('c2_scale') is None:
    values['c2'], values['c2_scale'] = (_f32(values['c2']),
                                        jnp.ones((1,), jnp.float32))
  else:
    values['c2'] = jnp.asarray(values['c2'], jnp.int8)
  norm_values, epsilon = _norm_operands(norm)
  return dict(values, **norm_values), epsilon


def q8_matmul(x, packed, scale, g=None, bias=None, g_scale=None):
  """[..., K] -> [..., S * N]: y[s*N + n] = scale[n] sum_k Q(x g[s])[k] W[k, n].

  `packed`, `scale`: W [K, N] as `layers.pack_q8` stores it (int8, output-
  major, one scale per output). Each row x g[s] is quantized to int8 once
  per call, per block of 32 inputs (Q); the sums are integer dot products.
  `g` [S, K] (default ones [1, K]), float or int8 with one scale per row
  (`g_scale` [S]: g[s] stands for g_scale[s] g[s]); `bias` [S * N].
  """
  _require()
  k, n = x.shape[-1], scale.shape[0]
  g = jnp.ones((1, k), jnp.float32) if g is None else g
  if g.dtype == jnp.int8:
    g_scale = _f32(g_scale)
  else:
    g, g_scale = _f32(g), jnp.ones((1,), jnp.float32)
  bias = jnp.zeros((1,), jnp.float32) if bias is None else _f32(bias)
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (g.shape[0] * n,), jnp.float32)
  return jax.ffi.ffi_call('tf_q8_matmul', out)(
      _f32(x), g, g_scale, jnp.asarray(packed, jnp.int8), _f32(scale), bias)


def cache_attention(q, keys, values, idx, valid=None):
  """Causal softmax attention over a key/value cache, read in place.

  q [N, T, D] (queries at positions idx .. idx + T - 1), keys and values
  [N, M, D] float32 (the whole cache), idx [] int32, valid [N, M] bool
  (None: every key valid) -> [N, T, D]. Query t reads the keys at positions
  <= idx + t only: the math of Trax's `DotProductCausalAttention` (scaled
  dot products, -1e9 where masked, exp(dots - logsumexp(dots)) times the
  values) without slicing the cache.
  """
  _require()
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call('tf_cache_attention', out)(
      _f32(q), keys, values, _valid_keys(valid), jnp.asarray(idx, jnp.int32))


def _valid_keys(valid):
  """The attention kernels' valid-key mask: [N, M] bool, or [1] (every key
  valid) for None."""
  return (jnp.ones((1,), jnp.bool_) if valid is None
          else jnp.asarray(valid, jnp.bool_))


def sparse_qkv(x, qk_width, v_width, **operands):
  """Sparse QKV's step (paper §3.2) of one position per row, in one call.

  x [B, 1, d]; `operands`: `operands.SPARSE_QKV`'s by name: the
  multiplicative layer's D (d) [S, d] int8 with row scales d_scale [S], E
  (e) packed by `layers.pack_q8` (d -> M) with its scales e_scale [M] and
  bias e_bias [S * M]; kept [B, F - 1, S, M], the convolution's previous
  inputs; the Q and K kernels side by side (qk), packed (F qk_width M ->
  2 M), scales and bias [2 M]; the V kernel (v) packed (F v_width M -> M),
  scales and bias [M]. Returns (q, k, v [B, 1, S * M], kept'): the three
  `q8_matmul` calls of `KernelMultiplicativeDense` and `KernelModuleConv`,
  on the same operands, with the patches built in C++.
  """
  _require()
  b, _, s, m = operands['kept'].shape
  out = ops.SPARSE_QKV_KERNEL(
      dict(operands, x=x),
      {'q': (b, 1, s * m), 'k': (b, 1, s * m), 'v': (b, 1, s * m),
       'kept': operands['kept'].shape},
      qk_width=int(qk_width), v_width=int(v_width))
  return (out['q'], out['k'], out['v']), out['kept']


def sparse_qkv_attention(x, qk_width, v_width, norm=None, **operands):
  """A sparse QKV attention step (paper §3.2, Fig. 4b) in one call.

  `sparse_qkv`'s operands, then (`operands.CACHE`) the caches keys and
  values [N, L, D] float32 (N D = B S M: the heads of q, k, v in rows of
  D), idx [] int32 (the step's position) and valid [N, L] bool (None or
  absent: every key valid). k and v are written into the caches at idx, in
  place (the returned caches alias them), and q attends over positions
  <= idx as `cache_attention`. `norm` (scale [d], bias [d], epsilon): x is
  first `tl.LayerNorm`-ed. Returns (y [B, 1, S * M], keys', values',
  kept').
  """
  _require()
  values, epsilon = _attention_values(operands, norm)
  b, _, s, m = operands['kept'].shape
  out = ops.SPARSE_QKV_ATTENTION(
      dict(values, x=x), _attention_shapes(operands, y=(b, 1, s * m)),
      qk_width=int(qk_width), v_width=int(v_width), epsilon=epsilon)
  return tuple(out[name] for name in ops.SPARSE_QKV_ATTENTION.results)


def _attention_values(operands, norm=None):
  """A sparse QKV attention step's operands by name (valid's default: every
  key valid), and the norm's epsilon."""
  norm_values, epsilon = _norm_operands(norm)
  values = dict(operands, **norm_values)
  values['valid'] = _valid_keys(values.get('valid'))
  return values, epsilon


def _attention_shapes(operands, prefix=None, **others):
  """The result shapes of a sparse QKV attention step with `operands`
  (under `prefix`), and `others`."""
  shapes = dict(keys=operands['keys'].shape, values=operands['keys'].shape,
                kept=operands['kept'].shape)
  return dict(ops.prefixed(prefix, shapes) if prefix else shapes, **others)


def _pop_ints(arguments, *names):
  """A copy of `arguments` without `names`, and their values as ints."""
  rest = dict(arguments)
  return rest, tuple(int(rest.pop(name)) for name in names)


def terraformer_block(x1, x2, attentions, ff, sru):
  """A Terraformer decoder block's step (§4.1-4.3) in one call.

  On the reversible streams x1, x2 [B, 1, d]:
    y = x1 + A(x2),  z = x2 + B(y),  w = y + (FF(z) + SRU(z)),
  returns (z, w) = (x1', x2'), as `models.terraformer._DecoderBlock`'s
  half-residuals and swaps compute them. `attentions`: A's and B's
  keyword arguments of `sparse_qkv_attention` after x (their norms
  included; the same kernel widths); `ff`: `sparse_ff`'s after x (C2
  packed); `sru`: the SRU path's, `operands.SRU`'s by name (down_bias and
  up_bias None: none) but its norm, given as norm (scale, bias, epsilon),
  and its highway_scale and activation (None or 'tanh'). Every norm has the
  same epsilon. Returns (x1', x2', (keys', values', kept') of A and of B,
  c').
  """
  _require()
  values, shapes = {'x1': x1, 'x2': x2}, {'x1': x1.shape, 'x2': x1.shape}
  epsilons, widths = [], set()
  for prefix, attention in zip(('a', 'b'), attentions):
    attention, width = _pop_ints(attention, 'qk_width', 'v_width')
    widths.add(width)
    norm = attention.pop('norm', None)
    attention_values, epsilon = _attention_values(attention, norm)
    values.update(ops.prefixed(prefix, attention_values))
    shapes.update(_attention_shapes(attention, prefix))
    epsilons.append(epsilon)
  ff, (block,) = _pop_ints(ff, 'block')
  norm = ff.pop('norm', None)
  ff_values, epsilon = _sparse_ff_values(ff, norm)
  values.update(ops.prefixed('ff', ff_values))
  epsilons.append(epsilon)
  sru = dict(sru)
  highway_scale, activation = sru.pop('highway_scale'), sru.pop('activation')
  norm_values, epsilon = _norm_operands(sru.pop('norm'))
  epsilons.append(epsilon)
  for bias in ('down_bias', 'up_bias'):
    if sru.get(bias) is None:
      sru[bias] = jnp.zeros((1,), jnp.float32)
  values.update(ops.prefixed('sru', dict(sru, **norm_values)))
  shapes['sru.c'] = sru['c'].shape
  if len(widths) != 1 or len(set(epsilons)) != 1:
    raise ValueError('tf_terraformer_block: the two attentions must have the '
                     'same kernel widths and every norm the same epsilon')
  (qk_width, v_width), = widths
  out = ops.TERRAFORMER_BLOCK(
      values, shapes, qk_width=qk_width, v_width=v_width, block=block,
      epsilon=epsilons[0], highway_scale=np.float32(highway_scale),
      use_tanh=activation == 'tanh')
  caches_a, caches_b = (tuple(out[f'{p}.{n}'] for n in ops.ATTENTION_RESULTS)
                        for p in ('a', 'b'))
  return out['x1'], out['x2'], caches_a, caches_b, out['sru.c']


def scaling_block(x, attention, ff, cross=None):
  """A Scaling Transformer decoder block's step (paper §3) in one call.

  x [B, 1, d]:  a = x + A(x),  b = a + C(a) (b = a without `cross`),
  y = b + FF(b), as the block's `tl.Residual`s compute them
  (`models.scaling_transformer._Block`, `_EncoderDecoderBlock`).
  `attention`: A's keyword arguments of `sparse_qkv_attention` after x (its
  norm included); `ff`: `sparse_ff`'s after x (C2 packed); `cross`: the
  sparse-query cross-attention's, `operands.SPARSE_Q` and
  `operands.ENCODER`'s by name: the queries' d, d_scale, e, e_scale, e_bias,
  kept, q, q_scale, q_bias; the encoder's keys_t [B, H, D, L] and values
  [B, H, L, D] (`CrossAttention`'s state), its mask (B L elements, 0 at
  padding); its norm as norm (scale, bias, epsilon), and the width q_width.
  Every norm has the same epsilon.
  Returns (y, (keys', values', kept') of A, C's kept' or None).
  """
  _require()
  attention, (qk_width, v_width) = _pop_ints(attention, 'qk_width', 'v_width')
  norm = attention.pop('norm', None)
  attention_values, epsilon = _attention_values(attention, norm)
  values = dict(ops.prefixed('attention', attention_values), x=x)
  shapes = _attention_shapes(attention, 'attention', y=x.shape)
  epsilons = [epsilon]
  q_width = 1
  if cross is not None:
    cross, (q_width,) = _pop_ints(cross, 'q_width')
    norm_values, epsilon = _norm_operands(cross.pop('norm'))
    epsilons.append(epsilon)
    values.update(ops.prefixed('cross', dict(cross, **norm_values)))
    shapes['cross.kept'] = cross['kept'].shape
  ff, (block,) = _pop_ints(ff, 'block')
  norm = ff.pop('norm', None)
  ff_values, epsilon = _sparse_ff_values(ff, norm)
  values.update(ops.prefixed('ff', ff_values))
  epsilons.append(epsilon)
  if len(set(epsilons)) != 1:
    raise ValueError('tf_scaling_block: every norm must have the same '
                     'epsilon')
  kernel = ops.SCALING_BLOCK if cross is None else ops.SCALING_BLOCK_CROSS
  out = kernel(values, shapes, qk_width=qk_width, v_width=v_width,
               q_width=q_width, block=block, epsilon=epsilons[0],
               cross=cross is not None)
  caches = tuple(out[f'attention.{n}'] for n in ops.ATTENTION_RESULTS)
  return out['y'], caches, out.get('cross.kept')
