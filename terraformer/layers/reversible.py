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
per-layer activations. XLA would still share weight-only values (e.g. a
broadcast bias) between the forward pass and a layer's recomputation and keep
them alive in between, for every layer; `HalfResidual` passes the weights it
recomputes with through an optimization barrier to prevent that.
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
    is_float = [_is_float(a) for a in args]

    def residual(float_args, f_weights):
      it = iter(float_args)
      full = tuple(next(it) if fl else a for a, fl in zip(args, is_float))
      out, _ = f.pure_fn(full if n_args > 1 else full[0], f_weights,
                         run_state, f_rng)
      return out[0] if isinstance(out, (tuple, list)) else out

    float_args = tuple(a for a, fl in zip(args, is_float) if fl)
    # The barrier makes the weights used here distinct values from those of
    # the forward pass: XLA would otherwise share (CSE) weight-only values,
    # e.g. broadcast biases, between the two passes and keep them alive from
    # the forward pass to this layer's backward, for every layer.
    float_args, f_weights = jax.lax.optimization_barrier(
        (float_args, weights[0]))
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
