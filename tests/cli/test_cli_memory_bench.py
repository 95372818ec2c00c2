"""terraformer-memory-bench: memory vs depth, reversible vs plain backprop.

The tests measure the same tiny Terraformer (one layer each side, input 512,
target 32, batch 1) where their checks allow it: its gradient step is
compiled once, and the tests after the first load it from the suite's
persistent compilation cache (tests/conftest.py) instead of compiling it
again.
"""
import json

import pytest

from terraformer.cli import memory_bench

TINY_TERRAFORMER = """
Terraformer.input_vocab_size = 64
Terraformer.d_model = 32
Terraformer.d_ff = 64
Terraformer.n_heads = 4
Terraformer.dropout = 0.0
Terraformer.max_len = 512
Terraformer.encoder_attention_type = 'full'
Terraformer.decoder_attention_type = 'full'
Terraformer.d_sru = 8
terraformer.train.model = @Terraformer
"""
ONE_LAYER = ('Terraformer.n_encoder_layers = 1\n'
             'Terraformer.n_decoder_layers = 1\n')


def _run(capsys, tmp_path, *args, config=TINY_TERRAFORMER):
  path = tmp_path / 'tiny.gin'
  path.write_text(config)
  code = memory_bench.main(['terraformer-memory-bench',
                            f'--config_file={path}', *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_reversible_memory_grows_slower_with_depth(tmp_path, capsys):
  code, out, _ = _run(capsys, tmp_path, '--layers=1,2', '--input_len=512',
                      '--target_len=32', '--batch_size=1', '--json')
  assert code == 0
  result = json.loads(out)
  assert (result['batch_size'], result['input_len'], result['target_len']) == (
      1, 512, 32)
  rows = {row['layers']: row for row in result['rows']}
  assert sorted(rows) == [1, 2]
  # The table the CLI prints without --json.
  assert result['tables'] == {'depth': memory_bench.depth_table(
      result['rows'])}
  for row in rows.values():
    for kind in ('reversible', 'non_reversible'):
      m = row[kind]
      assert m['total'] == m['argument'] + m['output'] + m['temp'] > 0
    # Same weights either way (the states may differ by a few bytes).
    rev, plain = row['reversible'], row['non_reversible']
    assert abs(rev['argument'] - plain['argument']) < 0.01 * rev['argument']
  growth = {kind: rows[2][kind]['total'] - rows[1][kind]['total']
            for kind in ('reversible', 'non_reversible')}
  # One more layer each side: plain backprop keeps its activations
  # (attention weights [1, 4, 544, 544] among them), reversible layers not.
  assert growth['non_reversible'] > 2 * growth['reversible'] > 0


def test_table(tmp_path, capsys):
  code, out, _ = _run(capsys, tmp_path, '--layers=1', '--input_len=512',
                      '--target_len=32')
  assert code == 0
  lines = out.splitlines()
  assert lines[0].startswith('gradient step, batch 1, input 512, target 32')
  assert lines[1].split()[:2] == ['layers', 'reversible']
  assert lines[2].split()[0] == '1' and len(lines) == 3


@pytest.mark.parametrize('args, config, message', [
    (['--layers=a,2'], TINY_TERRAFORMER, '--layers must be integers'),
    (['--layers=0'], TINY_TERRAFORMER, '--layers must be positive'),
    ([], 'Terraformer.d_model = 32\n', 'missing gin binding'),
    ([], 'terraformer.train.model = @ScalingTransformer\n',
     'does not take n_encoder_layers'),
])
def test_errors(tmp_path, capsys, args, config, message):
  code, _, err = _run(capsys, tmp_path, *args, config=config)
  assert code == 2
  assert len(err.splitlines()) == 1 and message in err, err


# --- --input_lens: memory and step time vs input length -------------------

TINY_POOLED = TINY_TERRAFORMER + """
Terraformer.encoder_attention_type = 'blockwise'
Terraformer.block_len = 64
Terraformer.encoder_pooling = {0: 64}
"""


def _run_lengths(capsys, tmp_path, *args, configs=None):
  paths = []
  for name, text in (configs or {}).items():
    paths.append(tmp_path / f'{name}.gin')
    paths[-1].write_text(text)
  code = memory_bench.main(['terraformer-memory-bench',
                            *[f'--config_file={p}' for p in paths], *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_memory_grows_slower_with_length_when_pooled(tmp_path, capsys):
  plot = tmp_path / 'lengths.png'
  code, out, _ = _run_lengths(
      capsys, tmp_path, '--input_lens=128,512', '--target_len=32',
      '--repeats=1', '--time_budget_gb=1', f'--plot={plot}', '--json',
      configs={'full': TINY_TERRAFORMER + ONE_LAYER,
               'pooled': TINY_POOLED + ONE_LAYER})
  assert code == 0
  report = json.loads(out)
  assert (report['batch_size'], report['target_len']) == (1, 32)
  assert list(report['models']) == ['full', 'pooled']
  assert report['tables'] == {'lengths': memory_bench.lengths_table(report)}
  growth = {}
  for name, rows in report['models'].items():
    assert [r['input_len'] for r in rows] == [128, 512]
    for row in rows:
      m = row['memory']
      assert m['total'] == m['argument'] + m['output'] + m['temp'] > 0
      assert row['step_ms'] > 0
    growth[name] = rows[1]['memory']['total'] - rows[0]['memory']['total']
  # Full attention keeps [1, 4, 544, 544] attention weights in the decoder
  # (encoder outputs + targets); pooled, the decoder sees 64 + 32 positions.
  assert growth['full'] > 2 * growth['pooled'] > 0
  assert plot.stat().st_size > 0


def test_length_table_and_budget(tmp_path, capsys):
  code, out, _ = _run_lengths(
      capsys, tmp_path, '--input_lens=512', '--target_len=32',
      '--time_budget_gb=0', configs={'full': TINY_TERRAFORMER + ONE_LAYER})
  assert code == 0
  lines = out.splitlines()
  assert lines[0].startswith('gradient step, batch 1, target 32 tokens')
  assert lines[1].split() == ['input', 'tokens', 'full']
  cells = lines[2].split()
  # Over the time budget (0 GiB): compiled for memory, not run (no ms).
  assert cells[0] == '512' and float(cells[1]) > 0 and len(cells) == 2
  assert len(lines) == 3


@pytest.mark.parametrize('args, configs, message', [
    (['--input_lens=1,x'], {'full': TINY_TERRAFORMER},
     '--input_lens must be integers'),
    (['--input_lens=0'], {'full': TINY_TERRAFORMER},
     '--input_lens must be positive'),
    (['--input_lens=32'], {}, 'at least one --config_file'),
    (['--input_lens=32'], {'bad': 'Terraformer.d_model = 32\n'},
     'missing gin binding'),
    (['--input_lens=32', '--plot=/no/such/dir/x.png'], {'full': TINY_TERRAFORMER},
     'does not exist'),
])
def test_length_errors(tmp_path, capsys, args, configs, message):
  code, _, err = _run_lengths(capsys, tmp_path, *args, configs=configs)
  assert code == 2
  assert len(err.splitlines()) == 1 and message in err, err
