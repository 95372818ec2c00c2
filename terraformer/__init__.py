"""Scaling Transformers and the Terraformer as Trax 1.4.1 combinators."""
from terraformer import compat as _compat

_compat.speed_up_trax_import()  # Before anything imports Trax (compat fix 0).
