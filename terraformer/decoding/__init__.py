"""Decoding: the jitted one-token step; greedy, sampling and beam search."""
