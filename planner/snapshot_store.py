"""SSM-state snapshots keyed by the exact prefix they represent.

A snapshot holds, per Mamba layer, the conv state and the SSM state after `position` tokens
of some prompt. The state is opaque here (anything with `.nbytes`). It may sit at any position,
block-aligned or not (the legacy policy saved at 8193, 16385, ...), so the key is the chained
hash of the full blocks below the position (the same sha256 chain as the KV blocks) plus the
exact token ids of the partial block above it. A lookup walks the prompt's own block hashes
from the deepest allowed block down, so a snapshot is only ever returned for a prompt that
shares its whole prefix, and the cost is one dict probe per block, not a scan of the store.

A byte budget bounds what the device holds; eviction is a seam (`planner.evictions.base.EvictionPolicy`):
LRU by default, the others in `planner.evictions` (`registry` selects one by name). Below the device
there may be tiers (`planner.snapshot_tiers.Tier`: host memory, disk), each with its own budget:
the policy's victim on a full tier is demoted to the next tier down and dropped only from the
last, and a new snapshot the policy declines for a full device goes straight to the first lower
tier; a restore of a demoted snapshot costs its tier's transfer time (returned by
`mark_restored`) and promotes it to the device again. With no lower tier the store is the flat
device store it always was.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import logging
from typing import Any, Callable, Sequence

from kernels.checks import require
from planner.block_pool import BlockHash, hash_full_blocks
from planner.evictions.base import EvictionPolicy
from planner.evictions.lru import LRUEviction
from planner.snapshot_tiers import SpillEntry, SpillError, Tier

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Snapshot:
    """One saved SSM state (every Mamba layer's SSD and conv state) after `position` tokens of the
    prefix its key names, with the bookkeeping eviction reads (recency, hits, FLOPs spared, origin)."""

    position: int
    anchor: BlockHash | None  # hash of the full blocks below `position` (None: no full block)
    tail: tuple[int, ...]  # token ids in [floor(position / bs) * bs, position)
    state: Any
    nbytes: int
    last_used: int = 0  # logical clock of the last save or restore
    hits: int = 0
    flops_saved: float = 0.0  # recompute this snapshot spares a hit (read by FLOP-aware eviction)
    origin: str = "chunk"  # why it was saved (`ORIGINS`), read by eviction that learns per origin
    # The chained hashes of the prompt it was saved from (a reference to the request's list, which
    # only grows: no copy) and its tokens [0, position) (a copy, 8 bytes a token), kept only for an
    # eviction that asks (`needs_prefix`): seglen walks the hashes to find a snapshot's candidate
    # ancestors and compares tokens inside a block. None otherwise, so an unbounded store keeps
    # no request's list. The copy's cost at its largest (Mooncake chains, first 1,000 requests,
    # seglen, 64 GB device + 256 GB host, ~5,100 snapshots held): peak RSS 0.86 -> 1.64 GB; a tuple
    # (a pointer a token, the ints shared with the request's list), made only for a snapshot the
    # store takes: `np.asarray` of every offered prefix was 5.2 s of a 17 s point (issue 32).
    prefix_hashes: Sequence[BlockHash] | None = dataclasses.field(default=None, repr=False)
    prefix_tokens: Sequence[int] | None = dataclasses.field(default=None, repr=False)
    tier: int = 0  # where it is held: 0 the device, i the store's i-th lower tier
    spilled: Any = dataclasses.field(default=None, repr=False)  # its tier's spill handle (None: not written out)

    @property
    def key(self) -> tuple[BlockHash | None, tuple[int, ...]]:
        return (self.anchor, self.tail)


# Why a snapshot was saved: a chunk end or last-chunk capture of the policy's plan, an admission
# mark of the policy (a junction, a periodic or tail position), a speculative mark (free memory
# only, unless the eviction's `admits` decides), a finished request's decode-time state, or an
# offline driver's mark.
ORIGINS = ("chunk", "mark", "speculative", "decode", "oracle")


class TierResidents(Sequence):
    """The candidates a store hands its eviction: the snapshots of one tier but `keep`, least recently
    used first. The list is built (a sort) only when a policy reads it; a policy that keeps its own
    order per tier (LRU, learned value, FLOP-aware, seglen) asks `store`, `tier` and `keep` instead,
    so an eviction costs O(log n) or a few array operations, not a Python sort of every resident
    (issue 32: a 256 GB host tier holds ~4,100 of them)."""

    __slots__ = ("store", "tier", "keep", "_list")

    def __init__(self, store: "SnapshotStore", tier: int, keep: Snapshot | None = None):
        self.store, self.tier, self.keep = store, tier, keep
        self._list: list[Snapshot] | None = None

    def _snapshots(self) -> list[Snapshot]:
        if self._list is None:
            keep = self.keep
            self._list = [s for s in self.store._residents(self.tier) if s is not keep]
        return self._list

    def __len__(self) -> int:
        members = self.store._members[self.tier]
        keep = self.keep
        return len(members) - (keep is not None and members.get(keep.key) is keep)

    def __getitem__(self, i):
        if i == 0 and self._list is None:  # the least recently used (LRU's victim): the heap's top, no sort
            return self.oldest()
        return self._snapshots()[i]

    def __iter__(self):
        return iter(self._snapshots())

    def oldest(self) -> Snapshot:
        """The least recently used candidate (the store's per-tier heap)."""
        require(len(self) > 0, "snapshots", "nothing to evict")
        return self.store._oldest(self.tier, self.keep)


@dataclasses.dataclass
class SnapshotStats:
    """Counters over a store's lifetime; the trace study reports them per policy."""

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
    # per lower tier, by name: moves down (demoted) and back up to the device (promoted), and restores
    demoted: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    demoted_bytes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    promoted: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    promoted_bytes: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    restore_transfer_s: float = 0.0  # summed transfer time of restores from lower tiers
    spill_failures: int = 0  # spilled snapshots that did not read back (dropped; the request recomputes)
    adopted: int = 0  # found at start in the last tier's spill (an earlier process's), held there
    adopted_dropped: int = 0  # found there but left out: over its budget (the oldest), or no prefix for `needs_prefix`


def heap_top(heap: list, live: Callable[[tuple], bool], keep: Snapshot | None) -> tuple[Snapshot, int]:
    """The snapshot (each entry's last item) of the first live entry of a lazy-deletion heap that is not
    `keep`'s, and how many dead entries it dropped off the top on the way; `keep`'s entries stay. The
    store's LRU order and learned value's credits share it: an entry goes stale instead of being found
    and removed when its snapshot is used again, moves tier or leaves."""
    held, dropped = [], 0
    try:
        while True:
            require(len(heap) > 0, "snapshots", "nothing to evict")
            entry = heap[0]
            if not live(entry):
                heapq.heappop(heap)
                dropped += 1
            elif entry[-1] is keep:
                held.append(heapq.heappop(heap))
            else:
                return entry[-1], dropped
    finally:
        for entry in held:
            heapq.heappush(heap, entry)


class SnapshotStore:
    """Snapshots keyed by the exact prefix they hold, under an optional byte budget.

    `save` stores (or refreshes) the state after a prompt prefix, evicting through the
    `EvictionPolicy` to fit; `lookup` returns the deepest snapshot at or below a limit whose prefix
    is the prompt's own; every save, restore, eviction and decline is counted in `stats`."""

    def __init__(self, block_size: int, byte_budget: int | None = None, eviction: EvictionPolicy | None = None,
                 lower_tiers: Sequence[Tier] = ()):
        require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
        require(byte_budget is None or byte_budget >= 0, "byte_budget",
                f"must be >= 0 or None (unbounded), got {byte_budget}")
        names = [t.name for t in lower_tiers]
        require(len(set(names)) == len(names), "lower_tiers", f"tier names must differ, got {names}")
        require(not lower_tiers or byte_budget is not None, "lower_tiers",
                "an unbounded device never demotes: give byte_budget or no lower tier")
        require(all(t.spill is None for t in tuple(lower_tiers)[:-1]), "lower_tiers",
                "only the last tier may spill its states (a spilled state never moves further down)")
        self.block_size = block_size
        self.byte_budget = byte_budget
        self.lower_tiers = tuple(lower_tiers)
        self._budgets = (byte_budget, *(t.byte_budget for t in self.lower_tiers))
        self._bytes = [0] * len(self._budgets)  # bytes held per tier, the device first
        self.eviction = LRUEviction() if eviction is None else eviction
        require(isinstance(self.eviction, EvictionPolicy), "eviction",
                f"must be a planner.evictions.base.EvictionPolicy, got {type(self.eviction).__name__}")
        self.eviction.bind(self)  # an eviction that reads prefixes learns the block
        # key -> snapshot in LRU order (oldest first); anchor -> {tail: snapshot} for lookups.
        self._lru: collections.OrderedDict[tuple, Snapshot] = collections.OrderedDict()
        # key -> snapshot per tier (the device first), so that finding a tier's residents does not
        # scan every held snapshot: with a 256 GB host that scan was half a simulated run's time
        self._members: list[dict[tuple, Snapshot]] = [{} for _ in self._budgets]
        # per tier, a heap of (last_used, push count, snapshot) with lazy deletion: an entry is live
        # while the snapshot is held in that tier with that stamp; its top is the tier's LRU
        self._lru_heaps: list[list] = [[] for _ in self._budgets]
        self._pushes = itertools.count()
        self._by_anchor: dict[BlockHash | None, dict[tuple[int, ...], Snapshot]] = {}
        self._clock = itertools.count(1)
        self.stats = SnapshotStats()
        self._adopt_spilled()

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes_held(self) -> int:
        """Bytes held on the device (the budgeted tier)."""
        return self._bytes[0]

    def tier_bytes(self) -> dict[str, int]:
        """Bytes held per tier, the device first."""
        return dict(zip(("device", *(t.name for t in self.lower_tiers)), self._bytes))

    def tier_name(self, snap: Snapshot) -> str:
        return "device" if snap.tier == 0 else self.lower_tiers[snap.tier - 1].name

    def positions(self, tier: str | None = None) -> list[int]:
        """Positions held (in every tier, or in the tier named `tier`)."""
        return sorted(s.position for s in self._lru.values() if tier is None or self.tier_name(s) == tier)

    def _residents(self, tier: int) -> list[Snapshot]:
        """The snapshots held in `tier`, least recently used first (`_lru`'s order is last_used's:
        every move to its end stamps a new clock value)."""
        if not self.lower_tiers:
            return list(self._lru.values())
        return sorted(self._members[tier].values(), key=lambda s: s.last_used)

    def _set_tier(self, snap: Snapshot, tier: int) -> None:
        self._members[snap.tier].pop(snap.key, None)
        snap.tier = tier
        self._members[tier][snap.key] = snap
        self._push_lru(snap)

    def _push_lru(self, snap: Snapshot) -> None:
        """Record `snap`'s (tier, last_used) in its tier's heap; rebuilt once dead entries outnumber live."""
        heap = self._lru_heaps[snap.tier]
        heapq.heappush(heap, (snap.last_used, next(self._pushes), snap))
        members = self._members[snap.tier]
        if len(heap) > 2 * len(members) + 64:
            heap[:] = [(s.last_used, next(self._pushes), s) for s in members.values()]
            heapq.heapify(heap)

    def _stamp(self, snap: Snapshot, now: int) -> None:
        """`snap` used at `now`: most recently used (last in `_lru`, a new entry in its tier's heap)."""
        snap.last_used = now
        self._lru.move_to_end(snap.key)
        if self._members[snap.tier].get(snap.key) is snap:
            self._push_lru(snap)

    def _live(self, entry, tier: int) -> bool:
        stamp, _, snap = entry
        return snap.last_used == stamp and snap.tier == tier and self._members[tier].get(snap.key) is snap

    def _oldest(self, tier: int, keep: Snapshot | None) -> Snapshot:
        """The least recently used snapshot of `tier` but `keep` (the tier's heap, dead entries dropped)."""
        return heap_top(self._lru_heaps[tier], lambda entry: self._live(entry, tier), keep)[0]

    def _over(self, tier: int, extra: int = 0) -> bool:
        budget = self._budgets[tier]
        return budget is not None and self._bytes[tier] + extra > budget

    def _make_room(self, tier: int, nbytes: int, now: int, keep: Snapshot | None = None) -> None:
        """Move the policy's victims out of `tier` (down a tier, or out of the store from the last)
        until `nbytes` more fit; `keep` is never chosen."""
        while self._over(tier, nbytes):
            victim = self.eviction.choose_victim(TierResidents(self, tier, keep), now)
            self._move_down(victim, now)

    def _move_down(self, snap: Snapshot, now: int) -> None:
        below = snap.tier + 1
        if below >= len(self._budgets) or (self._budgets[below] is not None and snap.nbytes > self._budgets[below]):
            self._evict(snap)
            return
        self._make_room(below, snap.nbytes, now)
        tier = self.lower_tiers[below - 1]
        if tier.spill is not None:
            try:
                snap.spilled, snap.state = tier.spill.put(snap.state, self._spill_entry(snap)), None
            except OSError as e:  # a full or unwritable disk: the snapshot leaves instead
                LOG.warning("snapshot at %d not spilled to %s (%s): dropped", snap.position, tier.name, e)
                self._evict(snap)
                return
        self._bytes[snap.tier] -= snap.nbytes
        self._set_tier(snap, below)
        self._bytes[below] += snap.nbytes
        name = tier.name
        self.stats.demoted[name] += 1
        self.stats.demoted_bytes[name] += snap.nbytes
        self.eviction.demoted(snap)

    def _promote(self, snap: Snapshot, now: int) -> None:
        """Bring a demoted snapshot back to the device, making room there first (a spilled one was
        read back and checked by `lookup`; its file is dropped)."""
        self._drop_spill(snap)
        self._bytes[snap.tier] -= snap.nbytes
        self._set_tier(snap, 0)
        self.eviction.touched(snap)
        self._make_room(0, snap.nbytes, now, keep=snap)
        self._bytes[0] += snap.nbytes

    def _key_parts(self, token_ids: Sequence[int], position: int, block_hashes: Sequence[BlockHash]):
        full = position // self.block_size
        require(full <= len(block_hashes), "block_hashes",
                f"need the hashes of the first {full} blocks for position {position}, got {len(block_hashes)}")
        anchor = block_hashes[full - 1] if full else None
        return anchor, tuple(token_ids[full * self.block_size : position])

    def refresh(self, token_ids: Sequence[int], position: int, block_hashes: Sequence[BlockHash]) -> Snapshot | None:
        """What `save` does for a prefix already held on the device (refreshed, counted a duplicate),
        without the state: the caller skips copying a state the store holds (an identical repeat's
        finish state). None, and nothing changes, when it is not held on the device."""
        anchor, tail = self._key_parts(token_ids, position, block_hashes)
        existing = self._by_anchor.get(anchor, {}).get(tail)
        if existing is None or existing.tier:
            return None  # the caller saves instead
        self.eviction.offered(token_ids, position, existing.nbytes, block_hashes, existing.flops_saved, existing.origin)
        self._count_duplicate(existing, next(self._clock))
        return existing

    def _count_duplicate(self, snap: Snapshot, now: int) -> None:
        """A save of a prefix already held: the held snapshot is refreshed (most recently used)."""
        self._stamp(snap, now)
        self.stats.duplicates += 1
        self.eviction.touched(snap)

    def save(self, token_ids: Sequence[int], position: int, state: Any, block_hashes: Sequence[BlockHash],
             flops_saved: float = 0.0, origin: str = "chunk") -> bool:
        """Store the state after `token_ids[:position]`, stamped with `origin` (one of `ORIGINS`);
        False when it cannot fit the budget, when the eviction policy's `admits` keeps what it
        holds instead, or when it is speculative (no request asked for it), would need an eviction
        to fit, and the policy has no `admits`."""
        require(0 < position <= len(token_ids), "position", f"must be in [1, {len(token_ids)}], got {position}")
        require(origin in ORIGINS, "origin", f"must be one of {ORIGINS}, got {origin!r}")
        self.eviction.offered(token_ids, position, int(state.nbytes), block_hashes, flops_saved, origin)
        anchor, tail = self._key_parts(token_ids, position, block_hashes)
        now = next(self._clock)
        existing = self._by_anchor.get(anchor, {}).get(tail)
        if existing is not None:  # the same prefix again: the stored state is equivalent
            self._count_duplicate(existing, now)
            if existing.tier:  # the state is in hand on the device: keep it there, no transfer
                existing.state = state if existing.state is None else existing.state  # a spilled one: not read back
                self._promote(existing, now)
            return True
        nbytes = int(state.nbytes)
        if self.byte_budget is not None and nbytes > self.byte_budget:
            self.stats.rejected += 1
            return False
        keep_prefix = self.eviction.needs_prefix
        snap = Snapshot(position, anchor, tail, state, nbytes, last_used=now, flops_saved=flops_saved, origin=origin,
                        prefix_hashes=block_hashes if keep_prefix else None)
        full = self._over(0, nbytes)
        tier = 0
        if full and not self.eviction.admits(snap, TierResidents(self, 0)):
            # the device keeps what it holds; a lower tier, if any, takes the new one directly
            if not self.lower_tiers or (self._budgets[1] is not None and nbytes > self._budgets[1]):
                self.stats.declined += 1
                return False
            tier = 1
        if keep_prefix:  # copied only once admitted (no admission reads it; issue 32: 9,145 offers, 1,100 taken);
            # a tuple of exactly `position` tokens is kept as it is (the engine's `Request.prefix`: one
            # tuple for this store and shadow_best's four shadows)
            snap.prefix_tokens = token_ids if type(token_ids) is tuple and len(token_ids) == position \
                else tuple(token_ids[:position])
        self._make_room(tier, nbytes, now)
        self._set_tier(snap, tier)
        self._lru[(anchor, tail)] = snap
        self._by_anchor.setdefault(anchor, {})[tail] = snap
        self._bytes[tier] += nbytes
        self.stats.saved += 1
        self.stats.saved_bytes += nbytes
        self.stats.saved_by_origin[origin] += 1
        self.eviction.saved(snap)
        if tier:  # taken on the device, copied down at once: counted as a move down
            self.stats.demoted[self.lower_tiers[0].name] += 1
            self.stats.demoted_bytes[self.lower_tiers[0].name] += nbytes
            self.eviction.demoted(snap)
        return True

    @staticmethod
    def _spill_entry(snap: Snapshot) -> SpillEntry:
        return SpillEntry(snap.position, snap.anchor, snap.tail, snap.nbytes, snap.origin, snap.flops_saved,
                          snap.prefix_tokens)

    def _adopt_spilled(self) -> None:
        """Hold what the last tier's spill already has (`Spill.recorded`: an earlier process's spills,
        oldest first) as that tier's residents, the newest while its budget lasts; the rest is dropped.
        Each is told to the eviction as saved and demoted; its state is read back (checked) on use."""
        spill = self.lower_tiers[-1].spill if self.lower_tiers else None
        recorded = getattr(spill, "recorded", None)
        if recorded is None:
            return
        tier, needs_prefix = len(self._budgets) - 1, self.eviction.needs_prefix
        room, keep = self._budgets[-1], []
        for entry, handle in reversed(recorded()):
            fits = room is None or entry.nbytes <= room
            if fits and (entry.prefix_tokens is not None or not needs_prefix):
                keep.append((entry, handle))
                room = None if room is None else room - entry.nbytes
            else:
                spill.drop(handle)
                self.stats.adopted_dropped += 1
        for entry, handle in reversed(keep):  # oldest first: the clock's order is the LRU order
            tokens = entry.prefix_tokens
            snap = Snapshot(entry.position, entry.anchor, entry.tail, None, entry.nbytes, last_used=next(self._clock),
                            flops_saved=entry.flops_saved, origin=entry.origin, spilled=handle,
                            prefix_hashes=hash_full_blocks(tokens, self.block_size) if needs_prefix else None,
                            prefix_tokens=tokens if needs_prefix else None)
            self._set_tier(snap, tier)
            self._lru[snap.key] = snap
            self._by_anchor.setdefault(snap.anchor, {})[snap.tail] = snap
            self._bytes[tier] += snap.nbytes
            self.stats.adopted += 1
            self.eviction.saved(snap)
            self.eviction.demoted(snap)

    def spill_all(self) -> int:
        """Move every held snapshot down to the last tier (a clean shutdown: what a spilling last tier
        holds is found again by the next process), oldest first, so that a full tier's eviction
        keeps the newest. Returns how many the last tier holds."""
        require(bool(self.lower_tiers), "lower_tiers", "no tier to spill to")
        now = next(self._clock)
        for tier in range(len(self._budgets) - 1):
            for snap in self._residents(tier):
                if snap.key in self._members[tier]:  # not already moved out by making room
                    self._move_down(snap, now)
        return len(self._members[-1])

    def _drop_spill(self, snap: Snapshot) -> None:
        if snap.spilled is not None:
            self.lower_tiers[snap.tier - 1].spill.drop(snap.spilled)
            snap.spilled = None

    def _read_back(self, snap: Snapshot) -> bool:
        """A spilled snapshot's state read back and checked (kept in `state` until promoted or dropped);
        on failure one log line, the snapshot dropped, False: the caller looks again."""
        if snap.spilled is None or snap.state is not None:
            return True
        tier = self.lower_tiers[snap.tier - 1]
        try:
            snap.state = tier.spill.get(snap.spilled)
            return True
        except SpillError as e:
            LOG.warning("snapshot at %d in %s did not read back (%s): dropped, the request recomputes",
                        snap.position, tier.name, e)
            self.stats.spill_failures += 1
            self._evict(snap)
            return False

    def _evict(self, snap: Snapshot) -> None:
        del self._lru[snap.key]
        del self._members[snap.tier][snap.key]
        bucket = self._by_anchor[snap.anchor]
        del bucket[snap.tail]
        if not bucket:
            del self._by_anchor[snap.anchor]
        self._drop_spill(snap)
        self._bytes[snap.tier] -= snap.nbytes
        self.stats.evicted += 1
        self.stats.evicted_bytes += snap.nbytes
        self.eviction.evicted(snap)

    def lookup(self, token_ids: Sequence[int], max_position: int, block_hashes: Sequence[BlockHash],
               observe: bool = True) -> Snapshot | None:
        """The deepest snapshot at a position <= `max_position` whose prefix is `token_ids`'s prefix;
        a spilled one is read back and checked first (one that fails is dropped and the next deepest
        taken). Does not count as a restore (call `mark_restored` when the state is actually used).
        `observe=False`: the eviction is not told (a caller that may not use the answer tells it with
        `observe_lookup` once it does: the scheduler, whose admission can still fail for KV blocks).
        """
        if observe:
            self.observe_lookup(token_ids, max_position, block_hashes)
        while True:
            snap = self._deepest(token_ids, max_position, block_hashes)
            if snap is None or self._read_back(snap):
                return snap

    def observe_lookup(self, token_ids: Sequence[int], max_position: int, block_hashes: Sequence[BlockHash]) -> None:
        """Tell the eviction of a lookup a request acted on (shadow_best replays it on its shadows)."""
        self.eviction.looked_up(token_ids, max_position, block_hashes)

    def _deepest(self, token_ids: Sequence[int], max_position: int, block_hashes: Sequence[BlockHash]) -> Snapshot | None:
        max_position = min(max_position, len(token_ids))
        bs = self.block_size
        top = min(max_position // bs, len(block_hashes))
        # the block ends whose hash anchors a held snapshot, deepest first, probed in C (`map`)
        anchored = itertools.compress(range(top, 0, -1), map(self._by_anchor.__contains__, reversed(block_hashes[:top])))
        for full in itertools.chain(anchored, (0,)):
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

    def mark_restored(self, snap: Snapshot) -> float:
        """Count a restore of `snap` (refreshing it); a demoted one is promoted to the device. Returns
        the seconds its transfer to the device takes (0.0 when it was on the device)."""
        now = next(self._clock)
        self._stamp(snap, now)
        snap.hits += 1
        self.stats.restored += 1
        self.stats.restored_bytes += snap.nbytes
        self.stats.restored_tokens_by_origin[snap.origin] += snap.position
        transfer = 0.0
        if snap.tier:
            tier = self.lower_tiers[snap.tier - 1]
            transfer = tier.transfer_s(snap.nbytes)
            self.stats.promoted[tier.name] += 1
            self.stats.promoted_bytes[tier.name] += snap.nbytes
            self.stats.restore_transfer_s += transfer
            self._promote(snap, now)
        self.eviction.restored(snap)
        return transfer

    def clear(self) -> None:
        """Drop every snapshot (counted as evictions)."""
        for snap in list(self._lru.values()):
            self._evict(snap)
