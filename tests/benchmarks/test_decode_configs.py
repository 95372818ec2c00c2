"""decode_configs: gin models, Trax's reference, reports, the d_model sweep
(and their tables, terraformer/cli/bench_format.py, on the same reports)."""
import json
import math

import gin
import pytest
from trax.layers.research import sparsity as trax_sparsity

from terraformer.benchmarks import decode_configs as benchmark
from terraformer.benchmarks import decode_speed
from terraformer import errors
from terraformer.cli import bench_format
from terraformer.cli import common

from bench_models import LM_GIN, SPARSE_GIN  # tests/bench_models.py

LM, SPARSE = LM_GIN, SPARSE_GIN

ENCDEC = """
terraformer.train.model = @ScalingTransformer
ScalingTransformer.input_vocab_size = 64
ScalingTransformer.d_model = 32
ScalingTransformer.d_ff = 64
ScalingTransformer.n_encoder_layers = 2
ScalingTransformer.n_decoder_layers = 3
ScalingTransformer.n_heads = 4
ScalingTransformer.max_len = 128
ScalingTransformer.d_lowrank = 4
ScalingTransformer.ff_sparsity = 8
ScalingTransformer.attention_sparsity = 4
ScalingTransformer.loss_sparsity = 4
"""


@pytest.fixture(autouse=True)
def _gin():
  common.setup()
  yield
  gin.clear_config()


def _parse(text):
  gin.clear_config()
  gin.parse_config(text)


def _layer_classes(layer, out=None):
  out = set() if out is None else out
  out.add(type(layer).__name__)
  for sub in layer.sublayers:
    _layer_classes(sub, out)
  return out


def _layer_names(layer, out=None):
  out = set() if out is None else out
  out.add(layer.name)
  for sub in layer.sublayers:
    _layer_names(sub, out)
  return out


def test_configured_model_reads_gin():
  _parse(ENCDEC)
  _, selector, kwargs = benchmark.configured_model()
  assert selector == 'ScalingTransformer'
  assert kwargs['n_decoder_layers'] == 3 and kwargs['d_model'] == 32
  assert kwargs['attention_kernel_size'] == 3   # a signature default
  spec = benchmark.spec_from_gin('x')
  assert spec.n_blocks == 3
  assert 'SparseFF' in _layer_classes(spec.model)
  # The base model has no decoder blocks and one encoder block.
  assert _layer_classes(spec.base_model) >= {'Embedding', 'MultiplicativeDense'}
  assert 'SparseFF' in _layer_classes(spec.base_model)   # the encoder's
  gin.clear_config()
  with pytest.raises(errors.TerraformerError, match='no model configured'):
    benchmark.configured_model()


def test_trax_reference_has_the_same_sparsity():
  _parse(ENCDEC)
  spec = benchmark.trax_spec_from_gin('trax')
  # Trax's SparseFF, LocallyConvDense's predict-mode buffer, and the
  # multiplicative layers' weights (attention M = 8, loss M = 16).
  classes = _layer_classes(spec.model)
  assert {'_SparseFFMain', '_SparseFFController', '_RememberPad'} <= classes
  names = _layer_names(spec.model)
  assert {'Weights_[32, 8]', 'Weights_[32, 16]'} <= names   # E: d x M
  assert spec.n_blocks == 3
  assert spec.model.n_in == 2
  _parse(LM)
  dense = _layer_classes(benchmark.trax_spec_from_gin('trax').model)
  assert not dense & {'_SparseFFMain', '_RememberPad', 'Weights'}


def test_trax_reference_decodes():
  _parse(LM + SPARSE)
  spec = benchmark.trax_spec_from_gin('trax')
  result = decode_speed.measure_model(spec.model, tokens=2, prompt_len=2,
                                      repeats=1)
  assert result['ms_per_token_repeats'][0] > 0


def test_trax_reference_only_for_scaling_transformers():
  with pytest.raises(errors.TerraformerError, match='no Trax reference'):
    benchmark.trax_reference_fn('terraformer.Terraformer', {})


def test_sweep_bindings_scale_with_d_model():
  _parse(ENCDEC)
  _, selector, kwargs = benchmark.configured_model()
  assert benchmark.sweep_bindings(selector, kwargs, 64) == [
      'ScalingTransformer.d_model = 64', 'ScalingTransformer.d_ff = 128',
      'ScalingTransformer.n_heads = 8',
      'ScalingTransformer.attention_sparsity = 8']
  with pytest.raises(errors.TerraformerError, match='does not scale'):
    benchmark.sweep_bindings(selector, kwargs, 33)  # 4 heads -> 4.125


def test_run_report_is_consistent(tmp_path):
  texts = {'dense': LM, 'sparse': LM + SPARSE}
  report = benchmark.run([(k, k) for k in texts],
                         lambda name, extra: _parse(texts[name]), tokens=2,
                         prompt_len=3, repeats=2, log=lambda _: None)
  dense, sparse = report['models']
  assert [dense['name'], sparse['name']] == ['dense', 'sparse']
  # The faster model has the larger speedup over the first (dense) one.
  assert (sparse['speedup'] > dense['speedup']) == (
      sparse['ms_per_token'] < dense['ms_per_token'])
  for r in report['models']:
    assert r['n_blocks'] == 2
  # Only the sparse model has sparse FF layers; they, the sparse QKV and the
  # sparse logits read fewer bytes per block and per token.
  assert 'SparseFF' in sparse['bytes_by_layer']
  assert 'SparseFF' not in dense['bytes_by_layer']
  assert sparse['bytes_per_block'] < dense['bytes_per_block']
  assert sparse['bytes_per_token'] < dense['bytes_per_token']
  table = bench_format.format_table(report)
  assert table.splitlines()[0].split()[:3] == ['model', 'ms/token',
                                               '[min-max]']
  assert [l.split()[0] for l in table.splitlines()[1:3]] == ['dense',
                                                            'sparse']
  text = json.dumps(bench_format.json_report(report))
  assert json.loads(text)['models'][1]['name'] == 'sparse'


INT8_KERNELS = """
decode_options.kernels = 'ffi'
decode_options.weights = 'int8'
"""


def test_kernel_configs_report_their_path_bytes_and_agreement():
  """gin decode_options per model: the int8 kernel model reads fewer bytes,
  says so, and stays close to the float32 XLA model's logits."""
  texts = {'xla': LM + SPARSE, 'int8': LM + SPARSE + INT8_KERNELS}
  parse = lambda name, extra: _parse(texts[name])
  report = benchmark.run([(k, k) for k in texts], parse, tokens=2,
                         prompt_len=3, repeats=1, log=lambda _: None)
  xla, int8 = report['models']
  assert xla['decode_path'] == 'xla'
  assert int8['decode_path'].startswith('ffi (') and 'int8' in int8[
      'decode_path']
  assert int8['bytes_per_token'] < xla['bytes_per_token']
  assert 'int8' in bench_format.format_table(report).splitlines()[-1]
  rows = benchmark.agreement([(k, k) for k in texts], parse, tokens=6,
                             prompt_len=3, log=lambda _: None)
  assert rows[0]['max_abs_logit_delta'] == 0
  assert rows[0]['greedy_agreement'] == 1
  assert 0 < rows[1]['max_abs_logit_delta'] < 0.05 * rows[0]['max_abs_logit']
  assert 0 <= rows[1]['greedy_agreement'] <= 1
  assert 'int8' in bench_format.format_agreement(rows)


def test_mirror_of_trax_sparse_ff_is_trax_layer():
  """The reference really is Trax's research code, not ours."""
  _parse(LM + SPARSE)
  spec = benchmark.trax_spec_from_gin('trax')

  def find(layer):
    if type(layer).__module__ == trax_sparsity.__name__:
      return True
    return any(find(s) for s in layer.sublayers)

  assert find(spec.model)
  assert spec.n_blocks == 2


def test_projection_equals_the_deeper_model():
  texts = {'sparse': ENCDEC + 'PAPER_DECODE_SECONDS = 0.5\n',
           'deep': ENCDEC + ('ScalingTransformer.n_decoder_layers = 3\n'
                             'ScalingTransformer.n_encoder_layers = 0\n')}
  parse = lambda name, extra: _parse(texts[name])
  projected = benchmark.run([('sparse', 'sparse')], parse, tokens=2,
                            prompt_len=3, repeats=1, log=lambda _: None,
                            project_layers=3, fit_blocks=1)
  parse('deep', [])
  deep = decode_speed.measure_model(benchmark.spec_from_gin('deep').model,
                                    tokens=2, prompt_len=3, repeats=1)
  result = projected['models'][0]
  assert result['n_blocks'] == 1 and result['paper_seconds'] == 0.5
  # Bytes projected from 1 block and 0 blocks = those of the 3-block model.
  assert result['projected_bytes_per_token'] == pytest.approx(
      deep['bytes_per_token'])
  # Times: measured, not compared (one repeat of a tiny model: under load the
  # 1-block model can time below the 0-block one, so the projection's sign
  # is noise here; docs/decoding-speed.md compares real ones).
  assert result['ms_no_blocks'] > 0
  assert math.isfinite(result['projected_ms_per_token'])
  table = bench_format.format_projection(projected)
  assert table.splitlines()[1].split()[:2] == ['sparse', '1']
  with pytest.raises(errors.TerraformerError, match='cannot be combined'):
    benchmark.run([('sparse', 'sparse')], parse, compare_trax=True,
                  project_layers=3)


def test_user_path_decodes_what_trax_decodes():
  texts = {'sparse': LM + SPARSE}
  report = benchmark.user_path([('sparse', 'sparse')],
                               lambda name, extra: _parse(texts[name]),
                               tokens=3, prompt_len=2, repeats=1,
                               log=lambda _: None)
  result = report['models'][0]
  assert result['same_tokens']
  assert result['ours_ms_per_token'] > 0 and result['trax_ms_per_token'] > 0
  assert bench_format.format_user_path(report).splitlines()[1].split()[0] == (
      'sparse')


def test_xla_ops_per_block():
  texts = {'dense': LM, 'sparse': LM + SPARSE}
  dense, sparse = benchmark.xla_ops([(k, k) for k in texts],
                                    lambda name, extra: _parse(texts[name]),
                                    log=lambda _: None)
  for r in (dense, sparse):
    # Every block compiles to the same operations: a whole number of them.
    assert r['ops_per_block'] == int(r['ops_per_block']) > 0
    assert r['ops_per_token'] > 3 * r['ops_per_block']
    assert sum(r['ops_per_block_by_kind'].values()) == r['ops_per_block']
  assert dense['ops_per_block_by_kind'].get('dot', 0) >= 1
  assert bench_format.format_xla_ops([dense]).splitlines()[1].split()[:2] == [
      'dense', f"{dense['ops_per_block']:g}"]


def test_dense_is_no_sparsity_keyword_and_no_terraformer():
  _parse(LM)
  assert benchmark.model_kind() == {'dense': True, 'd_model': 32,
                                    'decode_options': ['xla', 'float32']}
  _parse(LM + SPARSE + INT8_KERNELS)
  assert benchmark.model_kind() == {'dense': False, 'd_model': 32,
                                    'decode_options': ['ffi', 'int8']}
  select = 'terraformer.models.{}'.format
  assert not benchmark.is_dense(select('Terraformer'), {'ff_sparsity': 0})
  assert not benchmark.is_dense(select('ScalingTransformer'),
                                {'ff_sparsity': 0, 'loss_sparsity': 0,
                                 'cross_attention_sparsity': 4})
  assert benchmark.is_dense(select('ScalingTransformer'),
                            {'cross_attention_sparsity': None})


def _timed(name, dense, options, ms, bound, d_model=32, gbps=10.0,
           **extra):
  """A timed result whose bound is `bound` ms at `gbps` (bytes to match)."""
  return dict(name=name, dense=dense, decode_options=list(options),
              d_model=d_model, ms_per_token=ms, bound_ms_per_token=bound,
              bytes_per_token=bound * gbps * 1e6, **extra)


def test_dense_speedups_pair_each_model_with_its_storages_dense_model():
  """Each model is compared with the dense model of its own decode options
  and d_model, measured and at that dense model's bound on this model's
  bandwidth (its bytes / this model's, over this model's distance from its
  own bound); none where the run has no such dense model."""
  results = [
      _timed('dense xla', True, ('xla', 'float32'), 100.0, 50.0),
      _timed('sparse xla', False, ('xla', 'float32'), 25.0, 5.0),
      _timed('dense int8', True, ('ffi', 'int8'), 40.0, 12.5),
      # Half the dense model's bandwidth: its bound is 2 ms for 10 MB, the
      # dense model's 125 MB would take 25 ms on that memory.
      _timed('sparse int8', False, ('ffi', 'int8'), 10.0, 2.0, gbps=5.0),
      _timed('sparse q8', False, ('ffi', 'q8'), 8.0, 2.0),
      _timed('wide dense int8', True, ('ffi', 'int8'), 80.0, 25.0,
             d_model=64),
      _timed('wide sparse int8', False, ('ffi', 'int8'), 16.0, 4.0,
             d_model=64)]
  benchmark.add_dense_speedups(results)
  got = {r['name']: (r['dense_baseline'], r['speedup_vs_dense'],
                     r['speedup_vs_dense_bound']) for r in results}
  assert got == {
      'dense xla': ('dense xla', 1.0, 0.5),
      'sparse xla': ('dense xla', 4.0, 2.0),
      'dense int8': ('dense int8', 1.0, 12.5 / 40.0),
      'sparse int8': ('dense int8', 4.0, 2.5),
      'sparse q8': (None, None, None),
      'wide dense int8': ('wide dense int8', 1.0, 25.0 / 80.0),
      'wide sparse int8': ('wide dense int8', 5.0, 25.0 / 16.0)}
  assert all('projected_speedup_vs_dense' not in r for r in results)
  # Projected results: the same from the projected figures.
  projected = [
      _timed('dense', True, ('ffi', 'int8'), 9.0, 1.0,
             projected_ms_per_token=400.0,
             projected_bound_ms_per_token=300.0,
             projected_bytes_per_token=3000.0),
      _timed('sparse', False, ('ffi', 'int8'), 3.0, 0.5,
             projected_ms_per_token=100.0,
             projected_bound_ms_per_token=20.0,
             projected_bytes_per_token=200.0)]
  benchmark.add_dense_speedups(projected)
  assert [(r['projected_speedup_vs_dense'],
           r['projected_speedup_vs_dense_bound']) for r in projected] == [
               (1.0, 0.75), (4.0, 3.0)]
  assert projected[1]['speedup_vs_dense'] == 3.0
  # The tables show them.
  report = {'models': results, 'bandwidth_gbps': 10.0,
            'settings': dict(tokens=2, prompt_len=3, repeats=1)}
  for r in results:
    r.update(ms_per_token_min=r['ms_per_token'],
             ms_per_token_max=r['ms_per_token'], bytes_per_token=1e6,
             speedup=1.0)
  table = bench_format.speed_table(report)
  columns = table['columns']
  assert (columns.index('per block') < columns.index('vs dense') <
          columns.index('vs dense bound'))
  dense_cells = lambda name: next(
      r for r in table['rows'] if r[0] == name)[columns.index('vs dense'):
                                                columns.index('vs dense') + 2]
  assert dense_cells('sparse int8') == ['4.00x', '2.50x']
  assert dense_cells('sparse q8') == ['–', '–']
  lines = bench_format.format_table(report).splitlines()
  assert lines[:len(table['rows']) + 1] == bench_format.common.format_aligned(
      table).splitlines()
  sparse_int8 = next(l for l in lines if l.startswith('sparse int8 ')).split()
  assert sparse_int8[-4:-2] == ['4.00x', '2.50x']
  assert bench_format.DENSE_NOTE in lines


def test_a_compute_bound_model_is_compared_with_dense_by_its_bytes():
  """A model whose bound is its compute bound (arithmetic over the
  instructions' peaks above its bytes over the bandwidth): the dense
  model's bytes at its bandwidth use its bytes bound, not the larger one."""
  dense = _timed('dense q8', True, ('ffi', 'q8'), 100.0, 100.0)
  sparse = _timed('sparse q8', False, ('ffi', 'q8'), 10.0, 8.0,
                  bytes_bound_ms_per_token=4.0)
  sparse['bytes_per_token'] = 4.0 * 10.0 * 1e6  # 4 ms at 10 GB/s.
  benchmark.add_dense_speedups([dense, sparse])
  # The dense model's 1000 MB at 10 GB/s: 100 ms, over 10 ms measured.
  assert sparse['speedup_vs_dense_bound'] == pytest.approx(10.0)


def test_projection_carries_the_compute_bound():
  """project(): multiply-adds per token projected like the bytes (the
  blocks'), at the peaks measured; the bound, the larger of the two."""
  result = dict(n_blocks=2, ms_per_block=1.0, ms_no_blocks=3.0,
                ms_per_token=5.0, bytes_per_token=3e6, bytes_per_block=1e6,
                bandwidth_gbps=1.0,
                macs_per_token={'int8': 3e9, 'float': 1e9},
                macs_per_block={'int8': 1e9, 'float': 0.0},
                peak_macs={'int8': 1e12, 'float32': 1e11})
  benchmark.project(result, 10)
  # Bytes: 1 MB + 10 MB at 1 GB/s = 11 ms; int8: (1 + 10) G MACs at 1 T/s
  # = 11 ms, float: 1 G at 100 G/s = 10 ms: 21 ms.
  assert result['projected_bytes_bound_ms_per_token'] == pytest.approx(11.0)
  assert result['projected_compute_bound_ms_per_token'] == pytest.approx(21.0)
  assert result['projected_bound_ms_per_token'] == pytest.approx(21.0)
