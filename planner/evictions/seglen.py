"""Seglen eviction (SGLang's, for its Mamba radix cache): evict the lowest `recency + weight * seglen`."""

from __future__ import annotations

import collections
import itertools
from typing import Sequence

from kernels.checks import require
from planner.evictions.scores import RecencyScoreEviction, TierScores, recency_plus
from planner.snapshot_store import Snapshot

SEGLEN_WEIGHT = 0.85  # seglen's weight of replay length against recency (the SGLang PR's example)


class SeglenEviction(RecencyScoreEviction):
    """SGLang's `seglen` eviction for its Mamba radix cache (sglang PR #22172, 2026; the brief, section 6):
    evict the lowest `recency + weight * seglen`, both min-max normalized over the candidates, where
    seglen(s) is the replay length to s's nearest reusable ancestor, the deepest other held snapshot
    whose prefix is a prefix of s's (s.position when none): what a later request through s would
    replay if s were gone. It stands in for Marconi's FLOPs per byte without a per-architecture
    FLOP model. A restore refreshes only the snapshot restored (the PR's "refresh only the matched
    last node"; our store never refreshes ancestors anyway).

    Ancestry is kept as parent links: a new snapshot's parent is the deepest held snapshot on its
    prefix, and each child of that parent whose prefix passes through the new one is re-linked to it;
    an evicted snapshot's children move up to its parent. A held snapshot is an ancestor of s when its
    full blocks' hashes are on s's block-hash chain and its tokens in its own last, partial block equal
    s's there (the store keeps each snapshot's tokens for this). Ancestry is then the prefix order, a
    tree, so handing an evicted snapshot's children to its parent keeps every link exact. (Until
    2026-12-03 a snapshot in a lower block than s was taken for an ancestor on its full blocks alone;
    that rule was not transitive, and after an eviction a link could miss an ancestor: 1 of 300 random
    reference traces.)
    """

    name = "seglen"
    needs_prefix = True

    def __init__(self, weight: float = SEGLEN_WEIGHT):
        require(weight >= 0, "weight", f"must be >= 0 (0 = LRU), got {weight}")
        self.weight = weight
        self._by_anchor: dict[object, list[Snapshot]] = collections.defaultdict(list)
        self._parent: dict[tuple, Snapshot | None] = {}
        self._children: dict[tuple | None, set] = collections.defaultdict(set)  # parent key (None: roots) -> keys
        self._held: dict[tuple, Snapshot] = {}
        self.block_size: int | None = None  # the store's, told by `bind`
        self._scores = TierScores()  # the held snapshots' recency and seglen, per tier

    def bind(self, store) -> None:
        """Called by the store that holds this policy: it reads its block size (the prefix hashes' unit)."""
        block_size = store.block_size
        require(self.block_size in (None, block_size), "block_size",
                f"this seglen policy already serves a store on block {self.block_size}, not {block_size}")
        self.block_size = block_size

    @staticmethod
    def _is_ancestor(a: Snapshot, s: Snapshot, block_size: int) -> bool:
        """Whether held snapshot `a` lies on `s`'s prefix, below it: `a`'s full blocks by hash, the
        tokens of its partial block one by one."""
        if a.position >= s.position:
            return False
        a_full = a.position // block_size
        if a_full and s.prefix_hashes[a_full - 1] != a.anchor:
            return False
        return not a.tail or tuple(s.prefix_tokens[a_full * block_size:a.position]) == a.tail

    def _find_parent(self, s: Snapshot, block_size: int) -> Snapshot | None:
        top = s.position // block_size
        hashes = s.prefix_hashes
        # the block ends whose hash anchors a held snapshot, deepest first: the probes run in C (`map`),
        # not a Python step per block boundary (~600 a save on Mooncake's 10k-token prompts)
        anchored = itertools.compress(range(top, 0, -1), map(self._by_anchor.__contains__, reversed(hashes[:top])))
        for full in itertools.chain(anchored, (0,)):
            anchor = hashes[full - 1] if full else None
            below = [a for a in self._by_anchor.get(anchor, ()) if self._is_ancestor(a, s, block_size)]
            if below:
                return max(below, key=lambda a: a.position)
        return None

    def _link(self, key: tuple, parent: Snapshot | None) -> None:
        self._parent[key] = parent
        self._children[parent.key if parent is not None else None].add(key)
        held = self._held.get(key)
        if held is not None and self._scores.holds(held):  # its replay length changed with its parent
            self._scores.set_score(held, float(self.seglen(held)))

    def saved(self, snap: Snapshot) -> None:
        require(snap.prefix_hashes is not None and snap.prefix_tokens is not None, "prefix_hashes",
                "seglen needs the store to keep each prefix")
        block_size = self.block_size
        require(block_size is not None, "block_size", "seglen must be bound to its store (SnapshotStore binds it)")
        parent = self._find_parent(snap, block_size)
        siblings = self._children[parent.key if parent is not None else None]
        for key in [k for k in siblings if self._is_ancestor(snap, self._held[k], block_size)]:
            siblings.discard(key)  # `snap` now lies between `parent` and this one
            self._link(key, snap)
        self._held[snap.key] = snap
        self._by_anchor[snap.anchor].append(snap)
        self._link(snap.key, parent)
        self._scores.add(snap, float(self.seglen(snap)))

    def evicted(self, snap: Snapshot) -> None:
        self._scores.remove(snap)
        parent = self._parent.pop(snap.key)
        self._children[parent.key if parent is not None else None].discard(snap.key)
        for key in self._children.pop(snap.key, set()):
            self._link(key, parent)
        del self._held[snap.key]
        bucket = self._by_anchor[snap.anchor]
        bucket.remove(snap)
        if not bucket:
            del self._by_anchor[snap.anchor]

    def seglen(self, snap: Snapshot) -> int:
        """Tokens a request through `snap` would replay from its nearest held ancestor, were it gone."""
        parent = self._parent.get(snap.key)
        return snap.position - (parent.position if parent is not None else 0)

    @property
    def score_weight(self) -> float:
        return self.weight

    def utilities(self, snapshots: Sequence[Snapshot]) -> list[float]:
        return recency_plus(snapshots, [float(self.seglen(s)) for s in snapshots], self.weight)
