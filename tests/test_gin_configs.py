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
# Include-only fragments of the OOD cells (no model on their own); the cells
# themselves are checked here and in tests/cli/test_cli_ood.py.
FRAGMENTS = ('ood/base.gin', 'ood/model_transformer.gin',
             'ood/model_terraformer.gin', 'ood/paper_scale.gin')
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


@pytest.fixture(scope='module')
def counts():
  """terraformer-info --json of every gin file, by path (run once)."""
  results = {}
  with pytest.MonkeyPatch.context() as mp:
    for path in CONFIGS:
      out = io.StringIO()
      mp.setattr(sys, 'stdout', out)
      assert info.main(['terraformer-info', f'--config_file={path}',
                        '--json']) == 0, path
      results[path] = json.loads(out.getvalue())
  gin.clear_config()  # Leave no bindings to the test files that follow.
  return results


@pytest.mark.slow
def test_info_runs_on_every_gin_file(counts):
  assert len(counts) >= 10
  for path, count in counts.items():
    assert count['total'] == sum(count['by_layer'].values()) > 0, path


@pytest.mark.slow
@pytest.mark.parametrize('path', BENCH_CONFIGS,
                         ids=lambda p: os.path.relpath(p, GIN_DIR))
def test_bench_config_parses_and_builds(path):
  common.setup()
  config.parse_gin([path], [])
  layer = config.model_from_config()(mode='eval')
  gin.clear_config()
  assert layer.sublayers  # A whole model, not an empty Serial.


@pytest.mark.slow
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


@pytest.mark.slow
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
