"""Decoding: the jitted one-token step; greedy, sampling and beam search."""


def __getattr__(name):
  """A name of the module terraformer/decoding.py, a package since issue 24."""
  raise AttributeError(
      f'terraformer.decoding has no {name!r}: terraformer/decoding.py is '
      f'terraformer.decoding.search since issue 24')
