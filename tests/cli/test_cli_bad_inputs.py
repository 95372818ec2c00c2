"""Bad input files and damaged checkpoints: one line, exit 2, no traceback."""
import gzip
import pickle

import pytest

import tiny_lm
from terraformer.cli import decode as decode_cli
from terraformer.errors import TerraformerError


def _decode(capsys, tmp_path, input_file):
  (tmp_path / 'model.pkl.gz').write_bytes(b'')  # The precheck's existence test.
  code = decode_cli.main([
      'terraformer-decode', '--config_file=' + tiny_lm.write_config(tmp_path),
      f'--output_dir={tmp_path}', f'--input_file={input_file}'])
  out, err = capsys.readouterr()
  return code, out, err


@pytest.mark.parametrize('content, message', [
    (b'abstract\n\xff\xfe caf\xe9\n', "is not UTF-8 text (byte 0xff at offset 9)"),
    (b'\x7fELF\x02\x01\x01\x00\x00', 'is binary (NUL byte at offset 7), not '
     'text'),
])
def test_decode_rejects_binary_and_non_utf8_input_files(
    tmp_path, capsys, content, message):
  path = tmp_path / 'input.bin'
  path.write_bytes(content)
  code, out, err = _decode(capsys, tmp_path, path)
  assert code == 2 and out == ''
  assert err.splitlines() == [
      f"terraformer-decode: error: input file '{path}' {message}"]


def test_decode_names_a_damaged_checkpoint_file(tmp_path):
  from terraformer.loading import model as loading_model  # pylint: disable=g-import-not-at-top
  import trax  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'model.pkl.gz'
  with gzip.open(path, 'wb') as f:
    pickle.dump({'flat_weights': 2, 'step': 3}, f)
  model_fn = lambda mode: trax.models.TransformerLM(
      tiny_lm.VOCAB, d_model=16, d_ff=32, n_layers=1, n_heads=2, mode=mode)
  with pytest.raises(TerraformerError, match=(
      f'^checkpoint file {tmp_path}/model.weights.npy.gz is missing$')):
    loading_model.load_model(model_fn, str(tmp_path), 'eval', None)
  path.write_bytes(path.read_bytes()[:20])  # Truncated.
  with pytest.raises(TerraformerError, match=(
      f'^checkpoint file {path} is damaged or truncated')):
    loading_model.load_model(model_fn, str(tmp_path), 'eval', None)
