"""Hybrid Mamba-2/attention model (Bamba layout) with `torch` and `triton` backends."""
