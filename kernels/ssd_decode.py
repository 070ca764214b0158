"""Mamba-2 single-token decode step: the SSD recurrence for one token per sequence, in place.

    state = exp(dt' A) state + dt' x (outer) B ;  y = state . C + D x      (per head, fp32 state)

The state lives in a pool `(num_slots, H, P, N)` fp32; sequence s owns `state_pool[slot_idx[s]]`.
One program per (sequence, head, BLOCK_P rows of P): it reads its (BLOCK_P, N) slice of the state
once and writes it once; bandwidth-bound (2 x H x P x N x 4 bytes a sequence: 8 MB at H=128,
P=64, N=128), so the tile only needs enough rows to keep loads wide.

A slot of -1 is a pad row (a CUDA-graph batch bucket filled up): its program reads and writes no
state (it loads zeros, stores nothing): its y is a step from a zero state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import debug_checks, require
from kernels.contracts.ssd import NO_LIMIT, check_ssd_decode_args
from kernels.variants import KernelVariant, aligned_args

__all__ = ["ssd_decode_step"]


@triton.jit
def _ssd_decode_kernel(
    # pointers
    x, dt, A, B, C, D, dt_bias, state_pool, slot_idx, y,
    # sizes
    H, P, N, HEADS_PER_GROUP, dt_min, dt_max,
    # strides
    stride_x_s, stride_x_h, stride_x_p, stride_dt_s, stride_dt_h,
    stride_b_s, stride_b_g, stride_b_n, stride_c_s, stride_c_g, stride_c_n,
    # meta
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_D: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr,
):
    i_s, i_h, i_p = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_g = i_h // HEADS_PER_GROUP
    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = tl.arange(0, BLOCK_N)
    m_p, m_n = o_p < P, o_n < N
    m_pn = m_p[:, None] & m_n[None, :]

    b_dt = tl.load(dt + i_s * stride_dt_s + i_h * stride_dt_h).to(tl.float32)
    if HAS_BIAS:
        b_dt += tl.load(dt_bias + i_h).to(tl.float32)
    if SOFTPLUS:
        b_dt = tl.where(b_dt <= 20.0, tl.log(1.0 + tl.exp(b_dt)), b_dt)
    if HAS_LIMIT:
        b_dt = tl.minimum(tl.maximum(b_dt, dt_min), dt_max)
    b_decay = tl.exp(b_dt * tl.load(A + i_h).to(tl.float32))

    b_x = tl.load(x + i_s * stride_x_s + i_h * stride_x_h + o_p * stride_x_p, mask=m_p, other=0.0).to(tl.float32)
    b_b = tl.load(B + i_s * stride_b_s + i_g * stride_b_g + o_n * stride_b_n, mask=m_n, other=0.0).to(tl.float32)
    b_c = tl.load(C + i_s * stride_c_s + i_g * stride_c_g + o_n * stride_c_n, mask=m_n, other=0.0).to(tl.float32)

    slot = tl.load(slot_idx + i_s).to(tl.int64)
    m_st = m_pn & ((o_n[None, :] * 0 + slot) >= 0)  # a pad row (-1) touches no state (broadcast: the interpreter needs it)
    p_st = state_pool + (tl.maximum(slot, 0) * H + i_h) * P * N + o_p[:, None] * N + o_n[None, :]
    b_st = tl.load(p_st, mask=m_st, other=0.0)
    b_st = b_decay * b_st + (b_dt * b_x)[:, None] * b_b[None, :]
    tl.store(p_st, b_st, mask=m_st)

    b_y = tl.sum(b_st * b_c[None, :], axis=1)
    if HAS_D:
        b_y += tl.load(D + i_h).to(tl.float32) * b_x
    tl.store(y + (i_s * H + i_h) * P + o_p, b_y.to(y.dtype.element_ty), mask=m_p)


def _empty(shape, dtype, device) -> torch.Tensor:
    """The output buffer; tests swap in a NaN-filled one."""
    return torch.empty(shape, dtype=dtype, device=device)


# 8 warps: 16 state values a thread. At 4 the aligned (16-byte vectorized) build of the fp32
# P=64 x N=64 tile sat at 64 registers and spilled 8 B on sm_90 (the compile check, 3 stages).
NUM_WARPS = 8


def _config(P: int, N: int) -> tuple[int, int]:
    block_n = triton.next_power_of_2(N)
    block_p = max(1, min(triton.next_power_of_2(P), 4096 // block_n))  # 4096 fp32 a program: 32 regs/thread
    return block_p, block_n


def ssd_decode_step(
    x, dt, A, B, C, *, state_pool, slot_idx, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    check_slots: bool = True, pad_slots: bool = False,
) -> torch.Tensor:
    """x (S, H, P), dt (S, H), A (H,), B/C (S, G, N); state_pool (num_slots, H, P, N) fp32 updated in
    place at slot_idx (S,). Returns y (S, H, P) in x's dtype. `check_slots=False` skips the host
    read of slot_idx (range and uniqueness) unless the debug switch is on: for callers that checked
    the slots on the host (the model step, a CUDA graph). `pad_slots`: -1 marks a pad row."""
    limit = check_ssd_decode_args(x, dt, A, B, C, state_pool, slot_idx, D, dt_bias, dt_limit,
                                  check_slots or debug_checks(), pad_slots)
    S, H, P = x.shape
    G, N = B.shape[1:]
    require(state_pool.is_contiguous(), "state_pool", "must be contiguous (updated in place)")
    y = _empty((S, H, P), x.dtype, x.device)
    if S == 0:
        return y
    block_p, block_n = _config(P, N)
    _ssd_decode_kernel[(S, H, triton.cdiv(P, block_p))](
        x, dt, A, B, C, D, dt_bias, state_pool, slot_idx, y,
        H, P, N, H // G, limit[0], limit[1],
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
        BLOCK_P=block_p, BLOCK_N=block_n,
        HAS_D=D is not None, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
        HAS_LIMIT=tuple(limit) != NO_LIMIT, num_warps=NUM_WARPS,
    )
    return y


_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def compile_variants() -> list[KernelVariant]:
    variants = []
    fn = _ssd_decode_kernel
    for dtype, td in _TRITON_DTYPE.items():
        for N in (64, 128):
            block_p, block_n = _config(64, N)
            consts = dict(stride_x_p=1, stride_b_n=1, stride_c_n=1, BLOCK_P=block_p, BLOCK_N=block_n,
                          HAS_D=True, HAS_BIAS=True, SOFTPLUS=True, HAS_LIMIT=True)
            types = {a: f"*{td}" for a in ("x", "dt", "B", "C", "y")}
            types.update({a: "*fp32" for a in ("A", "D", "dt_bias", "state_pool")})
            types.update(slot_idx="*i32", dt_min="fp32", dt_max="fp32")
            sig = {a: "constexpr" if a in consts else types.get(a, "i32") for a in fn.arg_names}
            variants.append(KernelVariant(f"ssm/ssd_decode/{td}/p64/n{N}", fn, sig, consts, num_warps=NUM_WARPS,
                                          divisible_by_16=aligned_args(fn, sig, consts)))
    return variants
