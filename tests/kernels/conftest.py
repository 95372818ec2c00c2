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


def _isa_setter(set_isa, best, what):
  """A fixture's body: `use(name)` sets an instruction set through
  `set_isa` (skips if the CPU lacks it); `best` (the best set this CPU
  has) is restored afterwards."""
  assert kernels.available(), kernels.unavailable_reason()

  def use(name):
    used = set_isa(name)
    if used != name:
      pytest.skip(f'this CPU lacks {name} ({what} uses {used})')

  yield use
  set_isa(best)


@pytest.fixture
def gemv_isa():
  """Sets the Q8 GEMV's instruction set (skips if the CPU lacks it);
  restores the best one afterwards (`kernels.best_gemv_isa`: the last of
  GEMV_ISA_NAMES is the emulated AMX path, which every CPU has)."""
  assert kernels.available(), kernels.unavailable_reason()
  yield from _isa_setter(kernels.set_gemv_isa, kernels.best_gemv_isa(),
                         'the Q8 GEMV')


@pytest.fixture
def float_isa():
  """Sets the float kernels' instruction set (skips if the CPU lacks it);
  restores the best one afterwards."""
  yield from _isa_setter(kernels.set_isa, kernels.ISA_NAMES[-1],
                         'the float kernels')
