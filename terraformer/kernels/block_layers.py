"""Predict-mode layers that run a residual branch or a whole decoder block
in one kernel call, made so by `installer.install`:

  LayerNorm + a sparse QKV attention or SparseFF       the same call
  (a block's residual branch)                          (`layers`), the
                       -> KernelNormSerial             LayerNorm first in it
  Terraformer decoder blocks (their reversible stack) tf_terraformer_block
                       -> KernelReversibleSerial      ('q8'; a whole block,
                          two attentions, sparse FF and SRU, in one call)
  Scaling Transformer decoder blocks (the Serial      tf_scaling_block
  holding them)        -> KernelScalingBlocks         ('q8'; a whole block,
                          attention, cross-attention, sparse FF, one call)

Each asks its parts (`layers`' kernel layers) for their calls' arguments
(`step_arguments`) and runs its sublayers as the Serial does where a part
would not run its own call (a prompt, other storages, a missing library).
"""
import jax.numpy as jnp
from trax import layers as tl
from trax.layers import combinators as trax_combinators

from terraformer import kernels
from terraformer.kernels import compositions
from terraformer.kernels.layers import is_q8
from terraformer.kernels.layers import KernelDense
from terraformer.kernels.layers import KernelMixin
from terraformer.kernels.layers import KernelSparseFF
from terraformer.kernels.layers import KernelSparseQKV
from terraformer.kernels.layers import KernelSparseQKVAttention
from terraformer.layers import composites
from terraformer.layers import reversible as rev
from terraformer.layers.cross_attention import CrossAttention
from terraformer.layers.low_rank_sru import ACTIVATIONS as SRU_ACTIVATIONS
from terraformer.layers.sparse_ff import SparseFF


def _centred_norm(layer):
  """The centred `tl.LayerNorm` of a norm branch's norm layer (itself, or
  beside the lengths); None for another."""
  norm = compositions.layer_norm(layer)
  return norm if norm is not None and norm._center else None  # pylint: disable=protected-access


def _is_predict_dropout(layer):
  return isinstance(layer, tl.Dropout) and layer._mode != 'train'  # pylint: disable=protected-access


def runs_as_one_call(norm_branch):
  """Whether a NORM_BRANCH (`compositions.norm_branch`) can run as its
  f's one call with the LayerNorm in it (`KernelNormSerial`): a centred
  LayerNorm, Dropout the identity (predict mode), f a predict-mode sparse
  QKV causal attention or SparseFF."""
  i_norm, i_f = compositions.norm_branch(norm_branch)
  subs = norm_branch.sublayers
  f = subs[i_f]
  if composites.name_of(f) == composites.SPARSE_QKV_CAUSAL_ATTENTION:
    i_attention = compositions.sparse_qkv_causal_attention(f)[3]
    fits = getattr(f.sublayers[i_attention], '_mode', None) == 'predict'
  else:
    fits = isinstance(f, SparseFF) and getattr(f, '_mode', None) == 'predict'
  return (fits and _centred_norm(subs[i_norm]) is not None
          and _is_predict_dropout(subs[i_f + 1]))


class KernelNormSerial(KernelMixin, trax_combinators.Serial):
  """A decoder block's residual branch, LayerNorm then a sparse FF block or
  a sparse QKV attention (then Dropout, the identity when decoding; the
  Terraformer's FF branch starts with Select[0], dropping the lengths),
  whose decoding step is that kernel layer's one call with the LayerNorm
  as its first operation (`fused_step`'s `norm`): `tf_sparse_ff` or
  `tf_sparse_qkv_attention` normalizes x itself (the mean and variance
  summed in double, so within float rounding of XLA's LayerNorm). Where
  the kernel layer does not run its call, the sublayers run.
  """

  def step_arguments(self, x, weights, state):
    """('attention' or 'sparse_ff', the keyword arguments after x of
    `kernels.sparse_qkv_attention` or `kernels.sparse_ff`, norm included,
    the function of the call's outputs after y that gives the new state)
    for the step of x with `weights` and `state`; None where the kernel
    layer does not run its call."""
    i_norm, i_kernel = compositions.norm_branch(self)
    norm = _centred_norm(self.sublayers[i_norm])
    w_norm = weights[i_norm]
    if isinstance(self.sublayers[i_norm], trax_combinators.Parallel):
      w_norm = w_norm[0]
    scale, bias = w_norm
    folded = (scale, bias, norm._epsilon)  # pylint: disable=protected-access
    kernel = self.sublayers[i_kernel]

    def with_kernel_state(kernel_state):
      s = list(state)
      s[i_kernel] = kernel_state
      return tuple(s)

    if isinstance(kernel, KernelSparseQKVAttention):
      step = kernel.step_arguments(x, weights[i_kernel], state[i_kernel])
      if step is None:
        return None
      arguments, new_state = step
      return ('attention', dict(arguments, norm=folded),
              lambda *outputs: with_kernel_state(new_state(*outputs)))
    if (isinstance(kernel, KernelSparseFF)
        and not isinstance(state[i_kernel], dict)):
      arguments = kernel.step_arguments(x, weights[i_kernel])
      if arguments is None:
        return None
      return 'sparse_ff', dict(arguments, norm=folded), lambda: state
    return None

  def forward(self, xs):
    x = xs[0] if isinstance(xs, (tuple, list)) else xs
    step = self.step_arguments(x, self.weights, self.state)
    if step is None:
      return super().forward(xs)
    kind, arguments, new_state = step
    if kind == 'attention':
      y, *outputs = kernels.sparse_qkv_attention(x, **arguments)
    else:
      y, outputs = kernels.sparse_ff(x, **arguments), ()
    self.state = new_state(*outputs)
    return y.astype(x.dtype)


def _path(root, target):
  """Sublayer indices from `root` down to `target` (None: not under it);
  the same indices lead to its weights and state."""
  if root is target:
    return ()
  for i, sub in enumerate(root.sublayers):
    found = _path(sub, target)
    if found is not None:
      return (i,) + found
  return None


def _at(tree, path):
  for i in path:
    tree = tree[i]
  return tree


def _with(tree, path, value):
  """`tree` (nested tuples) with the item at `path` replaced."""
  if not path:
    return value
  items = list(tree)
  items[path[0]] = _with(tree[path[0]], path[1:], value)
  return tuple(items)


def _feed_forward_parts(f):
  """The parts of a Terraformer decoder's SRU_FEED_FORWARD f
  (`compositions.sru_feed_forward`: its sparse FF's KernelNormSerial, the
  SRU path's LayerNorm, Dense(d_sru), SRU, Dense(d_model)) when each runs
  its kernel; None for another f."""
  if composites.name_of(f) != composites.SRU_FEED_FORWARD:
    return None
  parts = compositions.sru_feed_forward(f)
  ff_branch, _, down, _, up = parts
  if (isinstance(ff_branch, KernelNormSerial)
      and isinstance(_kernel_of(ff_branch), SparseFF)
      and isinstance(down, KernelDense) and isinstance(up, KernelDense)):
    return parts
  return None


def _kernel_of(norm_serial):
  return norm_serial.sublayers[compositions.norm_branch(norm_serial)[1]]


def _is_decoder_block(layers):
  """Whether the six layers of a Terraformer decoder block
  (`compositions.terraformer_decoder`) run as one call: half-residuals of
  two sparse QKV attentions' KernelNormSerials and of the feed-forward
  with its SRU, each part running its kernel."""
  a, b, f = (h.sublayers[0] for h in layers[0::2])
  return (all(isinstance(n, KernelNormSerial)
              and isinstance(_kernel_of(n), KernelSparseQKVAttention)
              for n in (a, b))
          and _feed_forward_parts(f) is not None)


class KernelReversibleSerial(KernelMixin, rev.ReversibleSerial):
  """A reversible stack of Terraformer decoder blocks whose decoding step,
  with 'q8' storage, is one `tf_terraformer_block` call per block: its two
  sparse QKV attentions (each `tf_sparse_qkv_attention`'s work, LayerNorm
  included), the sparse FF block (`tf_sparse_ff`'s), the low-rank SRU path
  (LayerNorm, the two 'q8' dense layers, the SRU cell) and the
  half-residual sums and swaps. The position indices stay XLA's. A prompt,
  other stacks (the encoder's), and blocks whose parts would not run their
  own fused calls run the sublayers.
  """

  def _block_arguments(self, x, weights, state, i):
    """`kernels.terraformer_block`'s arguments after x1 and x2 for the
    block at sublayer i, and the function of its results after x1', x2'
    that gives the new states of its sublayers; None where it cannot run."""
    halves = self.sublayers[i:i + 6:2]
    f_weights = [weights[i + 2 * k][0] for k in range(3)]
    f_states = [state[i + 2 * k][0] for k in range(3)]
    attentions = []
    for k in range(2):
      step = halves[k].sublayers[0].step_arguments(x, f_weights[k],
                                                   f_states[k])
      if step is None or step[0] != 'attention':
        return None
      attentions.append(step)
    f = halves[2].sublayers[0]
    ff_branch, norm, down, sru, up = _feed_forward_parts(f)
    paths = [_path(f, layer) for layer in (ff_branch, norm, down, sru, up)]
    w_ff, w_norm, w_down, w_sru, w_up = (_at(f_weights[2], p) for p in paths)
    s_ff, s_sru = _at(f_states[2], paths[0]), _at(f_states[2], paths[3])
    ff_step = ff_branch.step_arguments(x, w_ff, s_ff)
    if ff_step is None or ff_step[0] != 'sparse_ff':
      return None
    dense = [d._split_weights(w) for d, w in ((down, w_down), (up, w_up))]  # pylint: disable=protected-access
    epsilon = norm._epsilon  # pylint: disable=protected-access
    if (not all(is_q8(w) for w, _, _ in dense)
        or not norm._center  # pylint: disable=protected-access
        or sru._mode != 'predict'  # pylint: disable=protected-access
        or sru._activation not in SRU_ACTIVATIONS  # pylint: disable=protected-access
        or any(a['norm'][2] != epsilon for _, a, _ in attentions)
        or ff_step[1]['norm'][2] != epsilon):
      return None
    (w_down_packed, b_down, scale_down), (w_up_packed, b_up, scale_up) = dense
    w_cell, b_cell = w_sru
    sru_arguments = dict(
        norm=(*w_norm, epsilon), down=w_down_packed, down_scale=scale_down,
        down_bias=b_down, w=w_cell, b=b_cell, c=s_sru, up=w_up_packed,
        up_scale=scale_up, up_bias=b_up,
        highway_scale=sru._highway_scale,  # pylint: disable=protected-access
        activation=sru._activation)  # pylint: disable=protected-access

    def new_states(caches_a, caches_b, c):
      new = {i: (attentions[0][2](*caches_a),),
             i + 2: (attentions[1][2](*caches_b),),
             i + 4: (_with(f_states[2], paths[3], c.astype(s_sru.dtype)),)}
      return new

    return ([a for _, a, _ in attentions], ff_step[1], sru_arguments,
            new_states)

  def forward(self, xs):
    subs = self.sublayers
    x1, x2, *rest = xs
    fusable = (self._tf_use_ffi and kernels.has_kernel('tf_terraformer_block')
               and all(_is_decoder_block(block)
                       for block in compositions.terraformer_decoder(self)))
    blocks = []
    if fusable:
      for i in range(0, len(subs), 6):
        block = self._block_arguments(x1, self.weights, self.state, i)
        if block is None:
          break
        blocks.append((i, block))
    if not fusable or len(blocks) != len(subs) // 6:
      return super().forward(xs)
    state = list(self.state)
    for i, (attentions, ff, sru, new_states) in blocks:
      y1, y2, caches_a, caches_b, c = kernels.terraformer_block(
          x1, x2, attentions, ff, sru)
      x1, x2 = y1.astype(x1.dtype), y2.astype(x2.dtype)
      for j, s in new_states(caches_a, caches_b, c).items():
        state[j] = s
    self.state = tuple(state)
    return (x1, x2, *rest)


def _residual_branch(layer):
  """The branch f of a RESIDUAL (`compositions.residual`); None for other
  layers."""
  if composites.name_of(layer) != composites.RESIDUAL:
    return None
  return compositions.residual(layer)


def _cross_attention_parts(f):
  """(the LayerNorm, the queries' KernelSparseQKV, the CrossAttention) of a
  CROSS_ATTENTION_BRANCH f whose cross-attention has sparse queries and
  runs in predict mode, its LayerNorm centred; None for another f."""
  if composites.name_of(f) != composites.CROSS_ATTENTION_BRANCH:
    return None
  norm, cross = compositions.cross_attention_branch(f)
  if (composites.name_of(cross)
      != composites.SPARSE_QUERY_CROSS_ATTENTION):
    return None
  queries, attention = compositions.sparse_query_cross_attention(cross)
  if (isinstance(queries, KernelSparseQKV)
      and isinstance(attention, CrossAttention)
      and attention._mode == 'predict'  # pylint: disable=protected-access
      and _centred_norm(norm) is not None):
    return norm, queries, attention
  return None


def _block_kind(layer):
  """'attention', 'cross' or 'sparse_ff' for a residual whose branch one
  call of a Scaling Transformer block covers; None for other layers."""
  f = _residual_branch(layer)
  if f is None:
    return None
  if isinstance(f, KernelNormSerial):
    kernel = _kernel_of(f)
    if isinstance(kernel, KernelSparseQKVAttention):
      return 'attention'
    if isinstance(kernel, KernelSparseFF):
      return 'sparse_ff'
    return None
  return 'cross' if _cross_attention_parts(f) is not None else None


def scaling_block_starts(layers):
  """{index: number of layers} of the Scaling Transformer decoder blocks in
  a Serial's `layers` (flattened in it, as the models build them): the
  residuals of the attention, [the cross-attention,] the sparse FF."""
  kinds = [_block_kind(layer) for layer in layers]
  starts = {}
  for i, kind in enumerate(kinds):
    if kind != 'attention':
      continue
    for pattern in (('attention', 'cross', 'sparse_ff'),
                    ('attention', 'sparse_ff')):
      if tuple(kinds[i:i + len(pattern)]) == pattern:
        starts[i] = len(pattern)
        break
  return starts


class KernelScalingBlocks(KernelMixin, trax_combinators.Serial):
  """A Serial holding Scaling Transformer decoder blocks (the residuals of
  a sparse QKV attention, of a sparse-query cross-attention with an
  encoder, and of a sparse FF block, flattened into the model's Serial)
  whose decoding step, with 'q8' storage, is one `tf_scaling_block` call
  per block: each residual branch's call (its LayerNorm included) and the
  residual sums. The position indices stay XLA's. Its other layers, a
  prompt, and blocks whose parts would not run their own fused calls run
  as the Serial runs them.
  """

  def _block_arguments(self, items, weights, state, i, size):
    """`kernels.scaling_block`'s arguments (attention, ff, cross) for the
    block of `size` layers at sublayer i on the stack's `items`, and the
    function of its results after y that gives the new states of those
    sublayers; None where it cannot run."""
    x = items[0]
    layers = self.sublayers[i:i + size]
    branches = [_residual_branch(layer) for layer in layers]
    paths = [_path(layer, f) for layer, f in zip(layers, branches)]
    w = [_at(weights[i + k], p) for k, p in enumerate(paths)]
    s = [_at(state[i + k], p) for k, p in enumerate(paths)]
    attention = branches[0].step_arguments(x, w[0], s[0])
    ff = branches[-1].step_arguments(x, w[-1], s[-1])
    if (attention is None or attention[0] != 'attention' or ff is None
        or ff[0] != 'sparse_ff'):
      return None
    epsilon = attention[1]['norm'][2]
    cross = None
    if size == 3:
      cross = self._cross_arguments(branches[1], x, items, w[1], s[1])
      if cross is None or cross[0]['norm'][2] != epsilon:
        return None
    if ff[1]['norm'][2] != epsilon:
      return None

    def new_states(caches, cross_kept):
      new = {i: _with(state[i], paths[0], attention[2](*caches))}
      if cross is not None:
        new[i + 1] = _with(state[i + 1], paths[1], cross[1](cross_kept))
      return new

    return attention[1], ff[1], (cross[0] if cross else None), new_states

  @staticmethod
  def _cross_arguments(f, x, items, weights, state):
    """The cross-attention branch f's arguments of `kernels.scaling_block`
    and the function of its kept' that gives f's new state; None where
    the call cannot run (the first step, whose keys are not split yet)."""
    norm, queries, attention = _cross_attention_parts(f)
    q_path = _path(f, queries)
    a_path = _path(f, attention)
    w_q, s_q = _at(weights, q_path), _at(state, q_path)
    s_att = _at(state, a_path)
    if (len(items) < 2 or not s_att
        or not queries._fusable(x, w_q, n_outputs=1)):  # pylint: disable=protected-access
      return None
    mask = items[1]
    keys_t, values = s_att
    if (mask is None or mask.size != x.shape[0] * keys_t.shape[-1]
        or keys_t.dtype != jnp.float32 or not norm._center):  # pylint: disable=protected-access
      return None
    scale, bias = weights[0]
    arguments = dict(queries.query_operands(w_q, s_q), keys_t=keys_t,
                     values=values, mask=mask,
                     norm=(scale, bias, norm._epsilon))  # pylint: disable=protected-access

    def new_state(kept):
      return _with(state, q_path, (s_q[0], kept.astype(s_q[1].dtype)))

    return arguments, new_state

  def forward(self, xs):
    if not (self._tf_use_ffi and kernels.has_kernel('tf_scaling_block')):
      return super().forward(xs)
    starts = scaling_block_starts(self.sublayers)
    if not starts:
      return super().forward(xs)
    subs, weights, state = self.sublayers, self.weights, self.state
    rngs = trax_combinators._split_rngs(self.rng, len(subs))  # pylint: disable=protected-access
    stack, new_state, i = xs, list(state), 0
    while i < len(subs):
      size = starts.get(i)
      items = stack if isinstance(stack, (tuple, list)) else (stack,)
      block = size and self._block_arguments(items, weights, state, i, size)
      if block:
        attention, ff, cross, new_states = block
        y, caches, cross_kept = kernels.scaling_block(items[0], attention, ff,
                                                      cross)
        y = y.astype(items[0].dtype)
        stack = (y, *items[1:]) if isinstance(stack, (tuple, list)) else y
        for j, s in new_states(caches, cross_kept).items():
          new_state[j] = s
        i += size
        continue
      layer = subs[i]
      inputs = trax_combinators.inputs_from_stack(stack, layer.n_in)
      outputs, new_state[i] = layer.pure_fn(inputs, weights[i], state[i],
                                            rngs[i], use_cache=True)
      stack = trax_combinators.outputs_onto_stack(outputs, stack, layer.n_in)
      i += 1
    self.state = tuple(new_state)
    return stack
