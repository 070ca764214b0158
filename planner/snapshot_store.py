"""SSM-state snapshots keyed by the exact prefix they represent.

A snapshot holds, per Mamba layer, the conv state and the SSM state after `position` tokens
of some prompt. The state is opaque here (anything with `.nbytes`). It may sit at any position,
block-aligned or not (the legacy policy saved at 8193, 16385, ...), so the key is the chained
hash of the full blocks below the position (the same sha256 chain as the KV blocks) plus the
exact token ids of the partial block above it. A lookup walks the prompt's own block hashes
from the deepest allowed block down, so a snapshot is only ever returned for a prompt that
shares its whole prefix, and the cost is one dict probe per block, not a scan of the store.

A byte budget bounds what is held; eviction is a seam (`EvictionPolicy`): LRU by default,
and a FLOP-aware policy for the multi-turn study lives beside it (`planner.eviction`, which also
selects a policy by name).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Any, Protocol, Sequence

from kernels.checks import require
from planner.block_pool import BlockHash


@dataclasses.dataclass(eq=False)
class Snapshot:
    position: int
    anchor: BlockHash | None  # hash of the full blocks below `position` (None: no full block)
    tail: tuple[int, ...]  # token ids in [floor(position / bs) * bs, position)
    state: Any
    nbytes: int
    last_used: int = 0  # logical clock of the last save or restore
    hits: int = 0
    flops_saved: float = 0.0  # recompute this snapshot spares a hit (read by FLOP-aware eviction)
    origin: str = "chunk"  # why it was saved (`ORIGINS`), read by eviction that learns per origin

    @property
    def key(self) -> tuple[BlockHash | None, tuple[int, ...]]:
        return (self.anchor, self.tail)


# Why a snapshot was saved: a chunk end or last-chunk capture of the policy's plan, an admission
# mark of the policy (a junction, a periodic or tail position), a speculative mark (free memory
# only, unless the eviction's `admits` decides), a finished request's decode-time state, or an
# offline driver's mark.
ORIGINS = ("chunk", "mark", "speculative", "decode", "oracle")


class EvictionPolicy(Protocol):
    name: str

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The snapshot to drop next; `snapshots` is in least-recently-used-first order."""

    # Optional: `admits(candidate, snapshots) -> bool`, asked only when a new snapshot needs an
    # eviction to fit (speculative ones included): False keeps what is held and drops the new one
    # (counted as `declined`). Without it a speculative snapshot is declined when memory is full.
    # Optional observers: `saved(snap)`, `restored(snap)`, `evicted(snap)`, called after the fact.


class LRUEviction:
    """Evict the snapshot used longest ago (the store's default)."""

    name = "lru"

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The least recently used snapshot."""
        return snapshots[0]


@dataclasses.dataclass
class SnapshotStats:
    saved: int = 0
    saved_bytes: int = 0
    restored: int = 0
    restored_bytes: int = 0
    evicted: int = 0
    evicted_bytes: int = 0
    rejected: int = 0  # larger than the whole budget
    declined: int = 0  # speculative with no free memory, or the policy keeps what it holds (`admits`)
    duplicates: int = 0  # a save for a prefix already held (refreshed, not stored twice)
    saved_by_origin: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    restored_tokens_by_origin: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # positions summed


class SnapshotStore:
    def __init__(self, block_size: int, byte_budget: int | None = None, eviction: EvictionPolicy | None = None):
        require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
        require(byte_budget is None or byte_budget >= 0, "byte_budget",
                f"must be >= 0 or None (unbounded), got {byte_budget}")
        self.block_size = block_size
        self.byte_budget = byte_budget
        self.eviction = eviction or LRUEviction()
        # key -> snapshot in LRU order (oldest first); anchor -> {tail: snapshot} for lookups.
        self._lru: collections.OrderedDict[tuple, Snapshot] = collections.OrderedDict()
        self._by_anchor: dict[BlockHash | None, dict[tuple[int, ...], Snapshot]] = {}
        self._clock = itertools.count(1)
        self.bytes_held = 0
        self.stats = SnapshotStats()

    def __len__(self) -> int:
        return len(self._lru)

    def positions(self) -> list[int]:
        return sorted(s.position for s in self._lru.values())

    def _key_parts(self, token_ids: Sequence[int], position: int, block_hashes: Sequence[BlockHash]):
        full = position // self.block_size
        require(full <= len(block_hashes), "block_hashes",
                f"need the hashes of the first {full} blocks for position {position}, got {len(block_hashes)}")
        anchor = block_hashes[full - 1] if full else None
        return anchor, tuple(token_ids[full * self.block_size : position])

    def save(self, token_ids: Sequence[int], position: int, state: Any, block_hashes: Sequence[BlockHash],
             flops_saved: float = 0.0, origin: str = "chunk") -> bool:
        """Store the state after `token_ids[:position]`, stamped with `origin` (one of `ORIGINS`);
        False when it cannot fit the budget, when the eviction policy's `admits` keeps what it
        holds instead, or when it is speculative (no request asked for it), would need an eviction
        to fit, and the policy has no `admits`."""
        require(0 < position <= len(token_ids), "position", f"must be in [1, {len(token_ids)}], got {position}")
        require(origin in ORIGINS, "origin", f"must be one of {ORIGINS}, got {origin!r}")
        anchor, tail = self._key_parts(token_ids, position, block_hashes)
        now = next(self._clock)
        existing = self._by_anchor.get(anchor, {}).get(tail)
        if existing is not None:  # the same prefix again: the stored state is equivalent
            existing.last_used = now
            self._lru.move_to_end((anchor, tail))
            self.stats.duplicates += 1
            return True
        nbytes = int(state.nbytes)
        if self.byte_budget is not None and nbytes > self.byte_budget:
            self.stats.rejected += 1
            return False
        snap = Snapshot(position, anchor, tail, state, nbytes, last_used=now, flops_saved=flops_saved, origin=origin)
        full = self.byte_budget is not None and self.bytes_held + nbytes > self.byte_budget
        admits = getattr(self.eviction, "admits", None)
        if full and (not admits(snap, list(self._lru.values())) if admits is not None else origin == "speculative"):
            self.stats.declined += 1
            return False
        while self.byte_budget is not None and self.bytes_held + nbytes > self.byte_budget:
            self._evict(self.eviction.choose_victim(list(self._lru.values()), now))
        self._lru[(anchor, tail)] = snap
        self._by_anchor.setdefault(anchor, {})[tail] = snap
        self.bytes_held += nbytes
        self.stats.saved += 1
        self.stats.saved_bytes += nbytes
        self.stats.saved_by_origin[origin] += 1
        self._tell("saved", snap)
        return True

    def _tell(self, event: str, snap: Snapshot) -> None:
        observer = getattr(self.eviction, event, None)
        if observer is not None:
            observer(snap)

    def _evict(self, snap: Snapshot) -> None:
        del self._lru[snap.key]
        bucket = self._by_anchor[snap.anchor]
        del bucket[snap.tail]
        if not bucket:
            del self._by_anchor[snap.anchor]
        self.bytes_held -= snap.nbytes
        self.stats.evicted += 1
        self.stats.evicted_bytes += snap.nbytes
        self._tell("evicted", snap)

    def lookup(self, token_ids: Sequence[int], max_position: int, block_hashes: Sequence[BlockHash]) -> Snapshot | None:
        """The deepest snapshot at a position <= `max_position` whose prefix is `token_ids`'s prefix.

        Does not count as a restore (call `mark_restored` when the state is actually used).
        """
        max_position = min(max_position, len(token_ids))
        bs = self.block_size
        for full in range(min(max_position // bs, len(block_hashes)), -1, -1):
            bucket = self._by_anchor.get(block_hashes[full - 1] if full else None)
            if not bucket:
                continue
            base = full * bs
            best = None
            for tail, snap in bucket.items():
                end = base + len(tail)
                if 0 < end <= max_position and (best is None or end > best.position) \
                        and tuple(token_ids[base:end]) == tail:
                    best = snap
            if best is not None:
                return best
        return None

    def mark_restored(self, snap: Snapshot) -> None:
        snap.last_used = next(self._clock)
        snap.hits += 1
        self._lru.move_to_end(snap.key)
        self.stats.restored += 1
        self.stats.restored_bytes += snap.nbytes
        self.stats.restored_tokens_by_origin[snap.origin] += snap.position
        self._tell("restored", snap)

    def clear(self) -> None:
        """Drop every snapshot (counted as evictions)."""
        for snap in list(self._lru.values()):
            self._evict(snap)
