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


@pytest.fixture
def gemv_isa():
  """Sets the Q8 GEMV's instruction set (skips if the CPU lacks it);
  restores the best one afterwards."""
  assert kernels.available(), kernels.unavailable_reason()

  def use(name):
    used = kernels.set_gemv_isa(name)
    if used != name:
      pytest.skip(f'this CPU lacks {name} (the Q8 GEMV uses {used})')

  yield use
  kernels.set_gemv_isa(kernels.GEMV_ISA_NAMES[-1])


@pytest.fixture
def float_isa():
  """Sets the float kernels' instruction set (skips if the CPU lacks it);
  restores the best one afterwards."""
  assert kernels.available(), kernels.unavailable_reason()

  def use(name):
    used = kernels.set_isa(name)
    if used != name:
      pytest.skip(f'this CPU lacks {name} (the float kernels use {used})')

  yield use
  kernels.set_isa(kernels.ISA_NAMES[-1])
