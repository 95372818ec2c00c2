"""decode_step (the jitted donating step, cheap init) and decode_speed (the
timer: benchmark fields, the GEMV bandwidth)."""
import functools

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from trax import shapes
from trax.models.research import configurable_transformer as ct

from terraformer.benchmarks import decode_speed
from terraformer.decoding import step as decode_step
from terraformer import errors
from terraformer import kernels as kernel_lib

from bench_models import (  # tests/bench_models.py
    D, D_FF, HEADS, MAX_LEN, N, SPARSE, V, encdec, lm, random_tokens)

F32 = 4


# --- Cheap initialization ---------------------------------------------------


@pytest.mark.parametrize('build', [
    functools.partial(encdec, **SPARSE), lm,
    lambda: ct.ConfigurableTransformerLM(V, d_model=D, d_ff=D_FF, n_layers=1,
                                         n_heads=HEADS, max_len=MAX_LEN,
                                         dropout=0.0, ff_sparsity=(N, 4),
                                         mode='predict'),
])
def test_zero_state_is_the_initial_state(build):
  model = build()
  sig = decode_step.predict_signature(model, prompt_len=5)
  weight_shapes, state_shapes = decode_step.init_shapes(model, sig)
  weights, state = model.init(sig)
  same = lambda a, b: (a.shape, a.dtype) == (b.shape, b.dtype)
  assert jax.tree_util.tree_structure(weight_shapes) == (
      jax.tree_util.tree_structure(weights))
  assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(
      same, weight_shapes, weights)))
  zeros = decode_step.zero_state(state_shapes)
  assert jax.tree_util.tree_structure(zeros) == (
      jax.tree_util.tree_structure(state))
  for ours, real in zip(jax.tree_util.tree_leaves(zeros),
                        jax.tree_util.tree_leaves(state)):
    assert same(ours, real)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(real))


# --- The jitted step --------------------------------------------------------


def test_fast_predict_matches_eval_forward_and_donates_the_state():
  inputs = random_tokens((1, 7), seed=1)
  targets = random_tokens((1, 6), seed=2)
  eval_model = encdec(mode='eval', **SPARSE)
  eval_model.init(shapes.signature((inputs, targets)),
                  rng=jax.random.PRNGKey(1))
  full_logits = np.asarray(eval_model((inputs, targets))[0])

  model = encdec(**SPARSE)
  _, state = model.init((shapes.signature(inputs),
                         shapes.ShapeDtype((1, 1), np.int32)))
  fast = decode_step.FastPredict(model, eval_model.weights, state)
  shifted = np.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  steps = []
  for i in range(targets.shape[1]):
    old_state = fast.state
    steps.append(np.asarray(fast((inputs, shifted[:, i:i + 1]))[0]))
    if i:  # After the first call: caches were updated in place.
      assert all(leaf.is_deleted()
                 for leaf in jax.tree_util.tree_leaves(old_state))
  np.testing.assert_allclose(np.concatenate(steps, axis=1), full_logits,
                             atol=2e-4, rtol=2e-4)


def test_check_model():
  with pytest.raises(errors.TerraformerError, match='not a Trax layer'):
    decode_step.check_model(object())
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.TerraformerError, match='3 inputs'):
    decode_step.check_model(tl.Select([0], n_in=3))


# --- The timer ---------------------------------------------------------------


def test_benchmark_fields_are_consistent():
  spec = decode_speed.ModelSpec('tiny', lm(n_layers=2), lm(n_layers=0), 2)
  result = decode_speed.benchmark(spec, tokens=2, prompt_len=3, repeats=2,
                                  bandwidth_gbps=10.0)
  assert (result['ms_per_token_min'] <= result['ms_per_token']
          <= result['ms_per_token_max'])
  # A dense block reads all its weights and the first 64-position bucket of
  # its K/V cache: count them from the arrays the two models are built with.
  token = shapes.ShapeDtype((1, 1), np.int32)
  weight_bytes = lambda model: sum(
      np.asarray(w).nbytes
      for w in jax.tree_util.tree_leaves(model.init(token)[0]))
  cache = 2 * 64 * D * F32 + 4
  assert result['bytes_per_block'] == (
      weight_bytes(lm(n_layers=2)) - weight_bytes(lm(n_layers=0))) / 2 + (
          cache)
  # Reading the bytes at 10 GB/s is a lower bound of the measured time.
  assert 0 < result['bound_ms_per_token'] < result['ms_per_token_min']


class _Probe:
  """A GemvProbe that returns 10, 20, 30, ... GB/s, one per call."""

  def __init__(self):
    self.calls = 0

  def measure(self, repeats=10):
    self.calls += 1
    return 10.0 * self.calls, 10.0 * self.calls + 1


def test_each_model_is_bounded_by_the_bandwidth_of_its_own_rounds():
  """Models timed in separate groups (a memory budget of one model) each
  get the median of the probes after their rounds; the run's bandwidth
  is only the fallback."""
  specs = [decode_speed.ModelSpec('a', lm(n_layers=1), None, 1),
           decode_speed.ModelSpec('b', lm(n_layers=2), None, 2)]
  probe = _Probe()
  a, b = decode_speed.benchmark_all(specs, tokens=2, prompt_len=3,
                                    repeats=3, bandwidth_gbps=99.0,
                                    memory_budget=1, probe=probe)
  assert probe.calls == 6  # One per round: 3 rounds of each model.
  assert a['bandwidth_gbps_rounds'] == [10.0, 20.0, 30.0]
  assert b['bandwidth_gbps_rounds'] == [40.0, 50.0, 60.0]
  assert (a['bandwidth_gbps'], b['bandwidth_gbps']) == (20.0, 50.0)
  for result in (a, b):
    assert result['bytes_bound_ms_per_token'] == pytest.approx(
        1e3 * result['bytes_per_token'] / (result['bandwidth_gbps'] * 1e9))
    assert result['bound_ms_per_token'] == max(
        result['bytes_bound_ms_per_token'],
        result.get('compute_bound_ms_per_token', 0.0))
  fresh = [decode_speed.ModelSpec('a', lm(n_layers=1), None, 1)]
  (plain,) = decode_speed.benchmark_all(fresh, tokens=2, prompt_len=3,
                                        repeats=1, bandwidth_gbps=99.0)
  assert plain['bandwidth_gbps'] == 99.0
  assert 'bandwidth_gbps_rounds' not in plain


def test_compute_bound_is_the_steps_multiply_adds_at_the_probed_peaks():
  """The peaks probed after each round (their median per kind) divide the
  step's multiply-adds (`step_macs`, averaged over the timed positions);
  peaks low enough make the compute bound the bound, per token and per
  block (the model less its blocks)."""
  rounds = iter([{'int8': 1e3, 'float32': 1e6}, {'int8': 3e3, 'float32': 3e6},
                 {'int8': 2e3, 'float32': 2e6}])
  spec = decode_speed.ModelSpec('a', lm(n_layers=2), lm(n_layers=0), 2)
  (result,) = decode_speed.benchmark_all(
      [spec], tokens=2, prompt_len=3, repeats=3, bandwidth_gbps=10.0,
      peaks=lambda: next(rounds))
  assert result['peak_macs'] == {'int8': 2e3, 'float32': 2e6}
  macs = result['macs_per_token']
  assert macs['int8'] == 0 and macs['float'] > 0  # float32 weights.
  assert result['compute_bound_ms_per_token'] == pytest.approx(
      1e3 * macs['float'] / 2e6)
  assert result['bound_ms_per_token'] == result['compute_bound_ms_per_token']
  assert result['bound_ms_per_token'] > result['bytes_bound_ms_per_token']
  assert result['bound_ms_per_block'] == pytest.approx(
      1e3 * result['macs_per_block']['float'] / 2e6)
  # No probe (no kernels): the bytes bound alone.
  fresh = decode_speed.ModelSpec('a', lm(n_layers=2), lm(n_layers=0), 2)
  (plain,) = decode_speed.benchmark_all(
      [fresh], tokens=2, prompt_len=3, repeats=1, bandwidth_gbps=10.0,
      peaks=None)
  assert 'compute_bound_ms_per_token' not in plain
  assert plain['bound_ms_per_token'] == plain['bytes_bound_ms_per_token']


def test_probe_keeps_its_matrices_until_closed(monkeypatch):
  sizes = []
  monkeypatch.setattr(decode_speed, '_read_rate',
                      lambda fn, args, size, repeats: (sizes.append(size)
                                                       or (1.0, 2.0)))
  probe = decode_speed.GemvProbe(megabytes=4)
  made = probe._make  # pylint: disable=protected-access
  count = []
  monkeypatch.setattr(probe, '_make', lambda: count.append(1) or made())
  assert probe.measure(2) == probe.measure(2) == (1.0, 2.0)
  assert count == [1] and sizes == [4 * 2**20] * 4
  probe.close()
  probe.measure(2)
  assert count == [1, 1]


def test_call_seconds_times_each_repeat_after_an_untimed_call(monkeypatch):
  """One untimed call (compilation), then a time per repeat: the clock
  read around each waited-for call (experiments/decode_output_layer.py
  times its products with it)."""
  clock = iter([1.0, 1.5, 2.0, 4.0, 10.0, 10.25])
  monkeypatch.setattr(decode_speed.time, 'perf_counter', lambda: next(clock))
  calls = []

  class Result:
    def block_until_ready(self):
      calls.append('waited')

  times = decode_speed.call_seconds(
      lambda *args: calls.append(args) or Result(), (1, 2), 3)
  assert times == [0.5, 2.0, 0.25]
  assert calls == [(1, 2), 'waited'] * 4


def test_gemv_bandwidth_is_positive():
  median, best = decode_speed.gemv_bandwidth(megabytes=8, repeats=3)
  assert 0 < median <= best


def test_gemv_bandwidth_is_the_faster_reader_of_the_same_bytes(monkeypatch):
  """XLA's float32 GEMV and the Q8 kernel each read `megabytes`; the
  probe keeps the faster one (by median)."""
  assert kernel_lib.available(), kernel_lib.unavailable_reason()
  calls = []

  def rate(fn, args, size, repeats):
    calls.append((size, args[1].dtype, repeats))
    fn(*args).block_until_ready()  # Both readers run.
    return [(20.0, 21.0), (30.0, 40.0)][len(calls) - 1]

  monkeypatch.setattr(decode_speed, '_read_rate', rate)
  assert decode_speed.gemv_bandwidth(megabytes=8, repeats=2) == (30.0, 40.0)
  assert calls == [(8 * 2**20, jnp.float32, 2), (8 * 2**20, jnp.int8, 2)]


CPUINFO = ('processor\t: 0\nvendor_id\t: GenuineIntel\n'
           'model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n'
           'flags\t\t: fpu avx2\n\nprocessor\t: 1\n'
           'model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz\n')


def test_machine_names_the_cpu_and_the_kernels_paths(tmp_path, monkeypatch):
  from terraformer import kernels  # pylint: disable=g-import-not-at-top
  from terraformer.cli import bench_format  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'cpuinfo'
  path.write_text(CPUINFO)
  assert decode_speed.cpu_model(str(path)) == (
      'Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz')
  assert decode_speed.cpu_model(str(tmp_path / 'none')) is None
  found = decode_speed.machine(str(path))
  assert found['cpu_model'].startswith('Intel(R) Xeon(R) Platinum 8481C')
  line = bench_format.format_machine(found)
  assert line.startswith('machine: Intel(R) Xeon(R) Platinum 8481C CPU @ '
                         f"2.70GHz ({found['cpu_cores']} cores); kernels: ")
  if kernels.available():
    assert found['float_isa'] in kernels.ISA_NAMES
    assert found['gemv_isa'] in kernels.GEMV_ISA_NAMES
    assert found['kernels'] is None
    assert line.endswith(f"float {found['float_isa']}, q8 GEMV "
                         f"{found['gemv_isa']}")
    # A forced path is the one named.
    before = kernels.set_gemv_isa()
    try:
      kernels.set_gemv_isa('scalar')
      assert decode_speed.machine(str(path))['gemv_isa'] == 'scalar'
    finally:
      kernels.set_gemv_isa(before)
  # Without the library: no paths, and why.
  monkeypatch.setattr(kernels, 'available', lambda: False)
  monkeypatch.setattr(kernels, 'unavailable_reason', lambda: 'not built')
  bare = decode_speed.machine(str(path))
  assert (bare['float_isa'], bare['gemv_isa'], bare['kernels']) == (
      None, None, 'not built')
  assert bench_format.format_machine(bare).endswith(
      "kernels: none (not built): XLA's code only")
