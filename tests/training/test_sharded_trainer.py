"""FSDP-sharded training over forced devices and processes
(terraformer/training/fsdp.py's ShardedTrainer, terraformer/distributed.py).

The processes run `distributed_worker.py` (a tiny sparse-FF LM, a fixed
global batch stream, Adam) on forced CPU devices; JAX's collectives between
processes go over gloo on localhost. Every wait is bounded.
terraformer-train over several processes: tests/training/test_distributed.py.
"""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from terraformer import distributed
from terraformer import errors
from terraformer.training import fsdp
from terraformer.training import memory_plan

from local_jobs import finish
from local_jobs import free_port

WORKER = os.path.join(os.path.dirname(__file__), 'distributed_worker.py')


def _start(out, devices, *args):
  env = dict(os.environ, XLA_FLAGS=distributed.force_host_devices(devices))
  return subprocess.Popen(
      [sys.executable, WORKER, f'--out={out}', *args], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process):
  code, _, err = finish(process)
  return code, err


def _results(out):
  """Run name -> what the worker wrote of that run."""
  return {name[:-len('.npz')]: dict(np.load(out / name))
          for name in os.listdir(out) if name.endswith('.npz')}


def _max_weight_difference(a, b):
  names = [k for k in a if k.startswith('w')]
  assert names and names == [k for k in b if k.startswith('w')]
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in names)


@pytest.fixture(scope='module')
def one_process(tmp_path_factory):
  """One process of 8 forced devices trains the same 3 steps over all 8
  (`8`), over 1 (`1`) and over 8 gathering the weights (`8-gathered`): its
  start-up and compiled programs paid once. (2 processes x 2 devices against
  1 process of 4: tests/training/test_distributed.py, through the CLI.)"""
  out = tmp_path_factory.mktemp('one_process')
  code, err = _finish(_start(out, 8, '--runs=8,1,8-gathered'))
  assert code == 0, err[-3000:]
  return _results(out)


def test_sharded_over_8_devices_equals_one_device(one_process):
  """FSDP over 8 forced host devices == the same steps on one device."""
  sharded, single = one_process['8'], one_process['1']
  assert sharded['n_devices'] == 8 and single['n_devices'] == 1
  assert sharded['shard_fraction'] == pytest.approx(1 / 8)  # Really split.
  np.testing.assert_allclose(sharded['losses'], single['losses'], atol=1e-5)
  assert _max_weight_difference(sharded, single) < 1e-5
  assert sharded['losses'][-1] != sharded['losses'][0]  # It trained.
  gathered = one_process['8-gathered']
  assert gathered['shard_fraction'] == pytest.approx(1 / 8)  # Split at rest.
  np.testing.assert_allclose(gathered['losses'], single['losses'], atol=1e-5)
  assert _max_weight_difference(gathered, single) < 1e-5


def test_a_dead_process_stops_the_other_with_one_line(tmp_path):
  """Process 1 dies after step 2: process 0 ends with exit 2 and a clear
  line (after the heartbeat timeout), it does not hang (a hang is killed
  after local_jobs.TIMEOUT_S, its exit code is not 2)."""
  port = free_port()
  args = ['--num_processes=2', f'--port={port}', '--steps=200']
  survivor = _start(tmp_path, 2, '--process_id=0', *args)
  dying = _start(tmp_path, 2, '--process_id=1', '--die_after_step=2', *args)
  code, err = _finish(dying)
  assert code == 9, err[-3000:]
  code, err = _finish(survivor)
  assert code == 2, err[-3000:]
  assert 'worker: step ' in err and 'another process probably died' in err


def test_a_process_that_never_joins_is_a_bounded_error(tmp_path):
  code, err = _finish(_start(
      tmp_path, 1, '--num_processes=2', '--process_id=1',
      f'--port={free_port()}', '--timeout_s=5'))
  assert code == 2, err[-3000:]
  assert 'worker: could not join the job at 127.0.0.1:' in err


def test_fsdp_spec_splits_the_largest_divisible_axis():
  assert tuple(fsdp.fsdp_spec((64, 96), 8)) == (None, 'fsdp')
  assert tuple(fsdp.fsdp_spec((12, 64), 8)) == (None, 'fsdp')
  assert tuple(fsdp.fsdp_spec((6,), 8)) == ()  # Replicated.
  assert tuple(fsdp.fsdp_spec((64, 96), 1)) == ()


def test_memory_plan_per_device_bytes_fall_with_devices():
  leaves = {'big': jax.ShapeDtypeStruct((1024, 512), np.float32),
            'bias': jax.ShapeDtypeStruct((3,), np.float32)}
  one = memory_plan.memory_plan(leaves, 1, activation_bytes=800)
  eight = memory_plan.memory_plan(leaves, 8, activation_bytes=800)
  assert one['weights_bytes'] == eight['weights_bytes'] == (1024 * 512 + 3) * 4
  assert eight['weights_bytes_per_device'] == 1024 * 512 * 4 // 8 + 3 * 4
  assert eight['slots_bytes_per_device'] == 2 * eight['weights_bytes_per_device']
  assert eight['replicated_bytes_per_device'] == 12
  assert eight['activation_bytes_per_device'] == 100
  assert one['total_bytes_per_device'] > 7 * eight['total_bytes_per_device']


def test_partial_process_flags_are_an_error():
  with pytest.raises(errors.TerraformerError, match='go together'):
    distributed.initialize('127.0.0.1:1234', num_processes=2)


def test_process_rows_are_disjoint_and_cover_the_batch():
  rows = [distributed.process_rows(8, i, 4) for i in range(4)]
  covered = np.concatenate([np.arange(8)[r] for r in rows])
  np.testing.assert_array_equal(covered, np.arange(8))
  with pytest.raises(errors.TerraformerError, match='not divisible'):
    distributed.process_rows(6, 0, 4)


def _tiny_trainer(skip_non_finite):
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  from trax import optimizers  # pylint: disable=g-import-not-at-top
  from terraformer.models import scaling_transformer  # pylint: disable=g-import-not-at-top
  model = scaling_transformer.ScalingTransformerLM(
      vocab_size=32, d_model=16, d_ff=32, n_layers=1, n_heads=2, dropout=0.0,
      max_len=16, mode='train')
  tokens = np.arange(2 * 8, dtype=np.int32).reshape(2, 8) % 30 + 2
  batch = [tokens, tokens, np.ones(tokens.shape, np.float32)]
  n = jax.device_count()
  batch = [np.tile(x, (n, 1)) for x in batch]
  trainer = fsdp.ShardedTrainer(
      model, tl.WeightedCategoryCrossEntropy(), optimizers.Adam(),
      lambda step: 1e-2, batch, skip_non_finite=skip_non_finite)
  return trainer, batch


@pytest.mark.parametrize('skip', [True, False])
def test_a_non_finite_step_is_skipped_inside_the_sharded_step(skip):
  """skip_non_finite: a NaN loss leaves weights and slots as they were;
  without it the NaN reaches the weights (the loop then stops)."""
  trainer, batch = _tiny_trainer(skip)
  assert np.isfinite(trainer.train_step(batch))
  before = jax.tree_util.tree_leaves(trainer.gathered(
      (trainer.weights, trainer.slots)))
  poisoned = batch[:2] + [np.full(batch[2].shape, np.nan, np.float32)]
  assert np.isnan(trainer.train_step(poisoned))
  assert np.isnan(trainer.last_stats['gradients_l2'])
  after = jax.tree_util.tree_leaves(trainer.gathered(
      (trainer.weights, trainer.slots)))
  unchanged = all(np.array_equal(a, b) for a, b in zip(before, after))
  assert unchanged == skip
  assert np.isfinite(trainer.train_step(batch)) == skip
