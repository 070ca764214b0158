"""The `legacy` policy: the seed's engine before the fix (`aligned.py` says what went wrong)."""

from __future__ import annotations

from planner.policies.aligned import last_chunk_capture_offsets
from planner.policies.base import PlacementPolicy, PlanContext, check_chunk_args, check_total_and_block


def plan_chunk_len_legacy(offset: int, total: int, proposed: int, block_size: int) -> int:
    """Legacy policy: every chunk keeps its proposed length."""
    check_chunk_args(offset, total, proposed, block_size)
    return proposed


def is_checkpoint_chunk_end_legacy(end_token: int, total: int, block_size: int, interval: int) -> bool:
    """Legacy policy: every non-last chunk end saves a snapshot, aligned or not (`interval` unused)."""
    check_total_and_block(total, block_size)
    return 0 < end_token < total


class Legacy(PlacementPolicy):
    """The seed's engine before the fix: every chunk keeps its proposed length, every non-last
    chunk end saves a snapshot, and a last chunk spanning the tail split point captures there."""

    name = "legacy"

    def chunk_len(self, offset: int, total: int, proposed: int, ctx: PlanContext) -> int:
        return plan_chunk_len_legacy(offset, total, proposed, ctx.block_size)

    def saves_snapshot(self, end: int, total: int, ctx: PlanContext) -> bool:
        return is_checkpoint_chunk_end_legacy(end, total, ctx.block_size, ctx.interval)

    def last_captures(self, offset: int, length: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return last_chunk_capture_offsets(offset, length, total, ctx.block_size)
