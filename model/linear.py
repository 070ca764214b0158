"""Linear layers that keep bf16/fp16 matmuls fast on a CPU without half-precision matmul units.

On a CPU without AVX512-BF16 or AMX (this project's 2-core machine), PyTorch's bf16 matmul runs a
generic kernel: (2048 x 256) @ (256 x 1024) took 963 ms in bf16 and 15 ms as the same product in
fp32 with both casts included, one thread. So a half-precision product on the CPU is computed as
an fp32 product of the upcast operands and rounded back once: the products of two bf16 values are
exact in fp32 and the sum accumulates in fp32, which is what a bf16 GEMM with fp32 accumulation
(oneDNN's, cuBLAS's) computes, up to summation order. At one row (a decode step) both take the same
time (0.18 ms for a 2048 x 256 weight). On a GPU, or in fp32, `linear` is `F.linear`.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

_HALF = (torch.bfloat16, torch.float16)
_upcast = [True]  # False inside `native_half_matmuls`


@contextlib.contextmanager
def native_half_matmuls() -> Iterator[None]:
    """PyTorch's own half-precision CPU matmul inside the block (a comparison with another
    implementation bit for bit needs the same kernel on both sides)."""
    _upcast.append(False)
    try:
        yield
    finally:
        _upcast.pop()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, with a half-precision product on the CPU computed in fp32 (module docstring)."""
    if _upcast[-1] and x.device.type == "cpu" and x.dtype in _HALF and weight.dtype == x.dtype:
        out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(x.dtype)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict keys) whose product is `linear`'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
