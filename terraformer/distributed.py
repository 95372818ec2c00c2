"""Many processes as one job, on JAX's distributed runtime.

Trax 1.4.1's `Loop` is data-parallel over one process's local devices (pmap)
with replicated weights; this module joins N processes into one job, built on
JAX's own engine rather than a home-made one:

- `initialize`: N processes join one job through `jax.distributed.initialize`
  (explicit coordinator/process flags, or the environment JAX detects on
  Slurm, Open MPI and TPU pods); on CPU the collectives run over gloo. Waits
  are bounded: a process that never joins, or dies, stops the others with an
  error instead of a hang.
- `say`: a progress line, printed by process 0 only.
- `widen_cpu_client_pool`: enough CPU threads for a collective's parts to
  meet (`import terraformer` and `initialize` call it).
- `is_multiprocess`, `global_mean`, `broadcast_from_process_0`,
  `broadcast_json`, `shared_seed`, `process_rows`: what the trainers, the
  checkpoint store and the data streams need to run as one of N processes
  (global metrics, one resume state, this process's rows of a batch).

The FSDP sharding and `ShardedTrainer` are in `terraformer.training.fsdp`,
the per-device memory plan in `terraformer.training.memory_plan`.
"""
import json
import os
import socket
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from terraformer import errors
from terraformer import supervisor


def initialize(coordinator_address=None, num_processes=None, process_id=None,
               timeout_s=300, heartbeat_timeout_s=60, detect=False):
  """Joins this process to a multi-process JAX job (no-op for one process).

  With no arguments JAX detects the cluster from the environment (Slurm,
  Open MPI, TPU pods); if it detects none, this is a single-process run.
  `timeout_s` bounds the wait for all processes to join (a process other
  than 0 that finds no coordinator gets a one-line error; JAX itself aborts a
  process whose peers do not register in time) and `heartbeat_timeout_s` how
  long the others wait for a process that died. With `detect`, finding no
  cluster in the environment is an error, not a single-process run.
  Returns (process_index, process_count).
  """
  explicit = coordinator_address is not None or num_processes is not None
  if explicit and (coordinator_address is None or num_processes is None
                   or process_id is None):
    raise errors.TerraformerError(
        '--coordinator_address, --num_processes and --process_id go together')
  if explicit and num_processes == 1:
    return 0, 1
  if explicit and process_id:
    _wait_for_coordinator(coordinator_address, process_id, num_processes,
                          timeout_s)
  # CPU devices of different processes talk over gloo (no effect on GPU/TPU).
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  # Small CPU computations dispatched inline, not queued behind a pmapped
  # step's all-reduce (tried first against the 2 x 2-device hang whose cause
  # was the CPU client's thread pool: widen_cpu_client_pool).
  jax.config.update('jax_cpu_enable_async_dispatch', False)
  widen_cpu_client_pool(across_processes=True)
  try:
    jax.distributed.initialize(
        coordinator_address, num_processes, process_id,
        initialization_timeout=timeout_s,
        heartbeat_timeout_seconds=heartbeat_timeout_s)
  except ValueError as e:
    if explicit:
      raise errors.TerraformerError(f'jax.distributed: {e}') from None
    if detect:
      raise errors.TerraformerError(
          'JAX detected no cluster in the environment (Slurm, Open MPI, TPU '
          f'pod, Kubernetes): {errors.first_line(e)}') from None
    return 0, 1  # No cluster detected: one process.
  except Exception as e:  # pylint: disable=broad-except
    raise errors.TerraformerError(
        f'could not join the job at {coordinator_address} as process '
        f'{process_id} of {num_processes} within {timeout_s} s: '
        f'{errors.first_line(e)}') from None
  supervisor.report('process', jax.process_index(), jax.process_count())
  return jax.process_index(), jax.process_count()


def _local_cpu_devices():
  """CPU devices this process will have (JAX's flag, else XLA_FLAGS)."""
  count = jax.config.jax_num_cpu_devices
  if count is not None and count > 0:
    return count
  for flag in os.environ.get('XLA_FLAGS', '').split():
    if flag.startswith('--xla_force_host_platform_device_count='):
      try:
        return int(flag.split('=', 1)[1])
      except ValueError:
        pass
  return 1


def widen_cpu_client_pool(across_processes=False):
  """Gives XLA's CPU client 4 threads per local device when the cores are
  fewer, for a process of 2+ CPU devices (or of collectives across processes).

  The CPU client runs each local device's part of a multi-device program
  (every pmapped step, every `x[0]` of a replicated array) on one thread of
  a pool of max(cores, local devices) threads, and a part waiting in a
  collective holds its thread until the other parts (or processes) join.
  With no more threads than devices, one device's part can find no thread:
  a 2-process x 2-device Trax Loop job hung in 5 of 10 runs with
  PJRT_NPROC=2 and in 0 of 30 with 4 threads per device (a gdb dump: one
  pool thread in a gloo all-reduce, the other in a launch blocked on the
  per-device semaphore; docs/many-devices.md, "CPU thread pool"), and a
  1-process x 4-device job on 2 cores hung once in CI (3 of 4 parts at the
  all-reduce's rendezvous). PJRT_NPROC, read when JAX creates the CPU client
  (after this), sets the pool size and XLA's compute pool alike; an explicit
  PJRT_NPROC or NPROC is kept, and so is one device's pool.
  """
  if 'PJRT_NPROC' in os.environ or 'NPROC' in os.environ:
    return
  devices = _local_cpu_devices()
  if devices < 2 and not across_processes:
    return
  threads = 4 * devices
  if len(os.sched_getaffinity(0)) < threads:
    os.environ['PJRT_NPROC'] = str(threads)


def _wait_for_coordinator(address, process_id, num_processes, timeout_s):
  """Waits (bounded) until process 0's coordinator accepts connections.

  JAX aborts the process (no exception) when registration times out; this
  check turns an unreachable coordinator into a one-line error first.
  """
  host, _, port = address.rpartition(':')
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=5):
        return
    except (OSError, ValueError) as e:
      if time.monotonic() > deadline or isinstance(e, ValueError):
        raise errors.TerraformerError(
            f'could not join the job at {address} as process {process_id} '
            f'of {num_processes} within {timeout_s} s: no coordinator '
            f'(process 0) there ({e})') from None
      time.sleep(0.5)


class ProcessGroupError(errors.TerraformerError):
  """Another process of the job failed; this one cannot go on.

  The process must then end with `exit_now` (not a normal exit: JAX's exit
  handler would wait on the dead process and abort).
  """


def exit_now(code=2):
  """Ends this process at once, skipping JAX's distributed shutdown (after
  a `ProcessGroupError`: tells a `supervise` parent that a peer failed)."""
  supervisor.report('peer_failed')
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


def is_multiprocess():
  return jax.process_count() > 1


def say(message):
  """One progress line on stdout, by process 0 only (all of a 1-process run)."""
  if not jax.process_index():
    print(message, flush=True)


_EXCHANGES = [0]  # Calls of `_exchange` so far (the same on every process).


def _exchange(value, timeout_s=1800):
  """Every process's JSON-able `value`, as a list by process index.

  Through the key-value store of JAX's coordination service (what orbax's
  barriers use): no device work, so it never interleaves with the
  collectives of a training step running on the devices. Every process must
  call it as many times, in the same order.
  """
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  client = jax_distributed.global_state.client
  _EXCHANGES[0] += 1
  n, me = _EXCHANGES[0], jax.process_index()
  client.key_value_set(f'terraformer/{n}/{me}', json.dumps(value))
  if n > 2:  # Every process has read call n - 2 to get here.
    client.key_value_delete(f'terraformer/{n - 2}/{me}')
  values = []
  for process in range(jax.process_count()):
    try:
      values.append(json.loads(client.blocking_key_value_get(
          f'terraformer/{n}/{process}', timeout_s * 1000)))
    except Exception as e:  # pylint: disable=broad-except
      raise ProcessGroupError(
          f'process {process} did not answer within {timeout_s} s (it '
          f'probably died): {errors.first_line(e)}') from None
  return values


def global_mean(values):
  """Each of `values` (floats) averaged over all processes, on every process.

  Every process must call it with as many values. A NaN on any process
  makes that mean NaN everywhere.
  """
  values = [float(v) for v in values]
  if not is_multiprocess():
    return np.asarray(values, np.float32)
  return np.mean(np.asarray(_exchange(values), np.float32), axis=0)


def broadcast_json(value):
  """Process 0's JSON-able `value` on every process (others pass anything)."""
  if not is_multiprocess():
    return value
  return _exchange(None if jax.process_index() else value)[0]


def shared_seed(seed=None):
  """`seed`, or one drawn by process 0 when None, the same on every process."""
  if seed is None and not jax.process_index():
    seed = int(time.time() * 1e6) % 2**31
  return int(broadcast_json(seed))


def _sum_over_processes(tree, contribute):
  """Sum over processes of `tree` (numpy arrays) where `contribute`.

  One jitted reduction over a mesh of all devices: each process puts its
  arrays on its first device (zeros on its others). Every device's work is
  finished before and after it, so that it never runs beside another
  computation's collectives.
  """
  mesh = Mesh(np.asarray(jax.devices()), ('devices',))
  rows = NamedSharding(mesh, PartitionSpec('devices'))

  def stacked(leaf):
    leaf = np.asarray(leaf)
    local = np.zeros((jax.local_device_count(),) + leaf.shape, leaf.dtype)
    if contribute:
      local[0] = leaf
    return jax.make_array_from_process_local_data(rows, local)

  jax.block_until_ready(jax.live_arrays())
  total = jax.jit(
      lambda t: jax.tree_util.tree_map(
          lambda a: jnp.sum(a, axis=0).astype(a.dtype), t),
      out_shardings=NamedSharding(mesh, PartitionSpec()))(
          jax.tree_util.tree_map(stacked, tree))
  jax.block_until_ready(total)
  return jax.tree_util.tree_map(
      lambda a: np.asarray(a.addressable_data(0)), total)


def broadcast_from_process_0(tree):
  """Process 0's `tree` of arrays, on every process (others pass same-shaped
  arrays; their values are ignored). A device collective: for start-up."""
  if not is_multiprocess():
    return tree
  return _sum_over_processes(tree, not jax.process_index())


def process_rows(global_batch_size, process_index=None, process_count=None):
  """The slice of a global batch's rows this process feeds (and reads)."""
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if global_batch_size % count:
    raise errors.TerraformerError(
        f'batch size {global_batch_size} is not divisible by the number of '
        f'processes ({count})')
  rows = global_batch_size // count
  return slice(index * rows, (index + 1) * rows)


def force_host_devices(n):
  """XLA_FLAGS value giving this (not yet started) process `n` CPU devices."""
  flags = os.environ.get('XLA_FLAGS', '')
  return f'{flags} --xla_force_host_platform_device_count={n}'.strip()
