"""Rotary position embedding on the first `rotary_dim` channels of each head (Bamba: half of them;
Granite: all).

cos/sin are computed from absolute positions on every call, in fp32 and in the same order of
operations as transformers, so a token gets bit-identical angles whether it is prefilled in one
pass or in chunks (the chunked == whole tests rely on it).
"""

from __future__ import annotations

import torch


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype: torch.dtype):
    """positions (T,) int -> cos, sin (T, rotary_dim) in `dtype`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, head_dim); rotates x[..., :rotary_dim] by position, the rest passes through."""
    rotary_dim = cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    rot = rot * cos[:, None, :] + rotated_half * sin[:, None, :]
    return rot if rotary_dim == x.shape[-1] else torch.cat((rot, rest), dim=-1)
