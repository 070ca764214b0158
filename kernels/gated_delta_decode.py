"""Gated delta rule single-token decode step: the recurrence for one token per sequence, in place.

    S = exp(g) S ;  S += k (outer) beta (v - S^T k) ;  o = S^T (scale q)      (per value head, fp32 S)

with q and k L2-normalised (optional). The state lives in a pool `(num_slots, HV, K, V)` fp32;
sequence s owns `state_pool[slot_idx[s]]`. One program per (sequence, value head, BLOCK_V columns
of the state): the delta rule reads a whole state column (S^T k sums over K), so a program holds
the full K rows of its columns, reads that (K, BLOCK_V) slice once and writes it once.
Bandwidth-bound: 2 x HV x K x V x 4 bytes a sequence (4 MB at Qwen3-Next's HV=32, K=V=128).

A slot of -1 is a pad row (a CUDA-graph batch bucket filled up): it reads and writes no state (it
loads zeros, stores nothing); its o is a step from a zero state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import debug_checks, require
from kernels.contracts.gated_delta import L2NORM_EPS, check_gated_delta_decode_args
from kernels.variants import KernelVariant, aligned_args

__all__ = ["gated_delta_decode_step"]

_EPS = tl.constexpr(L2NORM_EPS)


@triton.jit
def _gdn_decode_kernel(
    # pointers
    q, k, v, g, beta, state_pool, slot_idx, o,
    # sizes
    HV, K, V, HEADS_PER_KEY, scale,
    # strides
    stride_q_s, stride_q_h, stride_q_d, stride_k_s, stride_k_h, stride_k_d, stride_v_s, stride_v_h, stride_v_d,
    stride_g_s, stride_g_h, stride_beta_s, stride_beta_h,
    # meta
    BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, L2NORM: tl.constexpr,
):
    i_s, i_h, i_v = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_kh = i_h // HEADS_PER_KEY
    o_k = tl.arange(0, BLOCK_K)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_k, m_v = o_k < K, o_v < V

    b_q = tl.load(q + i_s * stride_q_s + i_kh * stride_q_h + o_k * stride_q_d, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + i_s * stride_k_s + i_kh * stride_k_h + o_k * stride_k_d, mask=m_k, other=0.0).to(tl.float32)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=0) + _EPS)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=0) + _EPS)
    b_q = b_q * scale
    b_v = tl.load(v + i_s * stride_v_s + i_h * stride_v_h + o_v * stride_v_d, mask=m_v, other=0.0).to(tl.float32)
    b_g = tl.load(g + i_s * stride_g_s + i_h * stride_g_h).to(tl.float32)
    b_beta = tl.load(beta + i_s * stride_beta_s + i_h * stride_beta_h).to(tl.float32)

    slot = tl.load(slot_idx + i_s).to(tl.int64)
    m_st = m_k[:, None] & m_v[None, :] & ((o_v[None, :] * 0 + slot) >= 0)  # a pad row (-1) touches no state
    p_st = state_pool + (tl.maximum(slot, 0) * HV + i_h) * K * V + o_k[:, None] * V + o_v[None, :]
    b_st = tl.load(p_st, mask=m_st, other=0.0) * tl.exp(b_g)
    b_delta = b_beta * (b_v - tl.sum(b_st * b_k[:, None], axis=0))
    b_st += b_k[:, None] * b_delta[None, :]
    tl.store(p_st, b_st, mask=m_st)
    b_o = tl.sum(b_st * b_q[:, None], axis=0)
    tl.store(o + (i_s * HV + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)


def _empty(shape, dtype, device) -> torch.Tensor:
    """The output buffer; tests swap in a NaN-filled one."""
    return torch.empty(shape, dtype=dtype, device=device)


NUM_WARPS = 4


def _config(K: int, V: int) -> tuple[int, int]:
    block_k = triton.next_power_of_2(K)
    block_v = max(1, min(triton.next_power_of_2(V), 4096 // block_k))  # 4096 fp32 a program: 32 a thread
    return block_k, block_v


def gated_delta_decode_step(
    q, k, v, g, beta, *, state_pool, slot_idx, scale=None, use_qk_l2norm=True, check_slots: bool = True,
    pad_slots: bool = False,
) -> torch.Tensor:
    """q/k (S, HK, K), v (S, HV, V), g/beta (S, HV); state_pool (num_slots, HV, K, V) fp32 updated in
    place at slot_idx (S,). Returns o (S, HV, V) in v's dtype. `check_slots=False` skips the host
    read of slot_idx (range and uniqueness) unless the debug switch is on: for callers that checked
    the slots on the host (the model step, a CUDA graph). `pad_slots`: -1 marks a pad row."""
    scale = check_gated_delta_decode_args(q, k, v, g, beta, state_pool, slot_idx, scale,
                                          check_slots or debug_checks(), pad_slots)
    S, HK, K = q.shape
    HV, V = v.shape[1:]
    require(state_pool.is_contiguous(), "state_pool", "must be contiguous (updated in place)")
    out = _empty((S, HV, V), v.dtype, v.device)
    if S == 0:
        return out
    block_k, block_v = _config(K, V)
    _gdn_decode_kernel[(S, HV, triton.cdiv(V, block_v))](
        q, k, v, g, beta, state_pool, slot_idx, out,
        HV, K, V, HV // HK, scale,
        *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
        BLOCK_K=block_k, BLOCK_V=block_v, L2NORM=bool(use_qk_l2norm), num_warps=NUM_WARPS,
    )
    return out


_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def compile_variants() -> list[KernelVariant]:
    """Qwen3-Next's K = V = 128 (and 64, 64), g and beta fp32, each for sm_90 and sm_80."""
    variants = []
    fn = _gdn_decode_kernel
    for dtype, td in _TRITON_DTYPE.items():
        for K, V in ((128, 128), (64, 64)):
            block_k, block_v = _config(K, V)
            consts = dict(stride_q_d=1, stride_k_d=1, stride_v_d=1, BLOCK_K=block_k, BLOCK_V=block_v, L2NORM=True)
            types = {a: f"*{td}" for a in ("q", "k", "v", "o")}
            types.update(g="*fp32", beta="*fp32", state_pool="*fp32", slot_idx="*i32", scale="fp32")
            sig = {a: "constexpr" if a in consts else types.get(a, "i32") for a in fn.arg_names}
            variants.append(KernelVariant(f"gated_delta/decode/{td}/k{K}v{V}", fn, sig, consts, num_warps=NUM_WARPS,
                                          divisible_by_16=aligned_args(fn, sig, consts)))
    return variants
