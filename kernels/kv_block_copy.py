"""Copy-on-write for token-granular prefix caching: the first rows of shared KV blocks into private ones.

When a request's cached prefix ends inside a block another sequence holds, the engine gives it a
fresh block and copies the shared block's first ``n`` token rows into it (K and V); the request
then writes the rest. Cache layout ``(num_blocks, block_size, num_kv_heads, head_dim)``,
contiguous: a block's rows are one run of ``block_size * num_kv_heads * head_dim`` elements, so
rows ``0 .. n - 1`` are its first ``n * num_kv_heads * head_dim`` elements. The grid is copies x
tiles of ``TILE`` elements of a block (a tile spans whole rows or part of one, row = 8 x 128 = 1024
elements at bamba-9b); each program copies its tile of K and of V, masked to the copy's
``num_rows`` read on the device (no host sync), and tiles past ``num_rows`` return at once.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernels.checks import debug_checks
from kernels.contracts.paged_attention import check_kv_block_copy_args
from kernels.variants import KernelVariant

# Elements a program copies per cache: 2048 is 16 a thread at 4 warps (two 16-byte vectors in
# bf16), and an 8 x 128 x 16-row bamba-9b block (16384 elements) is 8 tiles.
_TILE_ELEMENTS = 2048
_NUM_WARPS = 4


@triton.jit
def kv_block_copy_kernel(
    # pointers
    key_cache, value_cache, src_block_ids, dst_block_ids, num_rows,
    # sizes (elements)
    row_elems, stride_c_block,
    # meta
    TILE: tl.constexpr,
):
    i_c = tl.program_id(0)
    start = tl.program_id(1) * TILE  # int32: a block is far under 2^31 elements (16 x 8 x 128 = 16384)
    # Elements of the copied rows from this tile on, capped at the block's end: an unchecked
    # num_rows > block_size (checked only under the debug switch) cannot spill into the next block.
    left = tl.minimum(tl.load(num_rows + i_c) * row_elems, stride_c_block) - start
    if left <= 0:  # this tile lies past the copied rows
        return
    # int64: block id x block elements passes 2^31 at 8192 blocks of 256 x 8 x 128.
    src = tl.load(src_block_ids + i_c).to(tl.int64) * stride_c_block + start
    dst = tl.load(dst_block_ids + i_c).to(tl.int64) * stride_c_block + start
    o = tl.arange(0, TILE)
    m = o < left
    tl.store(key_cache + dst + o, tl.load(key_cache + src + o, mask=m), mask=m)
    tl.store(value_cache + dst + o, tl.load(value_cache + src + o, mask=m), mask=m)


def _tile(block_elems: int) -> int:
    return min(_TILE_ELEMENTS, triton.next_power_of_2(block_elems))


def _check_layout(key_cache) -> None:
    """Limits of this kernel beyond `check_kv_block_copy_args`."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if key_cache.device.type != "cuda" and not interpreted:
        raise ValueError(
            f"copy_kv_block_prefix needs CUDA tensors (or TRITON_INTERPRET=1), got device {key_cache.device}")


def _launch(key_cache, value_cache, src_block_ids, dst_block_ids, num_rows) -> None:
    check_kv_block_copy_args(key_cache, value_cache, src_block_ids, dst_block_ids, num_rows, debug_checks())
    _check_layout(key_cache)
    num_copies = src_block_ids.shape[0]
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    if num_copies == 0:
        return
    block_elems = block_size * num_kv_heads * head_dim
    tile = _tile(block_elems)
    grid = (num_copies, triton.cdiv(block_elems, tile))
    kv_block_copy_kernel[grid](
        key_cache, value_cache, src_block_ids, dst_block_ids, num_rows,
        num_kv_heads * head_dim, key_cache.stride(0),
        TILE=tile, num_warps=_NUM_WARPS,
    )


def copy_kv_block_prefix(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
    num_rows: torch.Tensor,
) -> None:
    """Copy rows ``0 .. num_rows[i] - 1`` of block ``src_block_ids[i]`` into the same rows of block
    ``dst_block_ids[i]``, in K and V, in place; the destination's other rows are untouched.

    key_cache, value_cache ``(num_blocks, block_size, num_kv_heads, head_dim)`` contiguous, same
    dtype; src_block_ids, dst_block_ids, num_rows ``(C,)`` int32/int64 on the caches' device.
    Shapes, dtypes and devices raise `ValueError` before anything is written; the index values
    (ids in range, ``0 <= num_rows <= block_size``, no dst block also a src or written twice) are
    read on the host (one sync) only under the debug switch (`kernels.checks.debug_checks`); without
    it a num_rows over block_size copies the whole block and no further.
    """
    _launch(key_cache, value_cache, src_block_ids, dst_block_ids, num_rows)


def compile_variants():
    """The tiles the model's blocks of 16 launch: bamba-9b 16 x 8 x 128 (and any block of 2048+
    elements) takes 2048, small 16 x 1 x 64 1024, tiny 16 x 2 x 16 512; int32 ids, as
    `ModelRunner.copy_kv_blocks` passes them."""
    variants = []
    for dtype, tile in (("bf16", 2048), ("fp16", 2048), ("fp32", 2048), ("bf16", 1024), ("fp32", 1024),
                        ("fp32", 512)):
        tt = f"*{dtype}"
        variants.append(KernelVariant(
            name=f"kv_block_copy/{dtype}/tile{tile}",
            fn=kv_block_copy_kernel,
            signature={
                "key_cache": tt, "value_cache": tt, "src_block_ids": "*i32", "dst_block_ids": "*i32",
                "num_rows": "*i32", "row_elems": "i32", "stride_c_block": "i32", "TILE": "constexpr",
            },
            constexprs={"TILE": tile},
            num_warps=_NUM_WARPS,
            divisible_by_16=("key_cache", "value_cache", "row_elems", "stride_c_block"),
        ))
    return variants
