"""Training-step memory and time vs input length (Pyramidion Fig. 4, CST Fig. 2).

The gradient step of an encoder-decoder (value_and_grad of the
cross-entropy loss with respect to all weights, as `terraformer.training.loop`
takes it) is compiled with XLA for abstract inputs of each length; XLA's
buffer assignment gives its memory (arguments: weights, state, batch;
outputs: gradients; temporaries: activations kept for the backward pass and
workspace), exact for the compiled program. Where that total fits a budget
the same compiled step also runs on random tokens: its time is the median of
a few calls after one warm-up, in the same process for every model, so
ratios between models are what to read on a shared machine.
"""
import statistics
import time

from terraformer import errors

MIB = 2.0 ** 20


def compile_grad_step(model, batch_size, input_len, target_len):
  """(compiled gradient step, init function) of `model` in train mode.

  `model` maps (inputs, targets) to (logits, targets); the batch is
  (inputs [b, input_len] int32, targets [b, target_len] int32, loss weights
  [b, target_len] float32). Nothing is allocated: weights, state and batch
  are `jax.ShapeDtypeStruct`s. `init(rng)` gives real (weights, state).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top

  loss_model = tl.Serial(model, tl.WeightedCategoryCrossEntropy())
  batch = (jax.ShapeDtypeStruct((batch_size, input_len), np.int32),
           jax.ShapeDtypeStruct((batch_size, target_len), np.int32),
           jax.ShapeDtypeStruct((batch_size, target_len), np.float32))
  signature = tuple(shapes.ShapeDtype(b.shape, b.dtype) for b in batch)

  def init(rng):
    return loss_model.init(signature, rng=rng)

  weights, state = jax.eval_shape(init, jax.random.PRNGKey(0))

  def loss(w, s, batch, rng):
    value, new_state = loss_model.pure_fn(batch, w, s, rng)
    return value, new_state

  grad_step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  rng = jax.ShapeDtypeStruct((2,), np.uint32)
  return grad_step.lower(weights, state, batch, rng).compile(), init


def memory_of(compiled):
  """Bytes of a compiled program: dict(argument, output, temp, total)."""
  stats = compiled.memory_analysis()
  out = dict(argument=stats.argument_size_in_bytes,
             output=stats.output_size_in_bytes,
             temp=stats.temp_size_in_bytes)
  out['total'] = sum(out.values())
  return out


def time_step(compiled, init, batch_size, input_len, target_len, repeats=3,
              seed=0):
  """Median ms of `repeats` calls of the compiled step (after one warm-up)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = jax.random.PRNGKey(seed)
  weights, state = init(rng)
  tokens = np.random.default_rng(seed)
  # Ids 1..31: inside any vocabulary (the tiny test models have 64).
  batch = (tokens.integers(1, 32, (batch_size, input_len), dtype=np.int32),
           tokens.integers(1, 32, (batch_size, target_len), dtype=np.int32),
           np.ones((batch_size, target_len), np.float32))
  times = []
  for _ in range(repeats + 1):
    start = time.perf_counter()
    jax.block_until_ready(compiled(weights, state, batch, rng))
    times.append(1e3 * (time.perf_counter() - start))
  return statistics.median(times[1:])


def length_sweep(model_fn, input_lens, target_len=64, batch_size=1,
                 time_budget=4 * 2 ** 30, repeats=3, log=None):
  """Memory (and, within `time_budget` bytes, step ms) per input length.

  Returns a list of dict(input_len, memory (see `memory_of`), step_ms or
  None where the compiled step needs more than `time_budget` bytes).
  """
  rows = []
  for input_len in input_lens:
    try:
      model = model_fn(mode='train')
      compiled, init = compile_grad_step(model, batch_size, input_len,
                                         target_len)
    except errors.TerraformerError as e:
      raise errors.TerraformerError(f'input length {input_len}: {e}') from None
    memory = memory_of(compiled)
    step_ms = None
    if memory['total'] <= time_budget:
      step_ms = time_step(compiled, init, batch_size, input_len, target_len,
                          repeats)
    rows.append(dict(input_len=input_len, memory=memory, step_ms=step_ms))
    if log:
      ms = '-' if step_ms is None else f'{step_ms:.0f} ms'
      log(f'input {input_len}: {memory["total"] / MIB:.0f} MiB, {ms}')
  return rows
