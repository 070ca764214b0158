"""FLOP-aware eviction (Marconi-style): evict the lowest `recency + alpha * FLOPs-saved-per-byte`.

LRU (`planner.evictions.lru`) drops the snapshot used longest ago. In a hybrid
model that is a poor proxy for value: every snapshot of one model has the same size (preset
"small": 5 Mamba layers x (conv 768x3 + SSM 8x64x128) fp32 = 1,356,800 bytes), but a hit on a
snapshot at position 16,368 spares about 25x the prefill FLOPs of one at 1,024 (below).
Marconi (MLSys 2025, section 4.2) scores every entry by recency plus FLOPs saved per byte of
memory and evicts the lowest score; this is that score over our snapshot store.

The score of snapshot s among the current candidates C (the store, LRU-first):

    recency(s)    = (s.last_used - min_C last_used) / (max_C last_used - min_C last_used)
    efficiency(s) = (e(s) - min_C e) / (max_C e - min_C e),    e(s) = s.flops_saved / s.nbytes
    utility(s)    = recency(s) + alpha * efficiency(s)          alpha = 1.0 by default

Both terms are min-max normalized over the candidates to [0, 1] (a term that is constant over
the candidates is 0 for all of them), so alpha is the exchange rate between "the most recently
used" and "the most FLOPs per byte": with alpha = 1 a snapshot that is the oldest but spares
the most FLOPs per byte (utility 1.0) outlives one that is the newest but spares the fewest
(also 1.0: the tie goes to LRU order, the least recently used goes first). Marconi picks alpha
per workload by replaying a window of past requests over a grid; we expose it as a constant
(`alpha=0` is exactly LRU, since recency order is LRU order). The victim is the lowest utility,
ties broken by LRU order.

`flops_saved` is what the engine stamps on a snapshot at save time (`Engine(snapshot_flops=)`):
the prefill FLOPs of tokens [0, position), as if a hit avoided recomputing the whole prefix.
The count is the model's cost model (`model.cost.ModelCost.snapshot_flops`: weights, SSD scan
and causal attention over the prefix, the LM head left out; e.g. preset "small": 1.51e10 FLOPs
at 1,024, 3.69e11 at 16,368). It overstates the marginal value of a deep snapshot when a shallower
one of the same prefix is also held (a hit then saves only the FLOPs between the two); Marconi
has the same simplification for its radix-tree nodes' SSM states.
"""

from __future__ import annotations

from typing import Sequence

from kernels.checks import require
from planner.evictions.scores import RecencyScoreEviction, TierScores, recency_plus
from planner.snapshot_store import Snapshot


class FlopAwareEviction(RecencyScoreEviction):
    """Evict the lowest `recency + alpha * FLOPs-saved-per-byte` (both min-max normalized)."""

    name = "flop_aware"

    def __init__(self, alpha: float = 1.0):
        require(alpha >= 0, "alpha", f"must be >= 0 (0 = LRU), got {alpha}")
        self.alpha = alpha
        self._scores = TierScores()  # the held snapshots' recency and FLOPs per byte, per tier

    @staticmethod
    def efficiency(snap: Snapshot) -> float:
        return snap.flops_saved / max(snap.nbytes, 1)

    @property
    def score_weight(self) -> float:
        return self.alpha

    def utilities(self, snapshots: Sequence[Snapshot]) -> list[float]:
        """Each candidate's utility (see the module docstring); the lowest is evicted."""
        return recency_plus(snapshots, [self.efficiency(s) for s in snapshots], self.alpha)

    def saved(self, snap: Snapshot) -> None:
        self._scores.add(snap, self.efficiency(snap))

    def evicted(self, snap: Snapshot) -> None:
        if self._scores.holds(snap):
            self._scores.remove(snap)
