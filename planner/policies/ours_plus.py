"""This project's online placement (`ours-plus`): `aligned` plus the junction, decode states and a
speculative grid (denser in a store with no budget), with shadow-best eviction.

Why a 2048-token grid, captured into free memory only: the ablations in `results/LOG.md` (the
2026-12-02 entries "ours-plus: speculative grid captures into free memory" and "Trace runs with
the current ours-plus and optimum") and `results/traces/README.md`; why shadow-best eviction (it
was learned value until 2026-12-03): `planner/evictions/shadow_best.py` and results/LOG.md, seventh
session.
"""

from __future__ import annotations

from planner.policies.aligned import Aligned
from planner.policies.base import PlanContext, junction_marks

OURS_PLUS_GRID_TOKENS = 2048  # speculative in-launch captures, rounded up to a KV block multiple
# With no snapshot budget nothing competes for memory, so the grid is denser: what an unbounded store
# loses is the first visit of a branch point between grid captures. Mooncake, as given, first 1,000 /
# requests 5,000-5,999: 98.5% / 98.6% of the KV-hit tokens restored (2048: 95.7% / 96.5%), 1.65x the
# snapshots; chains, first 1,000: 2,490,162 tokens (2048: 2,472,754), simulated TTFT p50 2.70 s (2.72).
# Under a budget the 1024 grid lost 3% at 16 and 64 GB (results/LOG.md, sixth and eighth sessions).
OURS_PLUS_UNBOUNDED_GRID_TOKENS = 1024


class OursPlus(Aligned):
    """This project: `aligned`, plus the state at the KV match captured inside the scan launch of
    the replay that crosses it when the restore point lags the match, the state after the prompt's
    last token but one captured in the same launch (speculative: where a match can end), a token-granular
    prefix match (copy-on-write of a partial KV block), the state after the last computed token
    of prompt + reply kept at finish (decode snapshots), and speculative in-launch captures every
    OURS_PLUS_GRID_TOKENS (2048) tokens (OURS_PLUS_UNBOUNDED_GRID_TOKENS, 1024, in a store with no
    budget); under a budget the store follows whichever of four rules restored the most tokens
    lately on shadow stores (planner.evictions.shadow_best.ShadowBestEviction: learned value over every
    capture, or learned value, seglen or LRU with the speculative and chunk-end captures kept to
    free memory: the grid thins itself when its captures go unrestored). A byte-identical repeat
    then replays 1 token, and a next chat turn its new tokens plus the reply's last token (the one
    whose K/V was never computed)."""

    name = "ours-plus"
    decode_grid = "exact"
    match_unit = "token"
    eviction = "shadow_best"
    mark_mode = "capture"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return junction_marks(kv_match, restore_at, total)

    def speculative_marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """Every OURS_PLUS_GRID_TOKENS (OURS_PLUS_UNBOUNDED_GRID_TOKENS when the snapshot store has no
        budget), rounded up to a KV block multiple, under the prompt end; and
        n - 1 when a match can end there (the deepest an identical repeat matches: one token must
        run). Speculative, not a mark: only a repeat restores it, and as a mark under a 0.25 GB
        budget it drowned the junctions' learned restore chance (first 300 Mooncake requests:
        0 restored tokens vs 98,304 as speculative; results/LOG.md 2026-12-03, fifth session)."""
        spacing = OURS_PLUS_GRID_TOKENS if ctx.snapshot_memory_bounded else OURS_PLUS_UNBOUNDED_GRID_TOKENS
        grid = -(-spacing // ctx.block_size) * ctx.block_size
        tail = {total - 1} if total > 1 and (total - 1) % ctx.unit == 0 else set()
        return tuple(sorted(set(range(grid, total, grid)) | tail))
