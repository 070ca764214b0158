"""The offline optimum (`optimum`): a reference no online policy can beat on restores.

Source: this project; the optimum's value as the Sparse Prefix Caching paper (arXiv 2605.05219)
defines it; Belady's MIN for eviction.
"""

from __future__ import annotations

from planner.policies.aligned import Aligned
from planner.policies.base import PlanContext, junction_marks


class Optimum(Aligned):
    """Offline: `aligned`'s chunk rules, the junction captured in-launch and the decode state kept
    at finish (as ours-plus, without its speculative grid), plus a snapshot at every position a
    later request of the trace will match, left by the first request that computes it (the
    request's `snapshot_marks`, set by a driver that knows the trace: experiments.traces.oracle;
    hence `needs_oracle`): captured in-launch inside its prefill, saved by the engine after its
    last chunk at its prompt end or after a decode row inside its reply. With unbounded memory
    that restores every KV match, the most any placement reaches (the Sparse Prefix Caching, arXiv
    2605.05219, optimum's value there); under a budget the driver evicts by next use (Belady's MIN
    with bypass, planner.evictions.next_use.NextUseEviction; LRU when it gives no future): optimal in
    restores for equal-size snapshots, a reference for tokens."""

    name = "optimum"
    decode_grid = "block"
    needs_oracle = True
    mark_mode = "capture"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return junction_marks(kv_match, restore_at, total)
