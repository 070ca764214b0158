"""The gated delta rule (Gated DeltaNet, Qwen3-Next's linear-attention layers): arguments and outputs.

Math (HF transformers' `torch_recurrent_gated_delta_rule`, Qwen3-Next), per value head h, which
reads key head h // (HV // HK) (GQA-style: consecutive value heads share a query/key head):

    q_t, k_t  = l2norm(q_t), l2norm(k_t)        (x / sqrt(sum x^2 + 1e-6); optional, on in Qwen3-Next)
    q_t       = scale * q_t                      (scale: K^-0.5 by default)
    S         = exp(g_t) * S                     S: (K, V) fp32, g_t <= 0 the log decay
    S         = S + k_t (outer) beta_t (v_t - S^T k_t)     (the delta rule: write only the correction)
    o_t       = S^T q_t

q/k (T, HK, K), v (T, HV, V), g/beta (T, HV). Batches and `capture_offsets` are packed as in
`kernels.contracts.varlen`; the state captured at offset o is S after tokens [0, o). The scan
returns `GatedDeltaOutput`; the decode step takes one token a sequence and updates
`state_pool[slot_idx]` in place.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from kernels.checks import require
from kernels.contracts.tensors import INDEX_DTYPES, check_tensor
from kernels.contracts.varlen import check_capture_offsets, check_seqlens, check_slot_idx

L2NORM_EPS = 1e-6  # FLA's and HF's l2norm: x * rsqrt(sum x^2 + eps)


class GatedDeltaOutput(NamedTuple):
    o: torch.Tensor  # (T, HV, V), v's dtype
    final_states: torch.Tensor  # (S, HV, K, V) fp32
    captured_states: torch.Tensor  # (C, HV, K, V) fp32, packed by sequence then offset


def check_gated_delta_inputs(q, k, v, g, beta):
    """q/k (L, HK, K), v (L, HV, V) of q's dtype, g/beta (L, HV), HK dividing HV; returns L, HK, HV, K, V."""
    check_tensor("q", q, (None, None, None))
    L, HK, K = q.shape
    dev = q.device
    check_tensor("k", k, (L, HK, K), (q.dtype,), dev)
    check_tensor("v", v, (L, None, None), (q.dtype,), dev)
    HV, V = v.shape[1], v.shape[2]
    require(HK >= 1 and HV % HK == 0, "v", f"value heads HV={HV} must be a multiple of the key heads HK={HK}")
    require(K >= 1 and V >= 1, "q", f"head dims must be >= 1, got K={K}, V={V}")
    check_tensor("g", g, (L, HV), device=dev)
    check_tensor("beta", beta, (L, HV), device=dev)
    return L, HK, HV, K, V


def check_scale(scale, K: int) -> float:
    """None (K^-0.5) or a finite positive float."""
    if scale is None:
        return K ** -0.5
    require(isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale > 0,
            "scale", f"must be a finite float > 0 or None, got {scale!r}")
    return float(scale)


def check_gated_delta_args(q, k, v, g, beta, cu_seqlens, initial_states, capture_offsets, scale, seqlens=None):
    """All checks of the varlen scan; returns (seqlens, offsets, scale)."""
    T, HK, HV, K, V = check_gated_delta_inputs(q, k, v, g, beta)
    seqlens = check_seqlens(cu_seqlens, T, q.device, seqlens)
    if initial_states is not None:
        check_tensor("initial_states", initial_states, (len(seqlens), HV, K, V), (torch.float32,), q.device)
    offsets = check_capture_offsets(capture_offsets, seqlens)
    return seqlens, offsets, check_scale(scale, K)


def check_gated_delta_decode_args(q, k, v, g, beta, state_pool, slot_idx, scale, slots_checked=True,
                                  pad_slots=False) -> float:
    """All checks of the decode step (one token a sequence); returns the scale."""
    S, HK, HV, K, V = check_gated_delta_inputs(q, k, v, g, beta)
    check_tensor("state_pool", state_pool, (None, HV, K, V), (torch.float32,), q.device)
    check_tensor("slot_idx", slot_idx, (S,), INDEX_DTYPES, q.device)
    if slots_checked:
        check_slot_idx(slot_idx, state_pool.shape[0], S, pad_slots)
    return check_scale(scale, K)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """Over the last dim, in x's dtype (the callers pass fp32 or fp64)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)
