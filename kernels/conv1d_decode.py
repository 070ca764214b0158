"""Causal depthwise conv1d (width 4, optional SiLU) single-token decode step, state updated in place.

    y = act( w_0 s_0 + w_1 s_1 + w_2 s_2 + w_3 x + bias ) ;  state <- (s_1, s_2, x)

The conv state (the last 3 inputs, oldest first) lives in a pool `(num_slots, D, 3)` in x's dtype;
sequence s owns `conv_state_pool[slot_idx[s]]`. One program per (sequence, BLOCK_D channels).
A slot of -1 is a pad row: no state read or written, y computed from a zero state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.checks import debug_checks, require
from kernels.contracts.conv1d import check_conv1d_decode_args
from kernels.variants import KernelVariant, aligned_args

__all__ = ["causal_conv1d_decode_step"]

WIDTH = 4
BLOCK_D = 512  # 4 channels a thread at 4 warps


@triton.jit
def _conv1d_decode_kernel(
    # pointers
    x, weight, bias, conv_state_pool, slot_idx, y,
    # sizes
    D,
    # strides
    stride_x_s, stride_x_d,
    # meta
    W: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    i_s, i_d = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < D
    slot = tl.load(slot_idx + i_s).to(tl.int64)
    m_st = m_d & ((o_d * 0 + slot) >= 0)  # a pad row (-1) touches no state (broadcast: the interpreter needs it)
    p_st = conv_state_pool + tl.maximum(slot, 0) * D * (W - 1) + o_d * (W - 1)
    b_s0 = tl.load(p_st + 0, mask=m_st, other=0.0)
    b_s1 = tl.load(p_st + 1, mask=m_st, other=0.0)
    b_s2 = tl.load(p_st + 2, mask=m_st, other=0.0)
    b_x = tl.load(x + i_s * stride_x_s + o_d * stride_x_d, mask=m_d, other=0.0)

    b_acc = tl.load(weight + o_d * W + 0, mask=m_d, other=0.0).to(tl.float32) * b_s0.to(tl.float32)
    b_acc += tl.load(weight + o_d * W + 1, mask=m_d, other=0.0).to(tl.float32) * b_s1.to(tl.float32)
    b_acc += tl.load(weight + o_d * W + 2, mask=m_d, other=0.0).to(tl.float32) * b_s2.to(tl.float32)
    b_acc += tl.load(weight + o_d * W + 3, mask=m_d, other=0.0).to(tl.float32) * b_x.to(tl.float32)
    if HAS_BIAS:
        b_acc += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    if SILU:
        b_acc = b_acc * tl.sigmoid(b_acc)
    tl.store(y + i_s * D + o_d, b_acc.to(y.dtype.element_ty), mask=m_d)

    tl.store(p_st + 0, b_s1, mask=m_st)
    tl.store(p_st + 1, b_s2, mask=m_st)
    tl.store(p_st + 2, b_x.to(b_s2.dtype), mask=m_st)


def _empty(shape, dtype, device) -> torch.Tensor:
    """The output buffer; tests swap in a NaN-filled one."""
    return torch.empty(shape, dtype=dtype, device=device)


def causal_conv1d_decode_step(
    x, *, conv_state_pool, weight, bias=None, slot_idx, activation="silu", check_slots: bool = True,
    pad_slots: bool = False,
) -> torch.Tensor:
    """x (S, D); conv_state_pool (num_slots, D, 3) in x's dtype, shifted in place at slot_idx (S,);
    weight (D, 4), bias (D,) or None. Returns y (S, D) in x's dtype. `check_slots`, `pad_slots`:
    as in `ssd_decode_step`."""
    check_conv1d_decode_args(x, conv_state_pool, weight, bias, slot_idx, activation,
                             check_slots or debug_checks(), pad_slots)
    S, D = x.shape
    require(weight.shape[1] == WIDTH, "weight", f"the Triton kernel needs width W={WIDTH}, got {weight.shape[1]}")
    require(conv_state_pool.is_contiguous(), "conv_state_pool", "must be contiguous (updated in place)")
    y = _empty((S, D), x.dtype, x.device)
    if S == 0:
        return y
    _conv1d_decode_kernel[(S, triton.cdiv(D, BLOCK_D))](
        x, weight.contiguous(), bias, conv_state_pool, slot_idx, y,
        D,
        x.stride(0), x.stride(1),
        W=WIDTH, BLOCK_D=BLOCK_D, HAS_BIAS=bias is not None, SILU=activation == "silu",
    )
    return y


_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def compile_variants() -> list[KernelVariant]:
    variants = []
    fn = _conv1d_decode_kernel
    for dtype, td in _TRITON_DTYPE.items():
        consts = dict(stride_x_d=1, W=WIDTH, BLOCK_D=BLOCK_D, HAS_BIAS=True, SILU=True)
        types = {a: f"*{td}" for a in ("x", "weight", "bias", "conv_state_pool", "y")}
        types["slot_idx"] = "*i32"
        sig = {a: "constexpr" if a in consts else types.get(a, "i32") for a in fn.arg_names}
        variants.append(KernelVariant(f"ssm/conv1d_decode/{td}/w4", fn, sig, consts, num_warps=4,
                                      divisible_by_16=aligned_args(fn, sig, consts)))
    return variants
