"""terraformer.checkpoint.store: atomic commit, verified restore, cleanup, ENOSPC."""
import errno
import os

import numpy as np
import pytest

from terraformer.checkpoint import store as checkpoints
from terraformer.errors import TerraformerError


def _arrays(step):
  rng = np.random.RandomState(step)
  return {'weights_00000': rng.randn(3, 4).astype(np.float32),
          'slots0_00000': rng.randn(4).astype(np.float32),
          'rng': np.array([step, 7], np.uint32)}


def _shapes(arrays):
  return {k: (v.shape, v.dtype) for k, v in arrays.items()}


def _save(store, *steps):
  for step in steps:
    store.save(step, _arrays(step), {'batches_consumed': step})


def _restore(output_dir):
  return checkpoints.CheckpointStore(str(output_dir)).restore(
      _shapes(_arrays(0)))


def _assert_arrays_equal(got, want):
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name])


def test_restores_the_newest_and_keeps_the_last_k(tmp_path):
  store = checkpoints.CheckpointStore(str(tmp_path), keep=2)
  assert store.restore(_shapes(_arrays(0))) is None  # Nothing saved yet.
  _save(store, 1, 2, 3)
  assert store.steps() == [3, 2]
  step, arrays, meta = _restore(tmp_path)
  assert step == 3 and meta['batches_consumed'] == 3 and meta['step'] == 3
  _assert_arrays_equal(arrays, _arrays(3))
  assert arrays['rng'].dtype == np.uint32


def test_leftovers_of_interrupted_saves_are_removed(tmp_path, capsys):
  store = checkpoints.CheckpointStore(str(tmp_path))
  _save(store, 1)
  folder = tmp_path / checkpoints.CHECKPOINTS
  (folder / '2.orbax-checkpoint-tmp-123').mkdir()  # Killed inside orbax.
  os.makedirs(folder / '3' / 'arrays')  # Renamed, killed before the marker.
  (tmp_path / 'model.pkl.gz.tmp-99').write_bytes(b'half')
  (tmp_path / 'model.weights.npy.gz._tmp_').write_bytes(b'trax')
  step, arrays, _ = _restore(tmp_path)
  assert step == 1
  _assert_arrays_equal(arrays, _arrays(1))
  assert sorted(os.listdir(folder)) == ['1']
  assert sorted(os.listdir(tmp_path)) == [checkpoints.CHECKPOINTS]
  removed = [l for l in capsys.readouterr().out.splitlines()
             if l.startswith('Removed ')]
  assert len(removed) == 4


def _files(path):
  return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


@pytest.mark.parametrize('damage', ['truncate_data', 'marker_step',
                                    'drop_meta'])
def test_a_damaged_newest_is_reported_and_skipped(tmp_path, capsys, damage):
  store = checkpoints.CheckpointStore(str(tmp_path))
  _save(store, 1, 2)
  newest = tmp_path / checkpoints.CHECKPOINTS / '2'
  if damage == 'truncate_data':  # Every array file cut to half its size.
    data = [f for f in _files(newest / 'arrays')
            if os.path.basename(os.path.dirname(f)) == 'd']
    assert data
    for path in data:
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)
  elif damage == 'marker_step':
    (newest / checkpoints.MARKER).write_text('1\n')
  else:
    for path in _files(newest / 'meta'):
      os.remove(path)
  step, arrays, _ = _restore(tmp_path)
  assert step == 1
  _assert_arrays_equal(arrays, _arrays(1))
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('Checkpoint step 2 in ')
  assert 'damaged' in err[0] and 'trying the previous one' in err[0]
  assert not newest.exists()
  assert len(os.listdir(tmp_path / checkpoints.DAMAGED)) == 1


def test_another_model_is_an_error_not_damage(tmp_path):
  store = checkpoints.CheckpointStore(str(tmp_path))
  _save(store, 1)
  shapes = _shapes(_arrays(0))
  shapes['weights_00000'] = ((5, 4), np.float32)
  with pytest.raises(TerraformerError, match=r'does not match the model: '
                     r'weights_00000: checkpoint \[\[3, 4\], .float32.\] vs '
                     r'model \[\[5, 4\], .float32.\]'):
    checkpoints.CheckpointStore(str(tmp_path)).restore(shapes)
  assert checkpoints.CheckpointStore(str(tmp_path)).steps() == [1]


def test_disk_full_removes_the_partial_step_and_keeps_the_last(
    tmp_path, monkeypatch):
  store = checkpoints.CheckpointStore(str(tmp_path))
  _save(store, 1)

  def no_space(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
  monkeypatch.setattr(checkpoints, 'fsync_tree', no_space)
  with pytest.raises(TerraformerError, match=(
      r'cannot save the checkpoint of step 2 in .* \(disk full\); partial '
      r'files removed, last good checkpoint: step 1')):
    _save(store, 2)
  assert os.listdir(tmp_path / checkpoints.CHECKPOINTS) == ['1']
  monkeypatch.undo()
  assert _restore(tmp_path)[0] == 1
  _save(store, 2)  # The next save works again.
  assert _restore(tmp_path)[0] == 2


def test_sharded_store_round_trips_global_arrays_and_skips_damage(
    tmp_path, capsys):
  """CheckpointStore(sharded=True) (FSDP): jax.Arrays split over a mesh are
  written and read back split the same way; a damaged newest is skipped."""
  import jax  # pylint: disable=g-import-not-at-top
  from terraformer.training import fsdp  # pylint: disable=g-import-not-at-top
  mesh = fsdp.device_mesh()
  split = jax.sharding.NamedSharding(mesh, fsdp.fsdp_spec(
      (3, 4 * mesh.devices.size), mesh.devices.size))

  def arrays(step):
    host = _arrays(step)
    host['weights_00000'] = np.tile(host['weights_00000'],
                                    (1, mesh.devices.size))
    return host, dict(host, weights_00000=jax.device_put(
        host['weights_00000'], split))

  store = checkpoints.CheckpointStore(str(tmp_path), sharded=True)
  for step in (1, 2):
    store.save(step, arrays(step)[1], {'batches_consumed': step})
  for path in _files(tmp_path / checkpoints.CHECKPOINTS / '2' / 'arrays'):
    if os.path.basename(os.path.dirname(path)) == 'd':
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)
  wanted = {k: (v.shape, v.dtype, split if k == 'weights_00000' else
                jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
            for k, v in arrays(0)[0].items()}
  step, restored, _ = checkpoints.CheckpointStore(
      str(tmp_path), sharded=True).restore(wanted)
  assert step == 1
  assert restored['weights_00000'].sharding == split
  _assert_arrays_equal({k: np.asarray(v) for k, v in restored.items()},
                       arrays(1)[0])
  assert 'Checkpoint step 2 in ' in capsys.readouterr().err
