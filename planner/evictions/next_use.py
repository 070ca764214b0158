"""Belady's MIN over the snapshot store (`next_use`), for the offline optimum: built from the future, never by name."""

from __future__ import annotations

import collections
import math
from typing import Iterable, Mapping, Sequence

from kernels.checks import require
from planner.evictions.base import EvictionPolicy
from planner.snapshot_store import Snapshot


class NextUseEviction(EvictionPolicy):
    """Belady's MIN over the snapshot store, for an offline driver that knows every future restore.

    `uses` maps a snapshot key (`Snapshot.key`) to the indices of the requests that will restore
    it, in any order; the driver calls `served(index)` once a request has been admitted (its
    restore is behind it). The victim is the held snapshot whose next use lies farthest ahead (no
    use left: infinitely far), ties in LRU order; a new snapshot that needs an eviction to fit is
    declined when its own next use is no sooner than that victim's (MIN with bypass).

    Every snapshot of one model has the same size, so for the number of restores served this is
    Belady's optimal offline rule; the tokens a restore spares differ between snapshots, so for
    restored *tokens* it is a strong reference, not a proven bound. Not in `EVICTION_POLICIES`: it
    cannot be built from a name.
    """

    name = "next_use"

    def __init__(self, uses: Mapping[tuple, Iterable[int]]):
        self._uses = {key: collections.deque(sorted(set(v))) for key, v in uses.items()}
        self._served: set[int] = set()

    def served(self, index: int) -> None:
        self._served.add(index)

    def next_use(self, key: tuple) -> float:
        """The lowest index of a request not yet served that will restore `key` (inf: none)."""
        queue = self._uses.get(key)
        while queue and queue[0] in self._served:
            queue.popleft()
        return queue[0] if queue else math.inf

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The snapshot used farthest ahead; `max` keeps the first of equals, i.e. LRU order."""
        require(len(snapshots) > 0, "snapshots", "nothing to evict")
        return max(snapshots, key=lambda s: self.next_use(s.key))

    def admits(self, candidate: Snapshot, snapshots: Sequence[Snapshot]) -> bool:
        """Whether a new snapshot is worth an eviction."""
        mine = self.next_use(candidate.key)
        return mine < math.inf and (not snapshots or mine < max(self.next_use(s.key) for s in snapshots))
