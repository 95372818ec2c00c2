"""Evaluation: ROUGE on summaries, the OOD harness, TensorBoard exports."""


def __getattr__(name):
  """A name of the module terraformer/evaluation.py, a package since issue 24."""
  raise AttributeError(
      f'terraformer.evaluation has no {name!r}: terraformer/evaluation.py is '
      f'terraformer.evaluation.rouge since issue 24')
