"""Write a chunk's new K/V into the paged cache through its slot mapping.

Cache layout ``(num_blocks, block_size, num_kv_heads, head_dim)``, contiguous; token ``t`` goes to
slot ``slot_mapping[t] = block_id * block_size + offset`` (-1: skip, its KV already sits in a shared
cached block). One program copies one token's ``(BLOCK_H, head_dim)`` heads of K and of V: a token's
heads are one contiguous run of ``num_kv_heads * head_dim`` elements in the cache, so the stores
are full-width (8 KV heads x 128 x 2 B = 2 KiB a token in bf16).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.checks import debug_checks
from kernels.contracts.paged_attention import check_kv_cache_write_args
from kernels.variants import KernelVariant

# Elements of one (BLOCK_H, HEAD_DIM_PAD) tile: 2048 keeps a program at 16 values a thread
# (4 warps) for K and V together, with no loop.
_TILE_ELEMENTS = 2048
_NUM_WARPS = 4


@triton.jit
def kv_cache_write_kernel(
    # pointers
    key, value, key_cache, value_cache, slot_mapping,
    # sizes
    num_kv_heads, head_dim,
    # strides (elements)
    stride_k_t, stride_k_h, stride_v_t, stride_v_h, stride_c_slot, stride_c_h,
    # meta
    BLOCK_H: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_hb = tl.program_id(1).to(tl.int64)
    slot = tl.load(slot_mapping + i_t).to(tl.int64)
    if slot < 0:
        return
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = tl.arange(0, HEAD_DIM_PAD)
    m_hd = (o_h < num_kv_heads)[:, None] & (o_d < head_dim)[None, :]
    # The cache is contiguous, so a slot is one row of num_kv_heads * head_dim elements.
    p_c = slot * stride_c_slot + o_h[:, None] * stride_c_h + o_d[None, :]
    b_k = tl.load(key + i_t * stride_k_t + o_h[:, None] * stride_k_h + o_d[None, :], mask=m_hd)
    b_v = tl.load(value + i_t * stride_v_t + o_h[:, None] * stride_v_h + o_d[None, :], mask=m_hd)
    tl.store(key_cache + p_c, b_k, mask=m_hd)
    tl.store(value_cache + p_c, b_v, mask=m_hd)


def _tile(num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    head_dim_pad = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(num_kv_heads), max(1, _TILE_ELEMENTS // head_dim_pad))
    return block_h, head_dim_pad


def _check_layout(key, value, key_cache, value_cache) -> None:
    """Limits of this kernel beyond `check_kv_cache_write_args`."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if key.device.type != "cuda" and not interpreted:
        raise ValueError(f"write_kv_cache needs CUDA tensors (or TRITON_INTERPRET=1), got device {key.device}")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key and value need unit stride along head_dim")
    head_dim = key_cache.shape[-1]
    if not 1 <= head_dim <= 256:
        raise ValueError(f"head_dim must be in 1..256, got {head_dim}")


def _launch(key, value, key_cache, value_cache, slot_mapping, check_slots: bool = True) -> None:
    check_kv_cache_write_args(key, value, key_cache, value_cache, slot_mapping, check_slots or debug_checks())
    _check_layout(key, value, key_cache, value_cache)
    num_tokens = key.shape[0]
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    if num_tokens == 0:
        return
    block_h, head_dim_pad = _tile(num_kv_heads, head_dim)
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    kv_cache_write_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping,
        num_kv_heads, head_dim,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(1), key_cache.stride(2),
        BLOCK_H=block_h, HEAD_DIM_PAD=head_dim_pad, num_warps=_NUM_WARPS,
    )


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_slots: bool = True,
) -> None:
    """Write K/V of ``T`` tokens into the paged cache, in place.

    key, value ``(T, num_kv_heads, head_dim)``; key_cache, value_cache
    ``(num_blocks, block_size, num_kv_heads, head_dim)`` contiguous, same dtype; slot_mapping ``(T,)``
    int32/int64 with ``slot = block_id * block_size + offset`` or -1 to skip the token.
    Raises `ValueError` before writing anything when an argument is out of range. `check_slots=False`
    skips the host read of the slot range (one sync) unless the debug switch is on: for callers that
    built the slots on the host and checked them there (the model step).
    """
    _launch(key, value, key_cache, value_cache, slot_mapping, check_slots)


def compile_variants():
    """The model's KV shapes (bamba-9b 8 x 128, small 1 x 64, tiny 2 x 16) and 8 x 80 (masked)."""
    variants = []
    for dtype, num_kv_heads, head_dim in (("bf16", 8, 128), ("fp16", 8, 128), ("fp32", 8, 128), ("bf16", 1, 64),
                                          ("fp32", 1, 64), ("bf16", 8, 80), ("fp32", 2, 16)):
        tt = f"*{dtype}"
        block_h, head_dim_pad = _tile(num_kv_heads, head_dim)
        variants.append(KernelVariant(
            name=f"kv_cache_write/{dtype}/d{head_dim}/h{num_kv_heads}",
            fn=kv_cache_write_kernel,
            signature={
                "key": tt, "value": tt, "key_cache": tt, "value_cache": tt, "slot_mapping": "*i32",
                "num_kv_heads": "i32", "head_dim": "i32",
                "stride_k_t": "i32", "stride_k_h": "i32", "stride_v_t": "i32", "stride_v_h": "i32",
                "stride_c_slot": "i32", "stride_c_h": "i32",
                "BLOCK_H": "constexpr", "HEAD_DIM_PAD": "constexpr",
            },
            constexprs={"BLOCK_H": block_h, "HEAD_DIM_PAD": head_dim_pad},
            num_warps=_NUM_WARPS,
            divisible_by_16=("key", "value", "key_cache", "value_cache", "stride_k_t", "stride_k_h",
                             "stride_v_t", "stride_v_h", "stride_c_slot", "stride_c_h"),
        ))
    return variants
