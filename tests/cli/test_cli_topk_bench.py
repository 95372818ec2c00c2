"""terraformer-topk-bench: soft top-k time and nCCS (App. B.5), tiny grid."""
import json

from terraformer.cli import topk_bench


def test_table_json_and_plot(tmp_path, capsys):
  json_path, png = tmp_path / 'topk.json', tmp_path / 'topk.png'
  code = topk_bench.main([
      'topk_bench', '--ns=16,64', '--ks=4,16', '--batch=2', '--d=8',
      '--repeats=1', '--methods=sh,sh_unsorted,goyal,hard', '--goyal_max=256',
      f'--json={json_path}', f'--plot={png}'])
  out, _ = capsys.readouterr()
  assert code == 0
  report = json.loads(json_path.read_text())
  pairs = [(row['n'], row['k']) for row in report['rows']]
  assert pairs == [(16, 4), (64, 4), (64, 16)]       # only k < n
  for row in report['rows']:
    assert row['hard']['nccs'] > 0.999               # exact is exact
    assert 0 < row['sh']['nccs'] <= 1.0 + 1e-6
    assert row['sh']['ms'] > 0
    # The O(nk) baseline runs only within goyal_max = n*k <= 256.
    assert (row['goyal'] is None) == (row['n'] * row['k'] > 256)
  table = [l for l in out.splitlines() if l.startswith('|')]
  assert len(table) == 2 + 3
  assert table[0].split('|')[1].strip() == 'k'
  assert png.stat().st_size > 0


def test_bad_input_is_one_line_error(capsys):
  code = topk_bench.main(['topk_bench', '--ns=24', '--ks=8'])
  _, err = capsys.readouterr()
  assert code == 2
  assert err.strip().count('\n') == 0 and 'power of 2' in err
  code = topk_bench.main(['topk_bench', '--methods=sh,nope'])
  _, err = capsys.readouterr()
  assert code == 2 and 'nope' in err
