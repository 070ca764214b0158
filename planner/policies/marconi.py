"""Marconi's snapshot placement (`marconi`).

Source: Marconi (MLSys 2025, arXiv 2411.19379), per the paper's description; not checked against
its code.
"""

from __future__ import annotations

from planner.policies.base import PlacementPolicy, PlanContext, junction_marks


class Marconi(PlacementPolicy):
    """Marconi (MLSys 2025, arXiv 2411.19379) per the paper's description: admit states only at
    branch points (speculative insertion: the KV match where the request leaves the cached prefix)
    and leaves (the sequence end at finish, block-floored), FLOP-aware eviction. The paper assumes
    the state at a branch point is available; here it costs a chunk stop."""

    name = "marconi"
    decode_grid = "block"
    eviction = "flop_aware"
    mark_mode = "stop"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return junction_marks(kv_match, restore_at, total)
