"""SGLang's snapshot placement (`sglang`).

Source: the project brief's facts (sections 4 and 6) on SGLang's MambaRadixCache; not checked
against SGLang's source.
"""

from __future__ import annotations

from planner.policies.aligned import last_block_boundary
from planner.policies.base import PlacementPolicy, PlanContext


def sglang_grid(ctx: PlanContext) -> int:
    """SGLang's state grid: the SSD kernel chunk, or the page (KV block) when that is larger."""
    return max(ctx.kernel_chunk, ctx.block_size)


class SGLang(PlacementPolicy):
    """SGLang MambaRadixCache per the brief (not checked against its source): a state only on the
    grid max(kernel chunk, page), at the last grid point under the prompt end (the kernel's chunk
    states lie on that grid, so no stop) and at grid-aligned chunk ends; the match is capped at
    n-1; at finish the state at the last grid point decoded (decode_grid='kernel')."""

    name = "sglang"
    decode_grid = "kernel"
    mark_mode = "capture"

    def saves_snapshot(self, end: int, total: int, ctx: PlanContext) -> bool:
        return end % sglang_grid(ctx) == 0

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """The last grid point under the prompt end, when the restore point is below it."""
        tail = last_block_boundary(total, sglang_grid(ctx))
        return (tail,) if tail > restore_at else ()
