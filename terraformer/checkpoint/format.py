"""The Trax 1.4.1 Loop checkpoint format: `model.pkl.gz`, found, read, written.

One file format serves every reader and writer of this package: training
writes it (`terraformer.checkpoint.store` beside its orbax steps), decoding and
evaluation load it, `train(init_checkpoint=...)` fine-tunes from it and
terraformer-import-trax writes the weights of a Trax model into it. It is
Trax's own Loop format, so Trax reads ours and we read Trax's:

  model.pkl.gz            gzip'd pickle of a dict: `step`, `flat_weights`
                          (the weights tree flattened in Trax's order) and
                          state/slots; `flat_weights` is inline (a list) or,
                          in Trax's newer layout, an int (the compression
                          level) with the arrays in
  model.weights.npy.gz    consecutive `np.save` arrays, gzip'd.

Trax stores bfloat16 arrays bit-cast to uint16 (`_to_bits`): `from_bits` and
`to_bits` convert. Files are written by `atomic_write` (temporary file, fsync,
rename, fsync of the directory): a reader sees the old or the new file.
"""
import gzip
import os
import pickle
import tempfile

import ml_dtypes
import numpy as np

from terraformer import errors

CHECKPOINT = 'model.pkl.gz'
PKL = '.pkl.gz'
TMP = '.tmp-'  # Infix of the temporary files of `atomic_write`.


def fsync(path):
  """Flushes a file or directory to disk."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def atomic_write(path, write):
  """Calls `write(binary file)` on a temporary file, then renames it to `path`.

  `write` may also be bytes. The folder is made if missing; the file is
  fsynced before the rename and the folder after it; on any error the
  temporary file is removed and the error re-raised.
  """
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=folder,
                             prefix=os.path.basename(path) + TMP)
  try:
    with os.fdopen(fd, 'wb') as f:
      if isinstance(write, bytes):
        f.write(write)
      else:
        write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
  fsync(folder)


def from_bits(array):
  """A weight as Trax meant it: uint16 (bit-cast bfloat16) back to bfloat16."""
  array = np.asarray(array)
  if array.dtype == np.uint16:
    return array.view(ml_dtypes.bfloat16)
  return array


def to_bits(array):
  """A weight as Trax stores it: bfloat16 bit-cast to uint16."""
  array = np.asarray(array)
  if array.dtype == ml_dtypes.bfloat16:
    return array.view(np.uint16)
  return array


def checkpoint_file(path, what=None, hint=''):
  """The `model.pkl.gz` of `path`: a directory holding one, or the file.

  `what` names `path` in errors (a flag or gin parameter, e.g.
  'init_checkpoint'); `hint` is added to the error of a directory without a
  checkpoint (e.g. how to make one). Raises TerraformerError if there is no
  such file.
  """
  label = f'{what}: ' if what else ''
  if not path:
    raise errors.TerraformerError(f'{what or "checkpoint"} is required')
  path = os.path.expanduser(path)
  if os.path.isfile(path):
    if not path.endswith(PKL):
      raise errors.TerraformerError(
          f'{label}{path!r} is not a Trax checkpoint (*{PKL} or a directory '
          f'holding {CHECKPOINT})')
    return path
  file = os.path.join(path, CHECKPOINT)
  if os.path.isfile(file):
    return file
  if os.path.isdir(path) or (hint and not path.endswith(PKL)):
    raise errors.TerraformerError(
        f'{label}no checkpoint {CHECKPOINT} in {path}{hint}')
  raise errors.TerraformerError(f'{label}{path!r} not found')


def _read_arrays(path):
  """All arrays of a Trax `.npy.gz` file; raises if it ends mid-array.

  Trax's `np_from_file` stops at the first error, so a truncated file reads
  as a shorter list; here any incomplete array is an error.
  """
  arrays = []
  with gzip.open(path, 'rb') as f:
    while f.peek(1):
      arrays.append(np.load(f, allow_pickle=False))
  return arrays


def read_trax_checkpoint(path):
  """The dict of a Loop `.pkl.gz` checkpoint, `flat_weights` read in full.

  Arrays are as stored (bfloat16 as uint16: see `load_flat_weights`).
  Raises TerraformerError naming the file that is missing, truncated or
  damaged (`path` or its `.weights.npy.gz`).
  """
  part = path
  try:
    with gzip.open(path, 'rb') as f:
      checkpoint = pickle.load(f)
    if not isinstance(checkpoint, dict) or 'flat_weights' not in checkpoint:
      raise ValueError('no flat_weights: not a Trax Loop checkpoint')
    if isinstance(checkpoint['flat_weights'], int):  # Separate file.
      part = path[:-len(PKL)] + '.weights.npy.gz'
      checkpoint['flat_weights'] = _read_arrays(part)
  except FileNotFoundError:
    raise errors.TerraformerError(
        f'checkpoint file {part} is missing') from None
  except (OSError, EOFError, ValueError, pickle.UnpicklingError,
          AttributeError, ImportError, IndexError, TypeError,
          MemoryError) as e:
    raise errors.TerraformerError(
        f'checkpoint file {part} is damaged or truncated '
        f'({type(e).__name__}: {errors.first_line(e, 200)})') from None
  return checkpoint


def load_flat_weights(path, what='checkpoint'):
  """(flat weight arrays, step) of a checkpoint (directory or file).

  The arrays are numpy, bfloat16 restored (`from_bits`); step is None where
  the file has none.
  """
  saved = read_trax_checkpoint(checkpoint_file(path, what))
  return [from_bits(w) for w in saved['flat_weights']], saved.get('step')


def write_trax_checkpoint(path, checkpoint):
  """Writes a Loop checkpoint dict (inline weights) to `path` atomically."""
  def write(f):
    with gzip.GzipFile(fileobj=f, mode='wb', compresslevel=2) as gz:
      pickle.dump(checkpoint, gz, protocol=pickle.HIGHEST_PROTOCOL)
  atomic_write(path, write)
