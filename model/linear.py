"""Linear layers whose CPU product takes the route this machine's capabilities chose.

The routes (`kernels.torch_cpu.capability`, decided once per process and recorded with every
result) pick, on the CPU:
* fp32: oneDNN (`torch.ops.mkldnn._linear_pointwise`) where the start-up probe timed it faster
  than torch's BLAS, else `F.linear`. Both are IEEE fp32 products: oneDNN runs only while torch's
  fp32 matmul precision is "highest", so an fp32 run never meets TF32 or bf16. Below
  `ONEDNN_MIN_ROWS` rows (a decode step) `F.linear` stays: its call costs less (one row of a
  256 x 1024 weight on the EPYC: 19 us against 30 us), where from 16 rows oneDNN leads
  (81 us against 112 us).
* bf16 / fp16: torch's native half-precision GEMM (oneDNN, fp32 accumulation) where the CPU has
  the instructions for it (AVX512-BF16 or AMX; AVX512-FP16 or AMX-FP16), else the fp32 product of
  the upcast operands rounded back once. The latter is exact up to summation order: products of
  two bf16 values are exact in fp32 and the sum accumulates in fp32, as a bf16 GEMM with fp32
  accumulation does. On a CPU without AVX512-BF16 the native bf16 kernel is generic: (2048 x 256)
  @ (256 x 1024) took 963 ms native against 15 ms as fp32 products (AVX2 laptop, one thread).
On a GPU, or with mixed dtypes, `linear` is `F.linear`.

oneDNN builds (JIT-compiles) a kernel for every new row count, and both oneDNN routes, native half
precision and fp32 through oneDNN, pass their rows through `padded_rows`: a product's rows are
padded with zero rows to one of 8 sizes an octave, so row counts repeat and their kernels are
reused. On the Intel Xeon with AMX, one thread, a new row count cost 1.2-1.4 ms in bf16 against
0.09-0.19 ms for the product itself ((300 x 96) @ (96 x 256) and (300 x 256) @ (256 x 192)), and
0.4-0.6 ms in fp32 through oneDNN; a MoE layer's 64 expert products all meet new counts, so a
2K-token granite-small-cpu prefill in bf16 spent more on building kernels than on the products.
MKL's fp32 GEMM builds none (301 rows after 300: 116 us, as cached).

ONE_ROW_MV: a one-row half-precision product (a decode step's) is `torch.mv`, not oneDNN's GEMM,
whose per-call cost dominates there: on the Intel Xeon with AMX, bf16, one thread, weights in
cache, (1 x 256) @ (256 x 2048) 46 against 86 us, (1 x 1024) @ (1024 x 256) 36 against 51 us,
the 16,384-token head 448 against 675 us (fp32's F.linear: 58 / 18 / 634 us).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from kernels.torch_cpu.capability import cpu_routes

ONEDNN_MIN_ROWS = 16
_HALF_ROUTE = {torch.bfloat16: "bf16_matmul", torch.float16: "fp16_matmul"}
_native = [False]  # True inside `native_half_matmuls`


@contextlib.contextmanager
def native_half_matmuls() -> Iterator[None]:
    """PyTorch's own half-precision CPU matmul inside the block, whatever the route (a comparison
    with another implementation bit for bit needs the same kernel on both sides)."""
    _native.append(True)
    try:
        yield
    finally:
        _native.pop()


@functools.cache
def _onednn_fp32_is_ieee() -> bool:
    """oneDNN's own fp32 matmul setting (torch >= 2.9) is IEEE; read once (the property costs ~10 us,
    against ~20 us for a one-row product)."""
    mkldnn_matmul = getattr(torch.backends.mkldnn, "matmul", None)
    return getattr(mkldnn_matmul, "fp32_precision", "none") in ("none", "ieee")


def _fp32_is_ieee() -> bool:
    """Torch's fp32 matmul precision is IEEE fp32 (no TF32, no bf16), globally and for oneDNN."""
    return torch.get_float32_matmul_precision() == "highest" and _onednn_fp32_is_ieee()


EXACT_ROWS = 16  # row counts up to here are used as they are (decode steps: a handful of sizes)


def padded_rows(rows: int) -> int:
    """`rows` rounded up to one of 8 sizes an octave (at most 12.5% more rows; a multiple of
    2^(b-3) for rows in [2^b, 2^(b+1))), or `rows` itself up to `EXACT_ROWS`."""
    if rows <= EXACT_ROWS:
        return rows
    step = 1 << (rows.bit_length() - 4)
    return -(-rows // step) * step


def _rows_padded(product, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """product(x2d, weight, bias) over x's rows padded with zeros to `padded_rows`, the pad dropped."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    padded = padded_rows(rows)
    x2 = x.reshape(rows, width)
    if padded != rows:
        xp = x2.new_empty(padded, width)
        xp[:rows] = x2
        xp[rows:] = 0
        x2 = xp
    return product(x2, weight, bias)[:rows].view(*x.shape[:-1], weight.shape[0])


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _rows_padded(lambda a, w, b: torch.ops.mkldnn._linear_pointwise(a, w, b, "none", [], ""), x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear`, with the CPU product on this machine's route (module docstring)."""
    if x.device.type != "cpu" or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return F.linear(x, weight, bias)
    routes = cpu_routes()
    if x.dtype == torch.float32:
        if (routes.fp32_matmul == "onednn" and x.dim() >= 2 and x.numel() >= ONEDNN_MIN_ROWS * x.shape[-1]
                and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
                and _fp32_is_ieee()):
            return _onednn_linear(x, weight, bias)
        return F.linear(x, weight, bias)
    route = _HALF_ROUTE.get(x.dtype)
    if route is not None and not _native[-1] and getattr(routes, route) == "fp32_products":
        out = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
        return out.to(x.dtype)
    if route is not None and x.dim() >= 2 and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        if x.numel() == x.shape[-1]:  # one row (a decode step): torch's matrix-vector kernel (ONE_ROW_MV)
            v = x.reshape(-1)
            out = torch.mv(weight, v) if bias is None else torch.addmv(bias, weight, v)
            return out.view(*x.shape[:-1], weight.shape[0])
        return _rows_padded(F.linear, x, weight, bias)  # torch's native half GEMM: oneDNN, a kernel per row count
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict keys) whose product is `linear`'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
