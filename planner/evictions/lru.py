"""LRU eviction, the snapshot store's default: the snapshot used longest ago leaves."""

from __future__ import annotations

from typing import Sequence

from planner.evictions.base import EvictionPolicy


class LRUEviction(EvictionPolicy):
    """Evict the snapshot used longest ago (the store's default)."""

    name = "lru"

    def choose_victim(self, snapshots: Sequence, now: int):
        """The least recently used snapshot: the first candidate (a store's tier answers it from its
        LRU heap without building the list: `TierResidents.__getitem__`)."""
        return snapshots[0]
