"""Benchmarks: decode speed, long inputs, the top-k operator, parameter counts."""
