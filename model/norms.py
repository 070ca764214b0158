"""RMSNorm and the Mamba-2 mixer's gated, grouped RMSNorm, computed in fp32 as transformers' Bamba
and NemotronH do."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """`weight_in_fp32`: weight * normalized x in fp32, rounded once to x's dtype (NemotronH);
    otherwise the normalized x is rounded first and multiplied in the weight's dtype (Bamba).
    `zero_centred` (Qwen3-Next): the stored weight is an offset from 1, x_normed * (1 + w) in fp32."""

    def __init__(self, hidden_size: int, eps: float, weight_in_fp32: bool = False, zero_centred: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size) if zero_centred else torch.ones(hidden_size))
        self.eps = eps
        self.weight_in_fp32 = weight_in_fp32
        self.zero_centred = zero_centred

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.zero_centred:
            return (x32 * (1.0 + self.weight.float())).to(x.dtype)
        if self.weight_in_fp32:
            return (self.weight.float() * x32).to(x.dtype)
        return self.weight * x32.to(x.dtype)


class GatedRMSNorm(nn.Module):
    """norm(y * silu(gate)) with the statistics taken per group of `group_size` channels.

    Bamba normalizes each of the `n_groups` slices of the inner dimension on its own (the
    slices that share one B/C group), so with n_groups > 1 this is not a plain RMSNorm.
    """

    def __init__(self, hidden_size: int, group_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.group_size = group_size
        self.eps = eps

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        in_dtype = y.dtype
        # the same products as y.float() * silu(gate.float()) ... * weight, made in place on the
        # one fp32 buffer silu writes (autograd aside): no (T, d_inner) temporary per step
        if torch.is_grad_enabled() and (y.requires_grad or gate.requires_grad or self.weight.requires_grad):
            y32 = y.float() * F.silu(gate.float())
            grouped = y32.view(*y32.shape[:-1], -1, self.group_size)
            grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * grouped.view(y32.shape).to(in_dtype)
        y32 = F.silu(gate.float()).mul_(y)
        grouped = y32.view(*y32.shape[:-1], -1, self.group_size)
        grouped.mul_(torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps))
        if in_dtype == torch.float32 and self.weight.dtype == torch.float32:
            return y32.mul_(self.weight)
        return self.weight * y32.to(in_dtype)
