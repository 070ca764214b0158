"""ollama's snapshot placement (`ollama`), from its MLX runner.

Source: ollama's `x/mlxrunner/pipeline.go` (read 2026-12; its `prefill` schedules snapshots
`snapshotInterval = 8192` tokens apart and one `preThinking = 4` tokens before the prompt end) and
issues #17829 / #18267 (a restore lands on the 8192 grid below the match); the brief, section 6.
"""

from __future__ import annotations

from planner.policies.base import PlacementPolicy, PlanContext

OLLAMA_INTERVAL_TOKENS = 8192  # `snapshotInterval` in x/mlxrunner/pipeline.go
OLLAMA_PROMPT_END_OFFSET = 4  # `preThinking`: the snapshot near the prompt end sits 4 tokens before it


class Ollama(PlacementPolicy):
    """ollama's MLX runner (x/mlxrunner/pipeline.go, 2026): a snapshot every 8192 prompt tokens and
    one 4 tokens before the prompt end, so a retried or continued prompt restores close to its end;
    the state after the last generated token kept when a request closes (here on the KV block, the
    finest point our block-floored match can use); LRU eviction that touches only the snapshot a
    request used. Each snapshot is a chunk stop (its MLX forward has no in-launch capture). Its
    paging of inactive state to host memory is not modelled (one device budget)."""

    name = "ollama"
    decode_grid = "block"
    eviction = "lru"
    mark_mode = "stop"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """Every 8192 tokens, and 4 tokens before the prompt end, above the restore point."""
        periodic = range(OLLAMA_INTERVAL_TOKENS, total, OLLAMA_INTERVAL_TOKENS)
        near_end = (total - OLLAMA_PROMPT_END_OFFSET,) if total > OLLAMA_PROMPT_END_OFFSET else ()
        return tuple(sorted({m for m in (*periodic, *near_end) if restore_at < m < total}))
