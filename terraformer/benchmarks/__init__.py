"""Benchmarks: decode speed, long-input memory/time, the top-k operator, parameter counts."""
