"""What a compiled decode step runs (terraformer/benchmarks/step_profile.py):
its HLO operation counts and the profile summary.

Its parts on hand-made events and HLO; the whole of it, on a real trace, in
tests/cli/test_cli_bench.py (--profile_dir); the operation counts of whole
models in tests/benchmarks/test_decode_configs.py (xla_ops).
"""
import jax
import jax.numpy as jnp
from trax import shapes

from terraformer import kernels
from terraformer.benchmarks import step_profile
from terraformer.kernels import installer as kernel_installer
from terraformer.kernels import layers as kernel_layers
from terraformer.layers.sparse_qkv_attention import SparseQKV


def test_self_time_subtracts_nested_operations_of_the_same_thread_only():
  events = [
      ('t0', 'cond.20.clone', 7, 'jit_pure_fn', 0, 100),
      ('t0', 'wrapped_slice', 7, 'jit_pure_fn', 10, 30),   # in cond
      ('t0', 'wrapped_slice.1', 7, 'jit_pure_fn', 45, 20),  # in cond
      ('t0', 'dot', 7, 'jit_pure_fn', 120, 5),              # after it
      ('t1', 'ffi_call.3', 7, 'jit_pure_fn', 20, 50),       # other thread
  ]
  assert step_profile.self_times(events) == [50, 30, 20, 5, 50]


def test_busy_time_is_the_union_of_operations_inside_the_spans():
  events = [
      ('t0', 'a', 7, 'm', 0, 30),     # 10..30 inside the first span
      ('t1', 'b', 7, 'm', 20, 20),    # overlaps a on another thread: 30..40
      ('t0', 'c', 7, 'm', 60, 10),    # a gap of 20 before it
      ('t0', 'd', 7, 'm', 95, 10),    # crosses the span's end: 95..100
      ('t0', 'e', 7, 'm', 150, 10),   # between the spans
      ('t0', 'f', 7, 'm', 200, 10),   # inside the second span
  ]
  assert step_profile.busy_ns(events, [(10, 100), (195, 215)]) == (
      30 + 10 + 5 + 10)
  assert step_profile.busy_ns(events, [(100, 150)]) == 5  # d's end
  assert step_profile.busy_ns(events, [(105, 150)]) == 0


def test_kind_drops_instance_numbers():
  assert step_profile.kind('ffi_call.13') == 'ffi_call'
  assert step_profile.kind('cond.20.clone') == 'cond'
  assert step_profile.kind('wrapped_slice.1') == 'wrapped_slice'
  assert step_profile.kind('copy') == 'copy'
  assert step_profile.kind('add_rsqrt_fusion.2') == 'fusion'
  assert step_profile.kind('ynn_fusion.8') == 'ynn_fusion'


def test_hlo_lines_name_the_kernel_target_shape_and_source_op():
  hlo = '\n'.join([
      'ENTRY %main.1 (p: f32[1,9216]) -> f32[1,1,9216] {',
      '  %ffi_call.7 = f32[1,1,9216]{2,1,0} custom-call(%a, %b), '
      'custom_call_target="tf_skinny_matmul", api_version=API_VERSION_TYPED_FFI',
      '  ROOT %wrapped_slice = f32[96,64,96]{2,1,0} fusion(%c), kind=kLoop, '
      'calls=%w, metadata={op_name="jit(pure_fn)/cond/branch_0_fun/slice"}',
      '}'])
  lines = step_profile.hlo_lines(hlo)
  assert lines['ffi_call.7'] == 'custom-call f32[1,1,9216]{2,1,0} tf_skinny_matmul'
  assert lines['wrapped_slice'] == 'fusion f32[96,64,96]{2,1,0} (slice)'
  assert 'main.1' not in lines


def test_hlo_lines_give_a_kernel_calls_operand_shapes():
  """Compiled from a real kernel call: its operand_layout_constraints."""
  assert kernels.available(), kernels.unavailable_reason()
  packed, scale = kernel_layers.pack_q8(jnp.ones((64, 32)))
  text = jax.jit(lambda x: kernels.q8_matmul(x, packed, scale)).lower(
      jnp.ones((1, 64))).compile().as_text()
  (desc,) = [d for d in step_profile.hlo_lines(text).values()
             if 'tf_q8_matmul' in d]
  assert desc == ('custom-call f32[1,32]{1,0} tf_q8_matmul <- f32[1,64], '
                  'f32[1,64], f32[1], s8[2,16,16,4], f32[32], f32[1] '
                  '(ffi_call)')


def test_hlo_lines_name_a_kernel_with_several_outputs():
  """A kernel returning a tuple (tf_sparse_qkv: q, k, v and the kept
  inputs) is named by its tuple shape, target and operands."""
  assert kernels.available(), kernels.unavailable_reason()
  layer = SparseQKV(64, 4, 3, 3, causal=True, mode='predict')
  x = jnp.ones((1, 1, 64))
  weights, state = layer.init(shapes.signature(x))
  kernel_installer.install(layer)
  stored = kernel_layers.store_weights(layer, weights, 'q8')
  text = jax.jit(layer.pure_fn).lower(
      x, stored, state, jax.random.PRNGKey(0)).compile().as_text()
  (desc,) = [d for d in step_profile.hlo_lines(text).values()
             if 'tf_sparse_qkv' in d]
  assert desc.startswith('custom-call (f32[1,1,64]{2,1,0}, f32[1,1,64]{2,1,0}, '
                         'f32[1,1,64]{2,1,0}, f32[1,2,4,16]{3,2,1,0}) '
                         'tf_sparse_qkv <- f32[1,1,64], s8[4,64], f32[4], ')


def test_op_counts_include_the_branch_a_conditional_runs():
  def f(i, x):
    branches = [lambda x: x + 1.0,
                lambda x: jnp.sin(jnp.exp(x) @ x.T) @ x + jnp.cos(x)]
    return jax.lax.switch(i, branches, x)
  x = jnp.ones((8, 8))
  text = jax.jit(f).lower(0, x).compile().as_text()
  counts = step_profile.hlo_op_counts(text)
  assert counts['conditional'] == 1
  # The largest branch runs two dots: they count.
  assert counts.get('dot', 0) + counts.get('fusion', 0) >= 3
  entry_only = text[text.index('\nENTRY'):]
  assert ' dot(' not in entry_only.split('\n}')[0]


def test_kernel_calls_sum_by_their_hlo_line_other_operations_by_kind():
  line = lambda n: (f'custom-call f32[1,{n}]{{1,0}} tf_q8_matmul <- f32[1,64], '
                    f's8[{n // 16},16,16,4] (ffi_call)')
  described = {'ffi_call.1': line(32), 'ffi_call.2': line(32),
               'ffi_call.3': line(16), 'add_fusion.3': 'fusion f32[4]{0} (add)'}
  group = lambda op: step_profile._group(op, described)  # pylint: disable=protected-access
  assert group('ffi_call.1') == group('ffi_call.2') == line(32)[:-len(' (ffi_call)')]
  assert group('ffi_call.3') == line(16)[:-len(' (ffi_call)')]
  assert group('add_fusion.3') == 'fusion'
  assert group('ffi_call.9') == 'ffi_call'  # No HLO line for it.
