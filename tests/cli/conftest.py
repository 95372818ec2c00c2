"""Fixtures shared by the CLI tests."""
import gin
import pytest

from terraformer.cli import common


@pytest.fixture(scope='module', autouse=True)
def _imports_done():
  common.setup()  # Import noise (TF, Gym) stays out of the captured output.


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()  # Leave no bindings to the tests that follow.


# Tiny checkpoints for the decode/eval CLI tests, trained once per session
# (see tiny_checkpoints.py).
@pytest.fixture(scope='session')
def encdec_checkpoint(tmp_path_factory):
  """(run, checkpoint dir, terraformer-train stdout) of a tiny enc-dec."""
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  common.setup()
  out_dir = tmp_path_factory.mktemp('encdec') / 'ckpt'
  stdout = tiny_checkpoints.train(tiny_checkpoints.ENCDEC, out_dir)
  gin.clear_config()
  return tiny_checkpoints.ENCDEC, str(out_dir), stdout


@pytest.fixture(scope='session')
def lm_checkpoint(tmp_path_factory):
  """(run, checkpoint dir, terraformer-train stdout) of a tiny LM."""
  import tiny_checkpoints  # pylint: disable=g-import-not-at-top
  common.setup()
  out_dir = tmp_path_factory.mktemp('lm') / 'ckpt'
  stdout = tiny_checkpoints.train(tiny_checkpoints.LM, out_dir)
  gin.clear_config()
  return tiny_checkpoints.LM, str(out_dir), stdout
