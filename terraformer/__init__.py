"""Scaling Transformers and the Terraformer as Trax 1.4.1 combinators."""
from terraformer import runtime as _runtime

_runtime.install()  # Quiet imports of Trax/TF/Gym; Trax's fixes on its import.
