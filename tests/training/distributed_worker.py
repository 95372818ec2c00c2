"""One process of the distributed tests (tests/training/test_distributed.py).

Trains a tiny sparse-FF ScalingTransformerLM for a few steps with
`terraformer.training.fsdp.ShardedTrainer` on a fixed global batch stream and
writes the losses and the final weights (`--out`, .npz). Run as one process
(`--num_processes=1`) over `--mesh_devices` of its devices, or as one of
several processes joined through `--port` on localhost. XLA_FLAGS (forced CPU
devices) must be set by the caller, before JAX starts.
"""
import argparse
import os
import sys

import numpy as np


def batches(global_batch, length, vocab, seed=0):
  rng = np.random.RandomState(seed)
  while True:
    tokens = rng.randint(2, vocab, size=(global_batch, length)).astype(np.int32)
    yield tokens, tokens, np.ones(tokens.shape, np.float32)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--num_processes', type=int, default=1)
  parser.add_argument('--process_id', type=int, default=0)
  parser.add_argument('--port', type=int, default=0)
  parser.add_argument('--mesh_devices', type=int, default=0,
                      help='devices of the mesh (0: all)')
  parser.add_argument('--steps', type=int, default=3)
  parser.add_argument('--timeout_s', type=int, default=120)
  parser.add_argument('--die_after_step', type=int, default=0,
                      help='exit abruptly (os._exit) after this step')
  parser.add_argument('--gather_weights', action='store_true',
                      help='ShardedTrainer(gather_weights=True)')
  parser.add_argument('--out', required=True)
  args = parser.parse_args()

  import jax  # pylint: disable=g-import-not-at-top
  from terraformer import distributed  # pylint: disable=g-import-not-at-top
  from terraformer.training import fsdp  # pylint: disable=g-import-not-at-top
  from terraformer import errors  # pylint: disable=g-import-not-at-top
  try:
    if args.num_processes > 1:
      distributed.initialize(f'127.0.0.1:{args.port}', args.num_processes,
                             args.process_id, timeout_s=args.timeout_s,
                             heartbeat_timeout_s=10)
  except errors.TerraformerError as e:
    print(f'worker: {e}', file=sys.stderr)
    return 2

  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import optimizers  # pylint: disable=g-import-not-at-top
  from terraformer.models import scaling_transformer  # pylint: disable=g-import-not-at-top

  vocab, length, global_batch = 64, 16, 8
  model = scaling_transformer.ScalingTransformerLM(
      vocab_size=vocab, d_model=32, d_ff=64, n_layers=1, n_heads=2,
      dropout=0.0, max_len=64, ff_sparsity=4, d_lowrank=8, mode='train')
  devices = jax.devices()
  if args.mesh_devices:
    devices = devices[:args.mesh_devices]
  stream = batches(global_batch, length, vocab)
  rows = distributed.process_rows(global_batch)
  first = [x[rows] for x in next(batches(global_batch, length, vocab))]
  trainer = fsdp.ShardedTrainer(
      model, tl.WeightedCategoryCrossEntropy(), optimizers.Adam(),
      lambda step: 1e-3, first, mesh=fsdp.device_mesh(devices), seed=0,
      gather_weights=args.gather_weights)
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
  if jax.process_index() == 0:
    np.savez(args.out, losses=np.asarray(losses),
             shard_fraction=shard_fraction, n_devices=len(devices),
             **{f'w{i:04d}': w for i, w in enumerate(weights)})
  return 0


if __name__ == '__main__':
  sys.exit(main())
