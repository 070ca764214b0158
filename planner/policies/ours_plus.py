"""This project's online placement (`ours-plus`): `aligned` plus the junction, decode states and a
speculative grid, with learned-value eviction.

Why a 2048-token grid, captured into free memory only, and learned-value eviction: the
ablations in `results/LOG.md` (the 2026-12-02 entries "ours-plus: speculative grid captures
into free memory" and "Trace runs with the current ours-plus and optimum") and
`results/traces/README.md`.
"""

from __future__ import annotations

from planner.policies.aligned import Aligned
from planner.policies.base import PlanContext, junction_marks

OURS_PLUS_GRID_TOKENS = 2048  # speculative in-launch captures, rounded up to a KV block multiple


class OursPlus(Aligned):
    """This project: `aligned`, plus the state at the KV match captured inside the scan launch of
    the replay that crosses it when the restore point lags the match, the state at the last block
    boundary of prompt + reply kept at finish (decode snapshots), and speculative in-launch
    captures every OURS_PLUS_GRID_TOKENS (2048) tokens; under a budget the store keeps what is
    expected to spare the most FLOPs (GreedyDual over FLOPs saved x a restore chance learned per
    origin, planner.eviction.LearnedValueEviction), speculative captures included."""

    name = "ours-plus"
    decode_grid = "block"
    eviction = "learned_value"
    mark_mode = "capture"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return junction_marks(kv_match, restore_at, total)

    def speculative_marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """Every OURS_PLUS_GRID_TOKENS, rounded up to a KV block multiple, under the prompt end."""
        grid = -(-OURS_PLUS_GRID_TOKENS // ctx.block_size) * ctx.block_size
        return tuple(range(grid, total, grid))
