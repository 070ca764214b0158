"""Triton kernels (paged attention, Mamba-2 SSD scan, causal conv1d) and their PyTorch references.

Kernel files follow one layout: `@triton.jit` kernel(s), a launcher that checks shapes and
launches, then the public function. Plain fp32 PyTorch references live in `kernels.reference`.
"""
