"""Scaling Transformers and the Terraformer as Trax 1.4.1 combinators."""
from terraformer import runtime as _runtime

# The release (CHANGELOG.md, CITATION.cff). setup.py reads this line as text,
# without importing the package.
__version__ = '0.1.0'

_runtime.install()  # Quiet imports of Trax/TF/Gym; Trax's fixes on its import.
