"""Fixtures of the kernel tests."""
import pytest

from terraformer import kernels


@pytest.fixture
def split_every_product():
  """Splits every product over the thread pool; restores the threshold."""
  before = kernels.set_parallel_bytes()
  kernels.set_parallel_bytes(0)
  yield
  kernels.set_parallel_bytes(before)
