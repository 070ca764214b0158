"""The PyTorch paths the model's `torch` backend runs: vectorized (and, for the SSD scan, chunked)
versions of every op, written for speed on a CPU as well as clarity. Same signatures and argument
checks as the Triton kernels (`kernels.contracts`); tested against the oracles in
`kernels.reference`. They are plain torch, so they run on any device."""
