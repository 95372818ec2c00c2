"""terraformer-memory-bench: memory vs depth, reversible vs plain backprop."""
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


def _run(capsys, tmp_path, *args, config=TINY_TERRAFORMER):
  path = tmp_path / 'tiny.gin'
  path.write_text(config)
  code = memory_bench.main(['terraformer-memory-bench',
                            f'--config_file={path}', *args])
  out, err = capsys.readouterr()
  return code, out, err


def test_reversible_memory_grows_slower_with_depth(tmp_path, capsys):
  code, out, _ = _run(capsys, tmp_path, '--layers=1,2', '--input_len=192',
                      '--target_len=64', '--batch_size=2', '--json')
  assert code == 0
  result = json.loads(out)
  assert (result['batch_size'], result['input_len'], result['target_len']) == (
      2, 192, 64)
  rows = {row['layers']: row for row in result['rows']}
  assert sorted(rows) == [1, 2]
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
  # (attention weights [2, 4, 256, 256] among them), reversible layers not.
  assert growth['non_reversible'] > 2 * growth['reversible'] > 0


def test_table(tmp_path, capsys):
  code, out, _ = _run(capsys, tmp_path, '--layers=1', '--input_len=32',
                      '--target_len=8')
  assert code == 0
  lines = out.splitlines()
  assert lines[0].startswith('gradient step, batch 1, input 32, target 8')
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
