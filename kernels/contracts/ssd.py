"""The Mamba-2 SSD scan and decode step: arguments, outputs, and dt' (their step size).

Math (Mamba-2 as in HF transformers' Bamba/Mamba2 mixer), per head h in group g = h // (H // G):

    dt'_t    = clamp(softplus(dt_t + dt_bias_h))           (softplus and clamp optional)
    state_t  = exp(dt'_t * A_h) * state_{t-1} + dt'_t * x_t (outer) B_t      state: (P, N), fp32
    y_t      = state_t . C_t + D_h * x_t

Batches are packed as in `kernels.contracts.varlen`. The scan returns `SSDScanOutput`; the decode
step takes one token a sequence and updates `state_pool[slot_idx]` in place.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels.checks import require
from kernels.contracts.tensors import INDEX_DTYPES, check_tensor
from kernels.contracts.varlen import check_capture_offsets, check_seqlens, check_slot_idx

NO_LIMIT = (0.0, float("inf"))


class SSDScanOutput(NamedTuple):
    y: torch.Tensor  # (T, H, P), x's dtype
    final_states: torch.Tensor  # (S, H, P, N) fp32
    captured_states: torch.Tensor  # (K, H, P, N) fp32, packed by sequence then offset


def check_dt_limit(dt_limit) -> tuple[float, float]:
    """A pair lo <= hi (no NaN); returns it as floats."""
    try:
        lo, hi = float(dt_limit[0]), float(dt_limit[1])
    except (TypeError, IndexError, ValueError):
        require(False, "dt_limit", f"expected a pair (lo, hi), got {dt_limit!r}")
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        require(False, "dt_limit", f"expected lo <= hi, got {dt_limit!r}")
    return lo, hi


def check_mixer_inputs(x, dt, A, B, C):
    """x (L, H, P), dt (L, H), A (H,), B/C (L, G, N) with G dividing H; returns L, H, P, G, N."""
    check_tensor("x", x, (None, None, None))
    L, H, P = x.shape
    dev = x.device
    check_tensor("dt", dt, (L, H), device=dev)
    check_tensor("A", A, (H,), device=dev)
    check_tensor("B", B, (L, None, None), (x.dtype,), dev)
    G, N = B.shape[1], B.shape[2]
    check_tensor("C", C, (L, G, N), (x.dtype,), dev)
    require(G >= 1 and H % G == 0, "B", f"group count G={G} must divide the head count H={H}")
    return L, H, P, G, N


def check_ssd_scan_args(x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets,
                        seqlens=None):
    """All checks of `ssd_scan`; returns (seqlens, offsets, (lo, hi)). `seqlens`: host lengths
    from a plan (no read of cu_seqlens, see `check_seqlens`)."""
    T, H, P, G, N = check_mixer_inputs(x, dt, A, B, C)
    dev = x.device
    if D is not None:
        check_tensor("D", D, (H,), device=dev)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, (H,), device=dev)
    limit = check_dt_limit(dt_limit)
    seqlens = check_seqlens(cu_seqlens, T, dev, seqlens)
    S = len(seqlens)
    if initial_states is not None:
        check_tensor("initial_states", initial_states, (S, H, P, N), (torch.float32,), dev)
    offsets = check_capture_offsets(capture_offsets, seqlens)
    return seqlens, offsets, limit


def check_ssd_decode_args(x, dt, A, B, C, state_pool, slot_idx, D, dt_bias, dt_limit, slots_checked=True,
                          pad_slots=False):
    """All checks of `ssd_decode_step`; returns (lo, hi)."""
    S, H, P, G, N = check_mixer_inputs(x, dt, A, B, C)
    dev = x.device
    check_tensor("state_pool", state_pool, (None, H, P, N), (torch.float32,), dev)
    check_tensor("slot_idx", slot_idx, (S,), INDEX_DTYPES, dev)
    if D is not None:
        check_tensor("D", D, (H,), device=dev)
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, (H,), device=dev)
    limit = check_dt_limit(dt_limit)
    if slots_checked:
        check_slot_idx(slot_idx, state_pool.shape[0], S, pad_slots)
    return limit


def process_dt(dt, dt_bias, dt_softplus: bool, limit: tuple[float, float]) -> torch.Tensor:
    """dt' in fp32: bias, softplus, then the clamp (skipped at the default (0, inf), like mamba_ssm)."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if limit != NO_LIMIT:
        dt = dt.clamp(limit[0], limit[1])
    return dt
