"""terraformer-memory-bench: training-step memory vs depth, reversible or not.

  terraformer-memory-bench --config_file=F [--config='BINDING']
      [--layers=1,2,4,8] [--batch_size=N] [--input_len=N] [--target_len=N]
      [--json]

For each number of layers n (encoder and decoder each), the model bound to
`terraformer.train.model` (a `Terraformer`) is built with n + n layers, once
reversible and once not (`reversible=False`: the same function, plain
backpropagation), and the gradient step, value_and_grad of the
cross-entropy loss with respect to all weights, is compiled with XLA on
abstract inputs (nothing is allocated or run). XLA's buffer assignment gives
its memory: arguments (weights, state, batch) + outputs (gradients) +
temporaries (activations kept for the backward pass, workspace). The figures
are exact for the compiled program and deterministic.
"""
import json
import sys

from absl import flags

from terraformer import errors
from terraformer.cli import common

PROG = 'terraformer-memory-bench'
MIB = 2.0 ** 20


def _define_flags(flag_values):
  flags.DEFINE_list('layers', ['1', '2', '4', '8'],
                    'Comma-separated layer counts (encoder = decoder).',
                    flag_values=flag_values)
  flags.DEFINE_integer('batch_size', 1, 'Batch size.', lower_bound=1,
                       flag_values=flag_values)
  flags.DEFINE_integer('input_len', 2048, 'Input (encoder) length.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_integer('target_len', 256, 'Target (decoder) length.',
                       lower_bound=1, flag_values=flag_values)
  flags.DEFINE_bool('json', False, 'Print JSON instead of a table.',
                    flag_values=flag_values)


def _layer_counts(values):
  try:
    counts = [int(v) for v in values]
  except ValueError:
    raise errors.TerraformerError(
        f'--layers must be integers, got {",".join(values)!r}') from None
  if not counts or min(counts) < 1:
    raise errors.TerraformerError('--layers must be positive integers')
  return counts


def step_memory(model_fn, n_layers, reversible, batch_size, input_len,
                target_len):
  """Bytes of the compiled gradient step: dict(argument, output, temp, total).

  Weights, state and batch are abstract (`jax.ShapeDtypeStruct`): the step
  is lowered and compiled, never run.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import shapes  # pylint: disable=g-import-not-at-top

  try:
    model = model_fn(mode='train', n_encoder_layers=n_layers,
                     n_decoder_layers=n_layers, reversible=reversible)
  except TypeError as e:
    raise errors.TerraformerError(
        f'the configured model does not take n_encoder_layers, '
        f'n_decoder_layers and reversible (a Terraformer does): {e}') from None
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
  stats = grad_step.lower(weights, state, batch, rng).compile()
  stats = stats.memory_analysis()
  out = dict(argument=stats.argument_size_in_bytes,
             output=stats.output_size_in_bytes,
             temp=stats.temp_size_in_bytes)
  out['total'] = sum(out.values())
  return out


def format_table(rows):
  """Total and temporary MiB per layer count, reversible vs not."""
  lines = [f'{"layers":>6}  {"reversible MiB":>14} {"(temp)":>8}  '
           f'{"non-reversible MiB":>18} {"(temp)":>8}  {"ratio":>6}']
  for row in rows:
    rev, plain = row['reversible'], row['non_reversible']
    lines.append(
        f'{row["layers"]:>6}  {rev["total"] / MIB:>14.1f} '
        f'{rev["temp"] / MIB:>8.1f}  {plain["total"] / MIB:>18.1f} '
        f'{plain["temp"] / MIB:>8.1f}  {plain["total"] / rev["total"]:>6.2f}')
  return '\n'.join(lines)


def _bench(flag_values):
  counts = _layer_counts(flag_values.layers)
  common.require_bindings('terraformer.train', ['model'])
  from terraformer import training  # pylint: disable=g-import-not-at-top
  model_fn = training.model_from_config()
  sizes = dict(batch_size=flag_values.batch_size,
               input_len=flag_values.input_len,
               target_len=flag_values.target_len)
  rows = []
  for n in counts:
    row = {'layers': n}
    for name, reversible in (('reversible', True), ('non_reversible', False)):
      row[name] = step_memory(model_fn, n, reversible, **sizes)
    rows.append(row)
    if not flag_values.json:
      print(f'compiled {n} + {n} layers', file=sys.stderr, flush=True)
  if flag_values.json:
    print(json.dumps({**sizes, 'rows': rows}, indent=2))
  else:
    print(f'gradient step, batch {sizes["batch_size"]}, input '
          f'{sizes["input_len"]}, target {sizes["target_len"]} tokens; '
          'memory = arguments + outputs (gradients) + temporaries')
    print(format_table(rows))
  return 0


def main(argv=None):
  return common.run(PROG, argv, _define_flags, _bench)


if __name__ == '__main__':
  sys.exit(main())
