"""Every gin experiment parses, builds, and has the expected parameter count."""
import glob
import io
import json
import os
import sys

import gin
import pytest
from terraformer import config
from terraformer.cli import common
from terraformer.cli import info

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'gin')
# Include-only fragments (no model on their own) of the OOD cells and of the
# long-input recall32 rows; the cells and rows themselves are checked here (the
# OOD cells also in tests/cli/test_cli_ood.py).
FRAGMENTS = ('ood/base.gin', 'ood/model_transformer.gin',
             'ood/model_terraformer.gin', 'ood/paper_scale.gin',
             'long_input/recall32/base.gin', 'long_input/recall32/keyed.gin',
             'long_input/recall32/keyed_scored.gin')
ALL_CONFIGS = sorted(
    p for p in glob.glob(os.path.join(GIN_DIR, '**', '*.gin'), recursive=True)
    if os.path.relpath(p, GIN_DIR) not in FRAGMENTS)
# Benchmark variants (gin/bench/: other lengths, pooling or sparsity of the
# 800M/17B experiments, timed by terraformer-bench / the memory sweep) are
# parsed and built here, not counted: a shape-only count of an 800M-17B model
# takes 20-60 s, and the experiments they vary are counted below.
BENCH_CONFIGS = [p for p in ALL_CONFIGS
                 if os.path.relpath(p, GIN_DIR).startswith('bench' + os.sep)]
CONFIGS = [p for p in ALL_CONFIGS if p not in BENCH_CONFIGS]
FAMILY_800M = ['dense', 'sparse_ff', 'sparse_qkv', 'sparse_ff_qkv',
               'sparse_ff_qkv_loss']


# The 800M experiments take 15-50 s each to trace at full depth: they are
# counted at 1 and 2 encoder and decoder layers and extrapolated (their blocks
# repeat, so a count is linear in each depth); `test_depth_extrapolation_is_
# exact` checks that on the 17B Terraformer and a tiny ScalingTransformer.
DEEP = {'scaling_800m': 'ScalingTransformer',
        os.path.join('terraformer', 'c4_800m.gin'): 'Terraformer',
        os.path.join('terraformer', 'arxiv_800m.gin'): 'Terraformer'}


def _deep_model(path):
  rel = os.path.relpath(path, GIN_DIR)
  return DEEP.get(rel, DEEP.get(os.path.dirname(rel)))


def info_json(path, bindings=()):
  """terraformer-info --json of one gin file (and bindings), parsed."""
  out = io.StringIO()
  argv = ['terraformer-info', f'--config_file={path}', '--json']
  argv += [f'--config={binding}' for binding in bindings]
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(sys, 'stdout', out)
    assert info.main(argv) == 0, (path, bindings)
  return json.loads(out.getvalue())


def extrapolated_count(path, model):
  """The count of `path`'s model from its 1- and 2-layer versions.

  count(e, d) = c + e * E + d * D per layer class, for e encoder and d decoder
  layers: c, E and D from count(1, 1), count(2, 1) and count(1, 2).
  """
  config.parse_gin([path], [])
  n_enc = gin.query_parameter(f'{model}.n_encoder_layers')
  n_dec = gin.query_parameter(f'{model}.n_decoder_layers')
  gin.clear_config()
  at = lambda e, d: info_json(path, [f'{model}.n_encoder_layers = {e}',
                                     f'{model}.n_decoder_layers = {d}'])
  one, enc2, dec2 = at(1, 1), at(2, 1), at(1, 2)
  by_layer = {}
  for name in {**one['by_layer'], **enc2['by_layer'], **dec2['by_layer']}:
    c1, ce, cd = (count['by_layer'].get(name, 0) for count in (one, enc2, dec2))
    n = c1 + (n_enc - 1) * (ce - c1) + (n_dec - 1) * (cd - c1)
    if n:
      by_layer[name] = n
  return {'by_layer': by_layer, 'total': sum(by_layer.values())}


@pytest.fixture(scope='module')
def counts():
  """terraformer-info --json of every gin file, by path (run once)."""
  results = {}
  for path in CONFIGS:
    model = _deep_model(path)
    results[path] = (extrapolated_count(path, model) if model
                     else info_json(path))
  gin.clear_config()  # Leave no bindings to the test files that follow.
  return results


def test_info_runs_on_every_gin_file(counts):
  assert len(counts) >= 10
  for path, count in counts.items():
    assert count['total'] == sum(count['by_layer'].values()) > 0, path


@pytest.mark.parametrize('name,model', [
    (os.path.join('terraformer', '17b.gin'), 'Terraformer'),
    (os.path.join('tiny', 'encdec_sparse.gin'), 'ScalingTransformer')])
def test_depth_extrapolation_is_exact(counts, name, model):
  path = os.path.join(GIN_DIR, name)
  assert _deep_model(path) is None  # Counted at full depth in `counts`.
  counted = counts[path]  # terraformer-info's raw fields (its tables aside)
  assert extrapolated_count(path, model) == {
      'by_layer': counted['by_layer'], 'total': counted['total']}
  gin.clear_config()


@pytest.mark.parametrize('path', BENCH_CONFIGS,
                         ids=lambda p: os.path.relpath(p, GIN_DIR))
def test_bench_config_parses_and_builds(path):
  common.setup()
  config.parse_gin([path], [])
  layer = config.model_from_config()(mode='eval')
  gin.clear_config()
  assert layer.sublayers  # A whole model, not an empty Serial.


def test_800m_family_is_parameter_matched(counts):
  family = {name: counts[os.path.join(GIN_DIR, 'scaling_800m', f'{name}.gin')]
            for name in FAMILY_800M}
  totals = {name: c['total'] for name, c in family.items()}
  kinds = {name: c['by_layer'] for name, c in family.items()}
  # The paper's models are ~800M parameters and matched to each other.
  assert 0.7e9 < totals['dense'] < 0.9e9
  assert max(totals.values()) / min(totals.values()) < 1.1, totals
  # Each switch really swaps the layers it names.
  assert 'SparseFF' not in kinds['dense'] and 'SparseFF' in kinds['sparse_ff']
  assert 'ModuleConv' in kinds['sparse_qkv']
  assert 'ModuleConv' not in kinds['sparse_ff']
  assert (kinds['sparse_ff_qkv_loss']['MultiplicativeDense']
          > kinds['sparse_ff_qkv']['MultiplicativeDense'])


def test_terraformer_sizes(counts):
  """Terraformer 800M (C4 and arXiv: the same weights) and 17B (§4.4)."""
  def total(name):
    return counts[os.path.join(GIN_DIR, 'terraformer', f'{name}.gin')]['total']
  dense_800m = counts[os.path.join(GIN_DIR, 'scaling_800m', 'dense.gin')]
  # Same dims as the dense 800M, fewer weights: no encoder-decoder
  # attention, one shared embedding, fixed-base positions, sparse loss.
  assert 0.8 < total('c4_800m') / dense_800m['total'] < 1.0
  assert total('arxiv_800m') == total('c4_800m')  # Fine-tunes its checkpoint.
  assert 16.5e9 < total('17b') < 17.5e9


# gin/long_input/cst_lm/ROW.gin: (attention: None = full, else (L, α,
# global branch)), positions at the embedding.
CST_LM_ROWS = {'full': (None, True), 'blockwise': ((32, 1, False), True),
               'cst_a1': ((32, 1, True), False),
               'cst_a2': ((32, 2, True), False),
               'cst_a1_local': ((32, 1, False), False),
               'cst_a2_local': ((32, 2, False), False)}


@pytest.mark.parametrize('row', sorted(CST_LM_ROWS))
def test_cst_lm_rows_build_what_their_names_say(row):
  from terraformer.layers.composite_slice_attention import CompositeSliceAttention  # pylint: disable=g-import-not-at-top
  from trax.layers import attention as trax_attention  # pylint: disable=g-import-not-at-top
  common.setup()
  config.parse_gin([os.path.join(GIN_DIR, 'long_input', 'cst_lm',
                                 f'{row}.gin')], [])
  try:
    model = config.model_from_config()(mode='eval')
  finally:
    gin.clear_config()
  layers = []

  def walk(layer):
    layers.append(layer)
    for sub in layer.sublayers:
      walk(sub)

  walk(model)
  cst = [l for l in layers if isinstance(l, CompositeSliceAttention)]
  attention, positions = CST_LM_ROWS[row]
  got = sorted({(l._slice_len, l._extension, l._use_global) for l in cst})  # pylint: disable=protected-access
  assert got == ([] if attention is None else [attention])
  assert len(cst) == (0 if attention is None else 2)  # Each layer's.
  assert any(isinstance(l, trax_attention.PositionalEncoding)
             for l in layers) == positions
