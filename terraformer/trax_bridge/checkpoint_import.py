"""Loading Trax 1.4.1 checkpoints of the paper's models into ours.

The paper's models were trained with Trax's research code; its checkpoints
(`model.pkl.gz` + `model.weights.npy.gz`, written by `training.Loop`) store
the weights as one flat list, in the order of Trax's layer tree. Trax 1.4.1's
own restore is broken on this JAX (a tree comparison raises), so the files
are read directly.

Our models have the same layers in the same order as their Trax counterparts:

  ScalingTransformerLM  <-  trax.models.research.configurable_transformer.
                            ConfigurableTransformerLM
  ScalingTransformer    <-  ...configurable_transformer.ConfigurableTransformer
  Terraformer           <-  trax.models.research.terraformer.
                            ConfigurableTerraformer

so the import walks OUR model's layer tree (built from our gin config) and,
for each of our weight-bearing layers, lists the arrays its Trax counterpart
stores, with their Trax names and shapes (`_LAYER_IMPORTS`, one small entry
per layer type). That list is the expected layout of the checkpoint: every
array is checked (count and shape, in order) before anything is built, and
the first one that does not fit is reported as

  Trax checkpoint does not match the model: Trax weight 7 of 31,
  Residual[0]/_SparseFFMain/w1: checkpoint (16, 4, 8) vs expected (16, 4, 4)

Trax names are `Residual[i]/<Trax layer>/<weight>`: the i-th residual block
of the model in order (the attention and feed-forward halves of each layer
are separate blocks), the Trax layer class (`Dense`, `LayerNorm`,
`FactoredDense`, `Conv`, `_SparseFFController`, `_SparseFFMain`, ...) and the
weight's role. Nothing is loaded partially: either every weight maps or a
`TerraformerError` is raised.

Layout changes (the transforms in `_LAYER_IMPORTS`):
  SparseFF   Trax w1 [d_model, d_ff/N, N] and w2 [N, d_ff/N, d_model] index
             unit (block x, element y) as w1[:, x, y] and w2[y, x]; our W1ᵀ
             and W2 are [d_ff, d_model] with that unit at row x*N + y.
             Controller m2 [d_lowrank, d_ff/N, N] and bias [d_ff/N, N] are
             flattened the same way.
  Attention  Trax's efficient SelfAttention: w_q, w_k, w_v [n_heads,
             d_model, d_head], w_o [n_heads, d_head, d_model], no biases;
             ours: Dense q, k, v, o ([d_model, n_heads*d_head], head-major
             columns) with zero biases. LSHSelfAttention's shared w_qk is
             our w_q and w_k (we attend with (q + k) / 2).
  Order      Terraformer: Trax embeds the decoder tokens (its decoder
             positions; output embedding if unshared) before the encoder
             blocks, ours after the encoder; the plan reorders them.
  Names      `ReversibleHalfResidual[i]/...`: the i-th reversible half
             residual (attention or feed-forward half) in our order.
  SRU        Trax's tl.SRU Dense(3n) kernel and bias = our SRU (W, b).
  The other layers store Trax's arrays as they are (FactoredDense = our
  MultiplicativeDense, LocallyConvDense = our ModuleConv, per output).
"""
import math
import os

import jax
import numpy as np
from trax import layers as tl
from trax import shapes

from terraformer.checkpoint import format as checkpoint_format
from terraformer.checkpoint import layout as checkpoint_layout
from terraformer.decoding import search as decoding
from terraformer.errors import TerraformerError
from terraformer.layers import low_rank_sru
from terraformer.layers import multiplicative_dense
from terraformer.layers import reversible
from terraformer.layers import sparse_ff
from terraformer.layers import sparse_qkv_attention


# Our model functions and the Trax model each one imports.
TRAX_COUNTERPARTS = {
    'ScalingTransformerLM': 'ConfigurableTransformerLM',
    'ScalingTransformer': 'ConfigurableTransformer',
    'Terraformer': 'ConfigurableTerraformer',
}


class _Import:
  """One of our layers' weights, made from consecutive Trax arrays.

  `trax` lists (name, shape) of the Trax arrays, in checkpoint order;
  `build(arrays)` returns our layer's weights (a tuple or one array).
  """

  def __init__(self, trax, build):
    self.trax = trax
    self.build = build


def _shape(sig):
  return tuple(sig.shape)


# --- One entry per layer type: Trax arrays -> our weights ------------------

def _same(trax_layer, roles):
  """Our weights are Trax's, one to one (tuple, or a single array)."""
  def imports(layer, sig):
    del layer
    leaves = sig if isinstance(sig, (tuple, list)) else (sig,)
    if len(leaves) != len(roles):
      raise TerraformerError(f'{trax_layer}: {len(leaves)} weight arrays, '
                             f'Trax has {len(roles)}')
    trax = [(f'{trax_layer}/{r}', _shape(s)) for r, s in zip(roles, leaves)]
    if isinstance(sig, (tuple, list)):
      return _Import(trax, tuple)
    return _Import(trax, lambda arrays: arrays[0])
  return imports


def _sparse_ff(layer, sig):
  """Trax's SparseFF: controller (m1, m2, mb), then main (w1, w2, b2).

  Ours is (C1, C2, c, W1ᵀ, W2, b2); unit (block x, element y) is our row
  x*N + y and Trax's w1[:, x, y], w2[y, x] (`SparseFF`'s docstring).
  """
  n = layer._n_block  # pylint: disable=protected-access
  if len(sig) != 6 or _shape(sig[2]) != (_shape(sig[1])[1],):
    raise TerraformerError(
        f'our SparseFF weights {[_shape(s) for s in sig]} are not '
        '(C1, C2, controller bias, W1ᵀ, W2, b2): cannot import Trax weights')
  d_model, d_lowrank = _shape(sig[0])
  d_ff = _shape(sig[1])[1]
  blocks = d_ff // n
  trax = [
      ('_SparseFFController/m1', (d_model, d_lowrank)),
      ('_SparseFFController/m2', (d_lowrank, blocks, n)),
      ('_SparseFFController/bias', (blocks, n)),
      ('_SparseFFMain/w1', (d_model, blocks, n)),
      ('_SparseFFMain/w2', (n, blocks, d_model)),
      ('_SparseFFMain/b2', (d_model,)),
  ]

  def build(arrays):
    m1, m2, mb, w1, w2, b2 = arrays
    return (m1, m2.reshape(d_lowrank, d_ff), mb.reshape(d_ff),
            w1.reshape(d_model, d_ff).T,
            np.transpose(w2, (1, 0, 2)).reshape(d_ff, d_model), b2)
  return _Import(trax, build)


def _multiplicative_dense(layer, sig):
  """Trax's FactoredDense: gating [S, d], projection [d, M], bias [S*M]."""
  del layer
  roles = ('gating', 'projection', 'bias')[:len(sig)]
  return _same('FactoredDense', roles)(None, sig)


def _module_conv(layer, sig):
  """Trax's LocallyConvDense per output: tl.Conv kernel [F, F', M, M], bias."""
  del layer
  roles = []
  for i in range(len(sig) // 2):
    roles += [f'Conv[{i}].kernel', f'Conv[{i}].bias']
  return _same('LocallyConvDense', roles)(None, sig)


def _tree(trax_layer, role):
  """Our weights are Trax's nested tuple, leaf for leaf (`role[i]`)."""
  def imports(layer, sig):
    del layer
    leaves, tree = jax.tree_util.tree_flatten(sig)
    trax = [(f'{trax_layer}/{role}[{i}]', _shape(s))
            for i, s in enumerate(leaves)]
    return _Import(trax,
                   lambda arrays: jax.tree_util.tree_unflatten(tree, arrays))
  return imports


def _dense_projections(layer):
  """Our `SelfAttention` with dense projections: (Branch(Dense x3), .., Dense).

  Sparse QKV attention (no output Dense) is walked layer by layer instead.
  """
  subs = layer.sublayers
  if not (layer.name in ('FULLSelfAttention', 'LSHSelfAttention') and subs
          and isinstance(subs[-1], tl.Dense)):
    return False
  branch = subs[0].sublayers              # Select, Parallel(Dense x3)
  return (subs[0].name == 'Branch' and len(branch) == 2
          and len(branch[1].sublayers) == 3
          and all(isinstance(d, tl.Dense) for d in branch[1].sublayers))


def _self_attention(layer, sig):
  """Trax's efficient `SelfAttention` / `LSHSelfAttention` (no biases).

  Trax: w_q, w_k, w_v [n_heads, d_model, d_head], w_o [n_heads, d_head,
  d_model]; LSH has one w_qk for queries and keys. Ours: Dense q, k, v, o
  with head h at columns h*d_head.. (tl.SplitIntoHeads); biases set to 0.
  LSH: w_qk is our w_q and w_k, so our (q + k) / 2 is Trax's shared qk.
  """
  (q, _, _), o = sig[0][1], sig[-1]
  if any(_has_arrays(w) for w in sig[1:-1]) or _has_arrays(sig[0][0]):
    raise TerraformerError(f'{layer.name}: weights outside its projections')
  d_model, width = _shape(q[0])
  n_heads = _n_heads(layer)
  d_head = width // n_heads
  lsh = layer.name == 'LSHSelfAttention'
  in_shape = (n_heads, d_model, d_head)
  names = ('w_qk', 'w_v') if lsh else ('w_q', 'w_k', 'w_v')
  trax = [(f'{"LSH" if lsh else ""}SelfAttention/{n}', in_shape)
          for n in names]
  trax.append((f'{"LSH" if lsh else ""}SelfAttention/w_o',
               (n_heads, d_head, _shape(o[0])[1])))

  def dense_in(w):
    return (np.transpose(w, (1, 0, 2)).reshape(d_model, width),
            np.zeros((width,), w.dtype))

  def build(arrays):
    ins, w_o = arrays[:-1], arrays[-1]
    if lsh:
      ins = [ins[0], ins[0], ins[1]]
    q_k_v = tuple(dense_in(w) for w in ins)
    out = (w_o.reshape(width, w_o.shape[-1]),
           np.zeros((w_o.shape[-1],), w_o.dtype))
    weights = list(sig)
    weights[0] = (sig[0][0], q_k_v)
    weights[-1] = out
    return tuple(weights)
  return _Import(trax, build)


def _n_heads(layer):
  """The head count of our attention (its attention core's `_n_heads`)."""
  stack = list(layer.sublayers)
  while stack:
    sub = stack.pop()
    n = getattr(sub, '_n_heads', None)
    if isinstance(n, int) and n > 0:
      return n
    stack.extend(sub.sublayers)
  raise TerraformerError(f'{layer.name}: cannot find its number of heads')


_LAYER_IMPORTS = (
    # (our layer class, its import); checked in order with isinstance.
    (sparse_ff.SparseFF, _sparse_ff),
    (multiplicative_dense.MultiplicativeDense, _multiplicative_dense),
    (sparse_qkv_attention.ModuleConv, _module_conv),
    (low_rank_sru.SRU, _same('SRU/Dense', ('kernel', 'bias'))),
    (tl.Embedding, _same('Embedding', ('embedding',))),
    (tl.PositionalEncoding, _same('PositionalEncoding', ('positions',))),
    (tl.LayerNorm, _same('LayerNorm', ('scale', 'bias'))),
    (tl.Dense, _same('Dense', ('kernel', 'bias'))),
)


def _layer_import(layer):
  # By class name along the MRO: Trax's `assert_shape` decorator wraps some
  # layer classes (e.g. tl.PositionalEncoding) in new classes.
  if _dense_projections(layer):
    return _self_attention
  if layer.name == 'FixedBasePositionalEncoding':
    return _tree('FixedBasePositionalEncoding', 'weights')
  names = {cls.__name__ for cls in type(layer).__mro__}
  for cls, imports in _LAYER_IMPORTS:
    if isinstance(layer, cls) or cls.__name__ in names:
      return imports
  return None


def _has_arrays(sig):
  return bool(jax.tree_util.tree_leaves(sig))


def _is_residual(layer):
  """tl.Residual's layer: Serial(Branch(shortcut, layers), Add)."""
  subs = layer.sublayers
  return (isinstance(layer, tl.Serial) and len(subs) == 2
          and subs[0].name == 'Branch' and subs[1].name == 'Add')


class _Plan:
  """The Trax layout expected for our model, and how to fill its weights."""

  def __init__(self, model, weights_sig):
    self.entries = []  # (our path, _Import, Trax names with prefix)
    self._residuals = 0
    self._half_residuals = 0
    self._seen = set()
    self._walk(model, weights_sig, model.name, '')
    self._to_trax_order(model)

  @property
  def trax_layout(self):
    return [(name, shape) for _, imp, names in self.entries
            for name, (_, shape) in zip(names, imp.trax)]

  def _walk(self, layer, sig, path, trax_prefix):
    if id(layer) in self._seen:  # A shared layer: Trax stores it once too.
      return
    self._seen.add(id(layer))
    imports = _layer_import(layer)
    if imports is not None and _has_arrays(sig):
      imp = imports(layer, sig)
      self.entries.append(
          (path, imp, [trax_prefix + name for name, _ in imp.trax]))
      return
    if _is_residual(layer):
      trax_prefix = f'{trax_prefix}Residual[{self._residuals}]/'
      self._residuals += 1
    elif isinstance(layer, reversible.HalfResidual):
      trax_prefix = (f'{trax_prefix}ReversibleHalfResidual'
                     f'[{self._half_residuals}]/')
      self._half_residuals += 1
    subs = layer.sublayers
    if subs and isinstance(sig, (tuple, list)) and len(sig) == len(subs):
      for i, (sub, sub_sig) in enumerate(zip(subs, sig)):
        self._walk(sub, sub_sig, f'{path}[{i}]/{sub.name}', trax_prefix)
      return
    if _has_arrays(sig):
      raise TerraformerError(
          f'cannot import Trax weights into {path}: layer {layer.name} has '
          'no Trax counterpart')

  def _to_trax_order(self, model):
    """Reorders the entries where Trax's layer tree differs from ours.

    Terraformer: Trax embeds the decoder tokens (its out_encoder: output
    Embedding if not shared, positions) right after the encoder's embedding,
    before the encoder blocks; ours does it after the encoder.
    """
    subs = model.sublayers
    names = [sub.name for sub in subs]
    if 'EncoderDecoderConcat' not in names:
      return
    concat = names.index('EncoderDecoderConcat')
    encoder = next(i for i, sub in enumerate(subs)
                   if i < concat and _has_reversible(sub))
    decoder_embedder = tuple(f'{model.name}[{i}]/'
                             for i in range(encoder + 1, concat))
    moved = [e for e in self.entries if e[0].startswith(decoder_embedder)]
    rest = [e for e in self.entries if not e[0].startswith(decoder_embedder)]
    encoder_prefix = f'{model.name}[{encoder}]/'
    blocks = next(i for i, e in enumerate(rest)
                  if e[0].startswith(encoder_prefix)
                  and '/ReversibleSerial' in e[0])
    self.entries = rest[:blocks] + moved + rest[blocks:]

  def fill(self, model, weights_sig, built):
    """Our weights tree, with each converted layer's weights from `built`.

    `built[i]` holds the weights of `self.entries[i]` (matched by path).
    """
    by_path = {path: w for (path, _, _), w in zip(self.entries, built)}
    seen = set()

    def walk(layer, sig, path):
      if id(layer) in seen:
        return sig
      seen.add(id(layer))
      if path in by_path:
        return by_path[path]
      subs = layer.sublayers
      if subs and isinstance(sig, (tuple, list)) and len(sig) == len(subs):
        return tuple(walk(s, w, f'{path}[{i}]/{s.name}')
                     for i, (s, w) in enumerate(zip(subs, sig)))
      return sig
    return walk(model, weights_sig, model.name)


def _has_reversible(layer):
  if isinstance(layer, tl.ReversibleSerial):
    return True
  return any(_has_reversible(sub) for sub in layer.sublayers)


def _input_signature(model, length=16):
  """Tokens [1, length]; with LSH, length is a multiple of its chunks."""
  chunks = _lsh_chunk_lens(model)
  if chunks:
    length = math.lcm(*chunks)
  token = shapes.ShapeDtype((1, length), np.int32)
  return (token, token) if decoding.is_encoder_decoder(model) else token


def _lsh_chunk_lens(layer):
  own = getattr(layer, '_chunk_len', None)
  lens = [own] if isinstance(own, int) and own > 0 else []
  for sub in layer.sublayers:
    lens += _lsh_chunk_lens(sub)
  return lens


def import_weights(model, flat, source='Trax checkpoint', signature=None):
  """Our model's weights tree made from Trax's flat weight list.

  Args:
    model: our model (e.g. `ScalingTransformerLM(mode='eval')`), built from
      the config matching the Trax model's hyperparameters; not initialized.
    flat: the checkpoint's flat list of arrays
      (`terraformer.checkpoint.format.load_flat_weights`).
    source: what to call the checkpoint in errors.
    signature: input signature for our model's shapes (a default if None).

  Returns:
    The weights tree of `model` (numpy arrays, our dtypes).

  Raises:
    TerraformerError naming the first Trax weight that does not fit.
  """
  signature = signature or _input_signature(model)
  weights_sig = decoding.weights_signature(model, signature)
  plan = _Plan(model, weights_sig)
  layout = plan.trax_layout
  for i, (name, shape) in enumerate(layout):
    if i >= len(flat):
      raise TerraformerError(
          f'{source} does not match the model: Trax weight {i} of '
          f'{len(layout)}, {name} {shape}: missing (the checkpoint has '
          f'{len(flat)} weight arrays, the model needs {len(layout)})')
    if tuple(np.shape(flat[i])) != tuple(shape):
      raise TerraformerError(
          f'{source} does not match the model: Trax weight {i} of '
          f'{len(layout)}, {name}: checkpoint {tuple(np.shape(flat[i]))} vs '
          f'expected {tuple(shape)}')
  if len(flat) > len(layout):
    raise TerraformerError(
        f'{source} does not match the model: it has {len(flat)} weight '
        f'arrays, the model needs {len(layout)}; the first extra one has '
        f'shape {tuple(np.shape(flat[len(layout)]))}')
  arrays = iter(flat)
  built = []
  for _, imp, _ in plan.entries:
    chunk = [np.asarray(next(arrays)) for _ in imp.trax]
    built.append(imp.build([checkpoint_format.from_bits(a) for a in chunk]))
  weights = plan.fill(model, weights_sig, built)
  return jax.tree_util.tree_map(
      lambda w, s: np.asarray(w).astype(s.dtype), weights, weights_sig)


def load_trax_into(model, path, signature=None):
  """`model` (our, uninitialized) with the weights of Trax checkpoint `path`.

  Returns (weights tree, step of the checkpoint).
  """
  flat, step = checkpoint_format.load_flat_weights(path, 'Trax checkpoint')
  source = f'Trax checkpoint {checkpoint_format.checkpoint_file(path)}'
  return import_weights(model, flat, source, signature), step


def flat_arrays(weights):
  """The flat weight list of a weights tree, in checkpoint order."""
  return [np.asarray(w) for w in tl.flatten_weights_and_state(weights, ())[0]]


def write_checkpoint(weights, output_dir, step=0, source=None):
  """Writes `weights` as a Loop checkpoint `output_dir/model.pkl.gz`.

  terraformer-decode / -eval (`terraformer.loading.model.load_model`) and
  `train(init_checkpoint=...)` read it. It is written atomically
  (`terraformer.checkpoint.format`), so a crash leaves no half checkpoint.
  """
  path = os.path.join(output_dir, checkpoint_format.CHECKPOINT)
  flat = [checkpoint_format.to_bits(w) for w in flat_arrays(weights)]
  checkpoint_format.write_trax_checkpoint(path, {
      'step': step, 'flat_weights': flat, 'flat_state': (),
      'flat_eval_state': (), 'slots_per_task': (),
      'imported_from': source,
      'version_timestamp': checkpoint_layout.TRAX_VERSION_TIMESTAMP})
  return path
