"""Triton kernels (paged attention, Mamba-2 SSD scan, causal conv1d), their oracles and CPU paths.

Kernel files follow one layout: `@triton.jit` kernel(s), a launcher that checks shapes and
launches, then the public function; `compile_variants()` declares what the compile check builds
(`kernels.variants`). Beside them: `contracts/` (argument checks, output types, chunk tables:
what every implementation agrees on), `reference/` (plain fp32 oracles, the executable spec) and
`torch_cpu/` (the fast PyTorch paths the model's `torch` backend runs).
"""
