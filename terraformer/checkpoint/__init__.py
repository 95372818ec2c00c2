"""Checkpoints: the Trax model.pkl.gz format, and the crash-safe store."""
