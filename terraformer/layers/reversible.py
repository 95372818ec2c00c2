"""Reversible residual layers that replay their discrete decisions (§4.2).

A reversible stack keeps two residual streams (x1, x2). A half-residual adds
f(x2) to x1 and a swap exchanges the streams (RevNet, Reformer). On the
backward pass the inputs of every layer are reconstructed from its outputs,
x1 = y1 - f(x2), so no activations of the stack are stored.

Reconstruction is exact only up to float error. A layer whose forward makes a
discrete choice (the sparse FF controller's argmax, LSH buckets) could choose
differently on the reconstructed input, and its gradient would then belong to
another function than the forward pass computed. The paper (§4.2): "we need to
store the discrete decisions ... and use them for reversing". Such layers keep
their decisions in their state and implement

    replay_state(state, new_state) -> the state that makes `forward` reuse the
                                      decisions stored in `new_state`;

`HalfResidual` re-runs its residual function with these states when reversing.

Memory: `jax.grad` through a `ReversibleSerial` (Trax's `Trainer`, the path
`terraformer.train` uses by default) calls its custom backward
(`reverse_and_grad`), which keeps only the stack's inputs and outputs, not
per-layer activations. For XLA to actually free them, `HalfResidual` makes
each recomputation data-dependent on the gradient arriving from the layer
above (adding 0 * one gradient element): left free, XLA's scheduler may
recompute the layers of a stack early (e.g. the encoder's during the
decoder's backward pass) or share weight- and mask-only values with the
forward pass, and keep all of them alive, as much memory as without
reversibility (`terraformer-memory-bench` measures it).
"""
import jax
from trax import fastmath
from trax import layers as tl
from trax.layers import combinators as cb

def replay_state(layer, state, new_state):
  """The state tree to re-run `layer` with so that it replays its decisions.

  Layers with a `replay_state` method decide (see the module docstring);
  combinators recurse into their sublayers; every other layer gets its old
  `state` back, as in a plain re-run of the forward pass.
  """
  if hasattr(layer, 'replay_state'):
    return layer.replay_state(state, new_state)
  subs = layer.sublayers
  if (subs and isinstance(state, (tuple, list))
      and isinstance(new_state, (tuple, list)) and len(state) == len(subs)):
    return tuple(replay_state(sub, s, ns)
                 for sub, s, ns in zip(subs, state, new_state))
  return state


def _is_float(x):
  return jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)


def _tied(x, zero):
  """x, made data-dependent on the scalar `zero` (== 0) without changing it."""
  if _is_float(x):
    return x + zero.astype(x.dtype)
  if x.dtype == jax.numpy.bool_:
    return jax.numpy.logical_and(x, zero == 0)
  return x


class HalfResidual(tl.ReversibleHalfResidual):
  """[acc, *context] -> [acc + f(context), *context], exactly reversible.

  `f` is `Serial(*layers)`; it may read several context items (e.g. the
  activations and a padding mask) and its first output is added to `acc`.

  Args:
    *layers: the residual function f.
    reversible: if False, gradients come from plain autodiff of `forward`
      (all activations stored); the same weights, state and rng give the same
      function, so both settings can be compared directly.
    replay_decisions: if False, reversing re-runs f with the old state, so
      discrete decisions are recomputed from the reconstructed input (for
      tests that show why replaying matters).
  """

  def __init__(self, *layers, reversible=True, replay_decisions=True,
               name=None):
    super().__init__(*layers, name=name or 'HalfResidual')
    self._reversible = reversible
    self._replay_decisions = replay_decisions

  @property
  def has_backward(self):
    return self._reversible

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    f = self.sublayers[0]
    acc_out, *context = output
    acc_grad, *context_grad = grad
    n_args = f.n_in
    args = tuple(context[:n_args])
    run_state = (replay_state(f, state[0], new_state[0])
                 if self._replay_decisions else state[0])
    f_rng = cb._split_rngs(rng, 1)[0]  # pylint: disable=protected-access
    # Recompute f only once the gradient from above is there, with an exact
    # data dependency (x + 0 * g): otherwise XLA may recompute all layers
    # early, or share weight- or mask-only values with the forward pass (a
    # broadcast bias or padding mask), and keep them all alive. (XLA's CPU
    # pipeline drops optimization barriers, so they cannot do this.)
    tie = 0.0 * acc_grad.ravel()[0]
    args = tuple(_tied(a, tie) for a in args)
    f_weights = jax.tree_util.tree_map(lambda w: _tied(w, tie), weights[0])
    is_float = [_is_float(a) for a in args]

    def residual(float_args, f_weights):
      it = iter(float_args)
      full = tuple(next(it) if fl else a for a, fl in zip(args, is_float))
      out, _ = f.pure_fn(full if n_args > 1 else full[0], f_weights,
                         run_state, f_rng)
      return out[0] if isinstance(out, (tuple, list)) else out

    float_args = tuple(a for a, fl in zip(args, is_float) if fl)
    res, vjp = fastmath.vjp(residual, float_args, f_weights)
    args_grad, f_weights_grad = vjp(acc_grad)
    args_grad = iter(args_grad)
    new_context_grad = list(context_grad)
    for i, fl in enumerate(is_float):
      if fl:
        new_context_grad[i] = context_grad[i] + next(args_grad)
    x_acc = acc_out - res
    return ((x_acc,) + tuple(context),
            ((acc_grad,) + tuple(new_context_grad), (f_weights_grad,)))


class ReversibleSerial(tl.ReversibleSerial):
  """`tl.ReversibleSerial` that can also run with plain autodiff.

  Args:
    *layers: reversible layers (`HalfResidual`, `tl.ReversibleSwap`, ...).
    reversible: if False, plain autodiff of the forward pass (see
      `HalfResidual`).
  """

  def __init__(self, *layers, reversible=True):
    super().__init__(*layers)
    self._reversible = reversible

  @property
  def has_backward(self):
    return self._reversible
