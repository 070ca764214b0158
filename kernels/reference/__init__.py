"""Plain PyTorch references for the Triton kernels: short, fp32, obviously right."""
