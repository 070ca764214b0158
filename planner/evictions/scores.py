"""What FLOP-aware and seglen eviction share: `recency + weight * score`, both min-max normalized over
a tier's candidates, lowest evicted (ties in LRU order), on lists (`recency_plus`, `lowest_of`: what
each rule's docstring says) and per tier in dense arrays kept up from the store's events
(`TierScores`: a few array operations per eviction, not Python lists over every resident; the
same float64 operations, so the same victim to the last bit: tests/test_sim_digest.py).
`covers_tier` says which of the two paths a decision may take; `RecencyScoreEviction` is the events
and the victim choice the two rules share.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kernels.checks import require
from planner.evictions.base import EvictionPolicy
from planner.snapshot_store import Snapshot, TierResidents


def min_max(values: Sequence[float]) -> list[float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        return [0.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


def recency_plus(snapshots: Sequence[Snapshot], scores: Sequence[float], weight: float) -> list[float]:
    """recency + weight * score, both min-max normalized over the candidates (FLOP-aware and seglen)."""
    recency = min_max([float(s.last_used) for s in snapshots])
    return [r + weight * g for r, g in zip(recency, min_max(scores))]


class TierScores:
    """Per store tier, the held snapshots' recency (last_used) and one score in dense arrays, kept up
    from the store's events, so that `recency + weight * score` (both min-max normalized over a tier's
    candidates) is a few array operations per eviction instead of Python lists over every resident.
    The arithmetic is the lists' (float64, the same operations in the same order): the same victim
    to the last bit (tests/test_sim_digest.py)."""

    def __init__(self):
        self._tiers: dict[int, list] = {}  # tier -> [last_used array, score array, snapshots, count]
        self._where: dict[tuple, tuple[int, int, Snapshot]] = {}  # key -> (tier, index, snapshot)

    def __len__(self) -> int:
        return len(self._where)

    def _columns(self, tier: int) -> list:
        cols = self._tiers.get(tier)
        if cols is None:
            cols = self._tiers[tier] = [np.empty(64), np.empty(64), [], 0]
        return cols

    def add(self, snap: Snapshot, score: float) -> None:
        cols = self._columns(snap.tier)
        n = cols[3]
        if n == len(cols[0]):
            cols[0], cols[1] = np.resize(cols[0], 2 * n), np.resize(cols[1], 2 * n)
        cols[0][n], cols[1][n] = float(snap.last_used), score
        cols[2].append(snap)
        cols[3] = n + 1
        self._where[snap.key] = (snap.tier, n, snap)

    def remove(self, snap: Snapshot) -> float:
        """Drop `snap` (the last one moves into its place); returns its score."""
        tier, i, _ = self._where.pop(snap.key)
        cols = self._tiers[tier]
        score = float(cols[1][i])
        last = cols[3] - 1
        if i != last:
            moved = cols[2][last]
            cols[0][i], cols[1][i], cols[2][i] = cols[0][last], cols[1][last], moved
            self._where[moved.key] = (tier, i, moved)
        cols[2].pop()
        cols[3] = last
        return score

    def holds(self, snap: Snapshot) -> bool:
        entry = self._where.get(snap.key)
        return entry is not None and entry[2] is snap

    def sync(self, snap: Snapshot) -> None:
        """`snap`'s tier or recency changed (a demotion, promotion, restore or refresh)."""
        tier, i, _ = self._where[snap.key]
        if tier != snap.tier:
            self.add(snap, self.remove(snap))
        else:
            self._tiers[tier][0][i] = float(snap.last_used)

    def set_score(self, snap: Snapshot, score: float) -> None:
        tier, i, _ = self._where[snap.key]
        self._tiers[tier][1][i] = score

    def lowest(self, tier: int, keep: Snapshot | None, weight: float) -> Snapshot:
        """The candidate of `tier` but `keep` with the lowest recency + weight * score, both min-max
        normalized (`recency_plus`); of equals the least recently used."""
        cols = self._tiers[tier]
        n = cols[3]
        recency, score = cols[0][:n], cols[1][:n]
        entry = self._where.get(keep.key) if keep is not None else None
        if entry is not None and entry[0] == tier and entry[2] is keep:
            others = np.arange(n) != entry[1]
            recency, score, index = recency[others], score[others], np.flatnonzero(others)
        else:
            index = None
        require(len(recency) > 0, "snapshots", "nothing to evict")
        utility = min_max_array(recency) + weight * min_max_array(score)
        ties = np.flatnonzero(utility == utility.min())
        best = ties[np.argmin(recency[ties])] if len(ties) > 1 else ties[0]
        return cols[2][best if index is None else index[best]]


def min_max_array(values: np.ndarray) -> np.ndarray:
    """`min_max` over an array: the same float64 operations, element by element."""
    lo, hi = values.min(), values.max()
    if hi == lo:
        return np.zeros(len(values))
    return (values - lo) / (hi - lo)


def covers_tier(policy, snapshots) -> bool:
    """Whether `snapshots` is a store's tier that `policy`'s per-tier index covers in full (it saw
    every snapshot the store holds); else the list path (a policy swapped into a filled store)."""
    return isinstance(snapshots, TierResidents) and policy._tracked() == len(snapshots.store)


def lowest_of(snapshots: Sequence[Snapshot], utilities) -> Snapshot:
    """The candidate of lowest `utilities(snapshots)`; of equals the first, i.e. the least recently used."""
    require(len(snapshots) > 0, "snapshots", "nothing to evict")
    utility = utilities(snapshots)
    return snapshots[min(range(len(snapshots)), key=lambda i: (utility[i], i))]


class RecencyScoreEviction(EvictionPolicy):
    """A rule evicting the lowest `recency + score_weight * score` (FLOP-aware, seglen): it keeps its
    held snapshots in `self._scores` (a `TierScores`) and defines `utilities` (the list path)."""

    _scores: TierScores
    score_weight: float

    def utilities(self, snapshots: Sequence[Snapshot]) -> list[float]:
        raise NotImplementedError

    def _tracked(self) -> int:
        return len(self._scores)

    def touched(self, snap: Snapshot) -> None:
        """A restore, refresh, demotion or promotion: its recency or tier changed."""
        if self._scores.holds(snap):
            self._scores.sync(snap)

    restored = demoted = touched

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The lowest utility, ties broken least recently used first."""
        if covers_tier(self, snapshots):
            return self._scores.lowest(snapshots.tier, snapshots.keep, self.score_weight)
        return lowest_of(snapshots, self.utilities)
