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
