"""Training over many devices and processes on JAX's distributed runtime.

Trax 1.4.1's `Loop` is data-parallel over one process's local devices (pmap)
with replicated weights; this module is the path beyond it, built on JAX's own
engine rather than a home-made one:

- `initialize`: N processes join one job through `jax.distributed.initialize`
  (explicit coordinator/process flags, or the environment JAX detects on
  Slurm, Open MPI and TPU pods); on CPU the collectives run over gloo. Waits
  are bounded: a process that never joins, or dies, stops the others with an
  error instead of a hang.
- `fsdp_spec` / `device_mesh`: FSDP-style (ZeRO-3) sharding over a 1-D mesh
  of all devices of all processes: each weight and each optimizer slot is
  split along one of its axes, so its bytes per device fall as 1/N; XLA's SPMD
  partitioner inserts the all-gathers before use and the reduce-scatters of
  the gradients.
- `ShardedTrainer`: one jitted training step (the loss of the Trax model,
  its gradients, the Trax optimizer's `tree_update`) with weights and slots
  sharded and the batch split over the same mesh axis (data parallelism):
  the loss is that of the global batch, so gradients are averaged over all
  devices of all processes and metrics are global.
- `is_multiprocess`, `global_mean`, `broadcast_from_process_0`,
  `broadcast_json`, `shared_seed`: what `terraformer.train` needs to run
  Trax's `Loop` as one of N processes (global metrics, one resume state).
- `memory_plan`: per-device bytes of weights, optimizer slots and an
  activation estimate for a model and a device count, from shapes only
  (`terraformer-info --devices=N`).
"""
import json
import math
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
from trax import layers as tl
from trax import shapes

from terraformer import errors
from terraformer import supervisor

MESH_AXIS = 'fsdp'  # One axis: weights, slots and the batch split over it.


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
  # was the CPU client's thread pool: _widen_cpu_client_pool).
  jax.config.update('jax_cpu_enable_async_dispatch', False)
  _widen_cpu_client_pool()
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


def _widen_cpu_client_pool():
  """Gives XLA's CPU client more threads than this process has devices.

  The CPU client runs each local device's part of a multi-device program
  (every pmapped step, every `x[0]` of a replicated array) on one thread of
  a pool of max(cores, local devices) threads, and a part waiting in a gloo
  collective holds its thread until the other processes join. With as many
  cores as devices (2 x 2 forced devices on 2 cores) nothing else can run
  while a collective waits: a 2-process Trax Loop job hung intermittently
  (4 of ~20 runs of 12 steps; in a gdb dump one pool thread of process 1 sat
  in a gloo all-reduce, the other in a launch blocked on a semaphore, so the
  other device's part never ran). Re-tested: 5 hangs in 10 runs with
  PJRT_NPROC=2, 0 in 30 with 4 threads per device. PJRT_NPROC (read when
  JAX creates the CPU client, after this) sets the pool size; an explicit
  PJRT_NPROC or NPROC is kept.
  """
  if 'PJRT_NPROC' in os.environ or 'NPROC' in os.environ:
    return
  threads = 4 * _local_cpu_devices()
  if (os.cpu_count() or 1) < threads:
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
  mesh = device_mesh()
  rows = NamedSharding(mesh, PartitionSpec(MESH_AXIS))

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


def device_mesh(devices=None):
  """A 1-D mesh (axis `MESH_AXIS`) over `devices` (default: all, global)."""
  devices = jax.devices() if devices is None else devices
  return Mesh(np.asarray(devices), (MESH_AXIS,))


def fsdp_spec(shape, n_devices):
  """PartitionSpec splitting the largest axis of `shape` divisible by
  `n_devices` over the mesh; replicated if no axis divides (small vectors)."""
  candidates = [(size, -axis) for axis, size in enumerate(shape)
                if size >= n_devices and size % n_devices == 0]
  if n_devices == 1 or not candidates:
    return PartitionSpec()
  axis = -max(candidates)[1]
  return PartitionSpec(*[MESH_AXIS if i == axis else None
                         for i in range(len(shape))])


def fsdp_shardings(tree, mesh):
  """NamedShardings of `fsdp_spec` for every array leaf of `tree`."""
  n = mesh.devices.size
  return jax.tree_util.tree_map(
      lambda x: NamedSharding(mesh, fsdp_spec(np.shape(x), n)), tree)


def _replicated(tree, mesh):
  return jax.tree_util.tree_map(
      lambda _: NamedSharding(mesh, PartitionSpec()), tree)


def _batch_shardings(batch, mesh):
  return tuple(NamedSharding(mesh, PartitionSpec(MESH_AXIS)) for _ in batch)


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


class ShardedTrainer:
  """Jitted training steps of a Trax model with FSDP-sharded weights/slots.

  The training math is Trax's (`tl.Serial(model, loss_layer)`, the
  optimizer's `tree_update` at 1-based steps, as `trax.optimizers.Trainer`
  does for one device); only where arrays live differs. Weights are
  initialized as Trax's `Loop` does for the same seed (the second half of
  `PRNGKey(seed)` split in two), but by one jitted call whose outputs are
  already sharded: initialization never puts a whole model on a host or a
  device. Evaluations run `eval_model` (default: `model`) with the training
  weights and state, as Loop's `run_evals`. Every
  process builds the same trainer and calls `train_step` with its own rows
  of each global batch (`process_rows`).

  With `skip_non_finite`, a step whose loss or gradient norm is not finite
  leaves weights and slots unchanged (decided inside the jitted step). With
  `abstract`, nothing is allocated (weights, slots and state are shapes
  with shardings): for `compiled_step_memory` only.

  With `gather_weights`, every weight is gathered whole at the start of the
  step (and of an evaluation); weights and slots stay split at rest and the
  update. Without it XLA follows the weights' split along their feature axis
  into tensor-parallel attention and loss, keeping the attention scores of
  the whole batch on every device (README, "Sharded weights"); with it the
  activations are split along the batch, at the cost of the whole weights on
  each device during the step: for models whose weights fit on one device.
  """

  def __init__(self, model, loss_layer, optimizer, lr_schedule, sample_batch,
               mesh=None, seed=0, skip_non_finite=False, abstract=False,
               gather_weights=False, eval_model=None):
    self.mesh = device_mesh() if mesh is None else mesh
    self._lr_schedule = lr_schedule
    self._optimizer = optimizer
    self._eval_model = model if eval_model is None else eval_model
    self._model_with_loss = tl.Serial(model, loss_layer)
    self._skip_non_finite = skip_non_finite
    self._gather_weights = gather_weights
    signature = shapes.signature(tuple(sample_batch))
    self.rng, init_rng = jax.random.split(jax.random.PRNGKey(seed))

    def init(rng):
      weights, state = model.init(signature, rng=rng)
      return weights, state, optimizer.tree_init(weights)[0]
    weights, state, slots = jax.eval_shape(init, init_rng)
    self._w_shard = fsdp_shardings(weights, self.mesh)
    self._s_shard = fsdp_shardings(slots, self.mesh)
    self._state_shard = _replicated(state, self.mesh)
    shardings = (self._w_shard, self._state_shard, self._s_shard)
    if abstract:
      self.weights, self.state, self.slots = jax.tree_util.tree_map(
          lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
          (weights, state, slots), shardings)
    else:
      self.weights, self.state, self.slots = jax.jit(
          init, out_shardings=shardings)(init_rng)
    self._loss_weights = loss_layer.weights
    self._loss_state = loss_layer.state
    self._opt_params = optimizer.tree_init(())[1]
    self.step = 0
    self.last_stats = {}
    self._batch_shard = _batch_shardings(sample_batch, self.mesh)
    self._sample_batch = [jax.ShapeDtypeStruct(np.shape(x), x.dtype)
                          for x in sample_batch]
    replicated = NamedSharding(self.mesh, PartitionSpec())
    self._replicated = replicated
    self._step_fn = jax.jit(
        self._train_step,
        in_shardings=(self._w_shard, self._s_shard, self._state_shard,
                      self._batch_shard, replicated, replicated, None),
        out_shardings=(self._w_shard, self._s_shard, self._state_shard,
                       replicated, replicated),
        donate_argnums=(0, 1))
    self._eval_fns = {}

  def _train_step(self, weights, slots, state, batch, rng, step, opt_params):
    def loss_fn(w):
      w = self._gathered_in_step(w)
      loss, new_state = self._model_with_loss.pure_fn(
          batch, (w, self._loss_weights), (state, self._loss_state), rng)
      return loss, new_state[0]
    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        weights)
    new_weights, new_slots, stats = self._optimizer.tree_update(
        step, grads, weights, slots, opt_params, store_slots=False)
    if self._skip_non_finite:
      finite = jnp.isfinite(loss) & jnp.isfinite(stats['gradients_l2'])
      keep = lambda new, old: jnp.where(finite, new, old)
      new_weights = jax.tree_util.tree_map(keep, new_weights, weights)
      new_slots = jax.tree_util.tree_map(keep, new_slots, slots)
      new_state = jax.tree_util.tree_map(keep, new_state, state)
    return new_weights, new_slots, new_state, loss, stats

  def compiled_step_memory(self):
    """XLA's memory analysis of the compiled training step, per device.

    Returns a dict of bytes: `arguments` (weights, slots, state and batch
    shards), `outputs`, `aliased` (outputs written over donated arguments),
    `temporaries` (activations and other scratch), and `peak` = arguments +
    outputs - aliased + temporaries.
    """
    batch = tuple(jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s)
                  for x, s in zip(self._sample_batch, self._batch_shard))
    opt_params = dict(self._opt_params, learning_rate=jnp.float32(0))
    analysis = self._step_fn.lower(
        self.weights, self.slots, self.state, batch, self.rng,
        jnp.asarray(1), opt_params).compile().memory_analysis()
    memory = {'arguments': analysis.argument_size_in_bytes,
              'outputs': analysis.output_size_in_bytes,
              'aliased': analysis.alias_size_in_bytes,
              'temporaries': analysis.temp_size_in_bytes}
    memory['peak'] = (memory['arguments'] + memory['outputs']
                      - memory['aliased'] + memory['temporaries'])
    return memory

  def _gathered_in_step(self, weights):
    if not self._gather_weights:
      return weights
    return jax.lax.with_sharding_constraint(
        weights, _replicated(weights, self.mesh))

  def global_batch(self, local_batch):
    """Global arrays from this process's rows of each batch array."""
    return tuple(jax.make_array_from_process_local_data(s, np.asarray(x))
                 for s, x in zip(self._batch_shard, local_batch))

  def new_rng(self):
    self.rng, rng = jax.random.split(self.rng)
    return rng

  def _collective(self, call):
    try:
      return call()
    except jax.errors.JaxRuntimeError as e:
      if jax.process_count() == 1:
        raise
      raise ProcessGroupError(
          f'step {self.step}: a collective with the other processes failed '
          f'(another process probably died): {errors.first_line(e)}') from None

  def train_step(self, local_batch):
    """One step on this process's rows; returns the global batch's loss.

    `last_stats` then holds the step's `gradients_l2`, `weights_l2` and
    `loss` (Trax's Trainer's stats).
    """
    self.step += 1
    rng = self.new_rng()
    opt_params = dict(self._opt_params)
    opt_params['learning_rate'] = jnp.asarray(
        self._lr_schedule(self.step), jnp.float32)

    def call():
      self.weights, self.slots, self.state, loss, stats = self._step_fn(
          self.weights, self.slots, self.state,
          self.global_batch(local_batch), rng, jnp.asarray(self.step),
          opt_params)
      loss = float(loss)
      # Trax's Trainer adds the loss to the optimizer's stats.
      self.last_stats = dict({k: float(v) for k, v in stats.items()},
                             loss=loss)
      return loss
    return self._collective(call)

  def evaluate(self, local_batch, metric_layers):
    """Each of `metric_layers` on the global batch (this process's rows),
    by the eval model with the current weights and state."""
    key = tuple(id(m) for m in metric_layers)
    if key not in self._eval_fns:
      branch = tl.Branch(*metric_layers)
      metrics = tl.Serial(self._eval_model, branch)
      metric_weights, metric_state = branch.weights, branch.state

      def evaluate(weights, state, batch, rng):
        weights = self._gathered_in_step(weights)
        values, _ = metrics.pure_fn(batch, (weights, metric_weights),
                                    (state, metric_state), rng)
        return tuple(values) if len(metric_layers) > 1 else (values,)
      self._eval_fns[key] = jax.jit(evaluate, in_shardings=(
          self._w_shard, self._state_shard, self._batch_shard,
          self._replicated), out_shardings=self._replicated)
    rng = self.new_rng()
    return self._collective(lambda: [float(v) for v in self._eval_fns[key](
        self.weights, self.state, self.global_batch(local_batch), rng)])

  def gathered_weights(self):
    """The full weights as numpy arrays (on every process)."""
    return self.gathered(self.weights)

  def gathered(self, tree):
    """`tree` of global arrays as numpy arrays, on every process.

    One leaf at a time: a device holds at most the largest leaf whole.
    """
    gather = jax.jit(lambda x: x, out_shardings=self._replicated)
    return jax.tree_util.tree_map(
        lambda x: np.asarray(self._collective(lambda: gather(x))), tree)


def _nbytes(leaf):
  return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


def _sharded_bytes(leaf, n_devices):
  """Bytes of `leaf` on one device under `fsdp_spec`."""
  spec = fsdp_spec(leaf.shape, n_devices)
  return _nbytes(leaf) // (n_devices if any(spec) else 1)


def memory_plan(weight_shapes, n_devices, slots_per_weight=2,
                activation_bytes=0):
  """Per-device bytes of an FSDP-sharded model, from shapes only.

  Args:
    weight_shapes: weights tree with `.shape`/`.dtype` leaves.
    n_devices: devices the weights and slots are split over.
    slots_per_weight: optimizer slots of a weight's size (Adam: 2).
    activation_bytes: activations of the global batch (split over devices).

  Returns:
    dict with total and per-device bytes of weights, slots, activations,
    their per-device sum, and the largest unsharded (replicated) leaf.
  """
  leaves = jax.tree_util.tree_leaves(weight_shapes)
  total = sum(_nbytes(x) for x in leaves)
  per_device = sum(_sharded_bytes(x, n_devices) for x in leaves)
  replicated = [x for x in leaves if n_devices > 1
                and not any(fsdp_spec(x.shape, n_devices))]
  plan = {
      'devices': n_devices,
      'weights_bytes': total,
      'weights_bytes_per_device': per_device,
      'slots_bytes_per_device': slots_per_weight * per_device,
      'activation_bytes_per_device': activation_bytes // n_devices,
      'replicated_bytes_per_device': sum(_nbytes(x) for x in replicated),
  }
  plan['total_bytes_per_device'] = (
      plan['weights_bytes_per_device'] + plan['slots_bytes_per_device']
      + plan['activation_bytes_per_device'])
  return plan


def force_host_devices(n):
  """XLA_FLAGS value giving this (not yet started) process `n` CPU devices."""
  flags = os.environ.get('XLA_FLAGS', '')
  return f'{flags} --xla_force_host_platform_device_count={n}'.strip()
