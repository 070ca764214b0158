"""Tolerances and helpers shared by the kernel tests and the benchmarks' correctness gates.

Tolerances are stated once, per *input* dtype, for a kernel that accumulates in fp32 and is
compared with an fp32 PyTorch reference. They sit where vLLM's and flash-linear-attention's
kernel tests sit (fp32 about 5e-4/1e-3, bf16 about 1e-2/5e-2): the gap comes from rounding
the inputs and the output, not from the accumulation.
"""

from __future__ import annotations

import torch

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"rtol": 5e-4, "atol": 1e-3},
    torch.float16: {"rtol": 5e-3, "atol": 1e-2},
    torch.bfloat16: {"rtol": 1e-2, "atol": 5e-2},
}


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return TOLERANCES[dtype]


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, msg: str = "") -> None:
    """Compare in fp32 with the tolerance of the kernel's input `dtype`; NaN never passes."""
    assert actual.shape == expected.shape, f"{msg}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.float(), expected.float()
    assert not torch.isnan(a).any(), f"{msg}: output has NaN (an element left unwritten?)"
    torch.testing.assert_close(a, e, **tolerance(dtype), msg=lambda m: f"{msg}: {m}" if msg else m)


def nan_filled(shape, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """An output buffer poisoned with NaN, so an element the kernel never writes fails the test."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)
