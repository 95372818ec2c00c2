"""Bridges to Trax 1.4.1: fixes for current JAX, import of its checkpoints."""
