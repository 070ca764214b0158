"""Oracles: plain fp32 PyTorch versions of every op, short, sequential where that is clearer, and
obviously right. They are the executable spec: the Triton kernels and the CPU paths
(`kernels.torch_cpu`) are tested against them; no model backend runs them."""
