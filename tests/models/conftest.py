"""The model tests build models from keyword arguments only."""
import gin
import pytest


@pytest.fixture(autouse=True)
def _no_gin_bindings():
  # A binding left by an earlier test file in the same worker (e.g. a gin
  # file's `Terraformer.attention_sparsity`) would fill every keyword the
  # test leaves out.
  gin.clear_config()
  yield
