"""Learned-value eviction: GreedyDual over FLOPs spared per byte x a restore chance learned online."""

from __future__ import annotations

import collections
import heapq
import itertools
from typing import Sequence

from kernels.checks import require
from planner.evictions.base import EvictionPolicy
from planner.evictions.scores import covers_tier
from planner.snapshot_store import Snapshot, heap_top


class LearnedValueEviction(EvictionPolicy):
    """GreedyDual over the FLOPs a snapshot is expected to spare per byte, with its chance of another
    restore learned online per origin and restore count.

    Every held snapshot has a credit set when it is saved or restored,

        credit = inflation + p(origin, restores) * flops_saved / nbytes

    where p is the fraction of snapshots of that origin with that many restores (0, 1, 2, 3+) that
    were restored again before being evicted, counted as the run goes, with a Beta(`prior_hits`,
    `prior_misses`) prior (0.1 by default: most snapshots are never used). The victim is the lowest
    credit, and `inflation` rises to it (GreedyDual, Young 1994: a snapshot that spares many FLOPs
    outlives cheap ones, but not forever once newer ones are credited above it). A new snapshot that
    needs an eviction is admitted only if its credit beats the lowest held (speculative ones
    included, so a grid capture may replace a stale junction). Restore counts outlive an eviction
    for `history` keys, so a shared system-prompt state that keeps being re-saved is recognised.

    Why: on the first 1,000 Mooncake conversation requests (chains, ours-plus, unbounded), 162 of
    6,932 snapshots were ever restored; one 512-token junction took 821 restores (17% of the
    restored tokens), deep decode states the rest. LRU with 64 snapshots keeps neither (first reuse
    ~1,100 saves later); FLOP-aware eviction keeps the deep ones but drops the popular shallow one.
    """

    name = "learned_value"

    def __init__(self, prior_hits: float = 1.0, prior_misses: float = 9.0, history: int = 4096):
        require(prior_hits > 0 and prior_misses > 0, "prior_hits",
                f"the prior's counts must be > 0, got {prior_hits}, {prior_misses}")
        require(history >= 0, "history", f"must be >= 0, got {history}")
        self.prior = (prior_hits, prior_misses)
        self.history = history
        self.inflation = 0.0
        self._credit: dict[tuple, float] = {}
        self._level: dict[tuple, int] = {}  # restores over the key's lives
        self._ghost: collections.OrderedDict[tuple, int] = collections.OrderedDict()
        self._outcomes: dict[tuple[str, int], list[int]] = collections.defaultdict(lambda: [0, 0])
        # per store tier, a heap of (credit, last_used, push count, snapshot) with lazy deletion: an
        # entry is live while the snapshot is held in that tier with that credit and stamp, so its top
        # is `min(key=credit)` over the tier in LRU order (a credit changes only on a save or restore)
        self._heaps: dict[int, list] = collections.defaultdict(list)
        self._held: dict[tuple, Snapshot] = {}
        self._pushes = itertools.count()
        self._entries = 0

    def _outcome(self, origin: str, restores: int) -> list[int]:
        """[restored again, evicted first] so far, for snapshots of `origin` at `restores` (3+ pooled)."""
        return self._outcomes[(origin, min(restores, 3))]

    def probability(self, origin: str, restores: int) -> float:
        """The learned chance that a snapshot of `origin` with `restores` restores is restored again."""
        again, evicted = self._outcome(origin, restores)
        a, b = self.prior
        return (again + a) / (again + evicted + a + b)

    def _score(self, snap: Snapshot, restores: int) -> float:
        return self.inflation + self.probability(snap.origin, restores) * snap.flops_saved / max(snap.nbytes, 1)

    def _tracked(self) -> int:
        return len(self._held)

    def _push(self, snap: Snapshot) -> None:
        heapq.heappush(self._heaps[snap.tier], (self._credit[snap.key], snap.last_used, next(self._pushes), snap))
        self._entries += 1
        if self._entries > 2 * len(self._held) + 64:  # dead entries outnumber live: rebuild
            self._heaps.clear()
            for held in self._held.values():
                self._heaps[held.tier].append((self._credit[held.key], held.last_used, next(self._pushes), held))
            for heap in self._heaps.values():
                heapq.heapify(heap)
            self._entries = len(self._held)

    def _live(self, entry, tier: int) -> bool:
        credit, stamp, _, snap = entry
        return (self._held.get(snap.key) is snap and snap.tier == tier and snap.last_used == stamp
                and self._credit[snap.key] == credit)

    def _lowest_in(self, tier: int, keep: Snapshot | None) -> Snapshot:
        """The held snapshot of `tier` but `keep` of the lowest credit, of equals the least recently used."""
        snap, dropped = heap_top(self._heaps[tier], lambda entry: self._live(entry, tier), keep)
        self._entries -= dropped
        return snap

    def saved(self, snap: Snapshot) -> None:
        level = self._ghost.pop(snap.key, 0)
        self._level[snap.key] = level
        self._credit[snap.key] = self._score(snap, level)
        self._held[snap.key] = snap
        self._push(snap)

    def restored(self, snap: Snapshot) -> None:
        level = self._level.get(snap.key, 0)
        self._outcome(snap.origin, level)[0] += 1
        self._level[snap.key] = level + 1
        self._credit[snap.key] = self._score(snap, level + 1)
        if self._held.get(snap.key) is snap:
            self._push(snap)

    def touched(self, snap: Snapshot) -> None:
        """A refresh, demotion or promotion: its recency or tier changed, its credit did not."""
        if self._held.get(snap.key) is snap:
            self._push(snap)

    demoted = touched

    def evicted(self, snap: Snapshot) -> None:
        level = self._level.pop(snap.key, 0)
        self._credit.pop(snap.key, None)
        if self._held.get(snap.key) is snap:
            del self._held[snap.key]
        self._outcome(snap.origin, level)[1] += 1
        if self.history:
            self._ghost[snap.key] = level
            self._ghost.move_to_end(snap.key)
            if len(self._ghost) > self.history:
                self._ghost.popitem(last=False)

    def _held_credit(self, snap: Snapshot) -> float:
        credit = self._credit.get(snap.key)
        if credit is None:  # held before this policy saw it (a policy swapped in): credit it now
            self.saved(snap)
            credit = self._credit[snap.key]
        return credit

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The lowest credit (`min` keeps the first of equals: LRU order); inflation rises to it."""
        require(len(snapshots) > 0, "snapshots", "nothing to evict")
        if covers_tier(self, snapshots):
            victim = self._lowest_in(snapshots.tier, snapshots.keep)
        else:
            victim = min(snapshots, key=self._held_credit)
        self.inflation = max(self.inflation, self._credit[victim.key])
        return victim

    def admits(self, candidate: Snapshot, snapshots: Sequence[Snapshot]) -> bool:
        """Whether a new snapshot's credit beats the lowest held one's."""
        mine = self._score(candidate, self._ghost.get(candidate.key, 0))
        if not snapshots:
            return True
        if covers_tier(self, snapshots):
            return mine > self._credit[self._lowest_in(snapshots.tier, snapshots.keep).key]
        return mine > min(self._held_credit(s) for s in snapshots)
