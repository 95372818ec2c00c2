"""terraformer.checkpoint.format: Trax's model.pkl.gz found, read, written."""
import errno
import gzip
import os
import pickle

import ml_dtypes
import numpy as np
import pytest

from terraformer.checkpoint import format as checkpoint_format
from terraformer.errors import TerraformerError


def test_bfloat16_round_trips_through_trax_bits():
  weights = np.array([1.5, -2.25, 3e38, 1e-3], ml_dtypes.bfloat16)
  bits = checkpoint_format.to_bits(weights)
  assert bits.dtype == np.uint16
  assert bits.tobytes() == weights.tobytes()  # A bit-cast, not a conversion.
  back = checkpoint_format.from_bits(bits)
  assert back.dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(back.astype(np.float32),
                                weights.astype(np.float32))
  floats = np.ones(3, np.float32)  # Other dtypes pass through unchanged.
  assert checkpoint_format.to_bits(floats).dtype == np.float32
  assert checkpoint_format.from_bits(floats).dtype == np.float32


def test_checkpoint_file_of_a_directory_or_file_and_its_errors(tmp_path):
  with pytest.raises(TerraformerError,
                     match=r'init_checkpoint: no checkpoint model.pkl.gz in'):
    checkpoint_format.checkpoint_file(str(tmp_path), 'init_checkpoint')
  with pytest.raises(TerraformerError, match=r"'.*nope' not found"):
    checkpoint_format.checkpoint_file(str(tmp_path / 'nope'))
  with pytest.raises(TerraformerError, match='; train one'):
    checkpoint_format.checkpoint_file(str(tmp_path / 'nope'),
                                      hint='; train one')
  (tmp_path / 'x.txt').write_text('x')
  with pytest.raises(TerraformerError, match='is not a Trax checkpoint'):
    checkpoint_format.checkpoint_file(str(tmp_path / 'x.txt'))
  path = str(tmp_path / 'model.pkl.gz')
  checkpoint_format.write_trax_checkpoint(path, {
      'step': 7, 'flat_weights': [checkpoint_format.to_bits(
          np.ones(2, ml_dtypes.bfloat16))]})
  assert checkpoint_format.checkpoint_file(str(tmp_path)) == path
  assert checkpoint_format.checkpoint_file(path) == path
  flat, step = checkpoint_format.load_flat_weights(str(tmp_path))
  assert step == 7 and flat[0].dtype == ml_dtypes.bfloat16


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
  path = str(tmp_path / 'model.pkl.gz')
  checkpoint_format.write_trax_checkpoint(path, {'flat_weights': [np.ones(2)]})

  def fails(f):
    f.write(b'partial')
    raise OSError(errno.ENOSPC, 'No space left on device')
  with pytest.raises(OSError):
    checkpoint_format.atomic_write(path, fails)
  assert os.listdir(tmp_path) == ['model.pkl.gz']
  saved = checkpoint_format.read_trax_checkpoint(path)['flat_weights']
  np.testing.assert_array_equal(saved[0], np.ones(2))


def _trax_split_checkpoint(folder, n_arrays=3):
  """A Loop checkpoint in Trax's split format (pkl + weights file)."""
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  weights = [np.full((64, 64), i, np.float32) for i in range(n_arrays)]
  tl.np_to_file(weights, str(folder / 'model.weights.npy.gz'),
                compresslevel=2)
  with gzip.open(folder / 'model.pkl.gz', 'wb') as f:
    pickle.dump({'flat_weights': 2, 'step': 5}, f)
  return str(folder / 'model.pkl.gz')


def test_a_truncated_trax_weights_file_is_named(tmp_path):
  from trax import layers as tl  # pylint: disable=g-import-not-at-top
  pkl = _trax_split_checkpoint(tmp_path)
  assert len(checkpoint_format.read_trax_checkpoint(pkl)['flat_weights']) == 3
  weights_file = tmp_path / 'model.weights.npy.gz'
  with open(weights_file, 'r+b') as f:
    f.truncate(os.path.getsize(weights_file) * 2 // 3)
  # Trax's reader silently returns the first arrays only ...
  assert 0 < len(tl.np_from_file(str(weights_file), compresslevel=2)) < 3
  # ... ours names the file.
  with pytest.raises(TerraformerError, match=(
      f'checkpoint file {weights_file} is damaged or truncated')):
    checkpoint_format.read_trax_checkpoint(pkl)
  os.remove(weights_file)
  with pytest.raises(TerraformerError, match=(
      f'checkpoint file {weights_file} is missing')):
    checkpoint_format.read_trax_checkpoint(pkl)
  (tmp_path / 'model.pkl.gz').write_bytes(b'\x1f\x8b\x08 truncated')
  with pytest.raises(TerraformerError, match=(
      f'checkpoint file {pkl} is damaged or truncated')):
    checkpoint_format.read_trax_checkpoint(pkl)
