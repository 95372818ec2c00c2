"""One process of the distributed tests (tests/training/test_distributed.py).

Trains a tiny sparse-FF ScalingTransformerLM for a few steps with
`terraformer.training.fsdp.ShardedTrainer` on a fixed global batch stream and
writes the losses and the final weights (.npz). Run as one process
(`--num_processes=1`), or as one of several processes joined through `--port`
on localhost. Each of `--runs` trains from the same initial weights on the
same stream, one after the other in this process (its start-up and the
programs it compiled are paid once): `N` over the first N devices (0: all of
them), `N-gathered` with `ShardedTrainer(gather_weights=True)`; run R writes
`--out`/R.npz. XLA_FLAGS (forced CPU devices) must be set by the caller,
before JAX starts.
"""
import argparse
import os
import sys

import jax
import numpy as np

from terraformer import distributed
from terraformer import errors


def batches(global_batch, length, vocab, seed=0):
  rng = np.random.RandomState(seed)
  while True:
    tokens = rng.randint(2, vocab, size=(global_batch, length)).astype(np.int32)
    yield tokens, tokens, np.ones(tokens.shape, np.float32)


def _train(args, devices, gather_weights):
  """Trains `args.steps` steps over `devices`; the losses, the gathered final
  weights (w0000, ...) and how much of the largest weight one device holds.
  Trax is imported here, after the job is joined: a process that cannot join
  fails without paying for it."""
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import optimizers  # pylint: disable=g-import-not-at-top
  from terraformer.models import scaling_transformer  # pylint: disable=g-import-not-at-top
  from terraformer.training import fsdp  # pylint: disable=g-import-not-at-top

  vocab, length, global_batch = 64, 16, 8
  model = scaling_transformer.ScalingTransformerLM(
      vocab_size=vocab, d_model=32, d_ff=64, n_layers=1, n_heads=2,
      dropout=0.0, max_len=64, ff_sparsity=4, d_lowrank=8, mode='train')
  stream = batches(global_batch, length, vocab)
  rows = distributed.process_rows(global_batch)
  first = [x[rows] for x in next(batches(global_batch, length, vocab))]
  trainer = fsdp.ShardedTrainer(
      model, tl.WeightedCategoryCrossEntropy(), optimizers.Adam(),
      lambda step: 1e-3, first, mesh=fsdp.device_mesh(devices), seed=0,
      gather_weights=gather_weights)
  losses = []
  for step in range(1, args.steps + 1):
    try:
      losses.append(trainer.train_step([x[rows] for x in next(stream)]))
    except distributed.ProcessGroupError as e:
      print(f'worker: {e}', file=sys.stderr)
      distributed.exit_now(2)
    if step == args.die_after_step:
      os._exit(9)  # pylint: disable=protected-access
  weights = jax.tree_util.tree_leaves(trainer.gathered_weights())
  # Local shape of the largest weight: shows it is split over the mesh.
  largest = max(jax.tree_util.tree_leaves(trainer.weights),
                key=lambda w: w.size)
  shard_fraction = (largest.addressable_shards[0].data.size / largest.size)
  return dict(losses=np.asarray(losses), shard_fraction=shard_fraction,
              n_devices=len(devices),
              **{f'w{i:04d}': w for i, w in enumerate(weights)})


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--num_processes', type=int, default=1)
  parser.add_argument('--process_id', type=int, default=0)
  parser.add_argument('--port', type=int, default=0)
  parser.add_argument('--runs', default='0',
                      help='comma-separated N or N-gathered: a run over the '
                      'first N devices (0: all), gathering weights or not')
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('--timeout_s', type=int, default=120)
  parser.add_argument('--die_after_step', type=int, default=0,
                      help='exit abruptly (os._exit) after this step')
  parser.add_argument('--out', required=True, help='folder of the .npz')
  args = parser.parse_args()
  try:
    if args.num_processes > 1:
      distributed.initialize(f'127.0.0.1:{args.port}', args.num_processes,
                             args.process_id, timeout_s=args.timeout_s,
                             heartbeat_timeout_s=10)
  except errors.TerraformerError as e:
    print(f'worker: {e}', file=sys.stderr)
    return 2

  for run in args.runs.split(','):
    n_devices, _, gathered = run.partition('-')
    devices = jax.devices()[:int(n_devices) or None]
    results = _train(args, devices, gather_weights=gathered == 'gathered')
    if jax.process_index() == 0:
      np.savez(os.path.join(args.out, f'{run}.npz'), **results)
  return 0


if __name__ == '__main__':
  sys.exit(main())
