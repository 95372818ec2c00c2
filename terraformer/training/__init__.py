"""Training: the loop, FSDP, resuming, memory plan, fine-tuning, the soak test."""


def __getattr__(name):
  """A name of the module terraformer/training.py, a package since issue 24."""
  raise AttributeError(
      f'terraformer.training has no {name!r}: terraformer/training.py is '
      f'terraformer.training.loop since issue 24')
