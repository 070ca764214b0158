"""Snapshot eviction policies: FLOP-aware eviction (Marconi-style), learned-value eviction
(GreedyDual over FLOPs spared x a restore chance learned online), seglen (SGLang's), and Belady's MIN
for the offline optimum. Ours-plus's own, `shadow_best` (the best of four of these rules on shadow
stores), is in `planner.shadow_eviction`; every one by name is in `planner.eviction_registry`
(`EVICTION_POLICIES`, `get_eviction("flop_aware", alpha=0.5)`).

LRU (`planner.snapshot_store.LRUEviction`) drops the snapshot used longest ago. In a hybrid
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

import collections
import heapq
import itertools
import math
from typing import Iterable, Mapping, Sequence

import numpy as np

from kernels.checks import require
from planner.snapshot_store import LRUEviction, Snapshot, TierResidents, heap_top


def _min_max(values: Sequence[float]) -> list[float]:
    lo, hi = min(values), max(values)
    if hi == lo:
        return [0.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


def _recency_plus(snapshots: Sequence[Snapshot], scores: Sequence[float], weight: float) -> list[float]:
    """recency + weight * score, both min-max normalized over the candidates (FLOP-aware and seglen)."""
    recency = _min_max([float(s.last_used) for s in snapshots])
    return [r + weight * g for r, g in zip(recency, _min_max(scores))]


class _TierScores:
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
        normalized (`_recency_plus`); of equals the least recently used."""
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
        utility = _min_max_array(recency) + weight * _min_max_array(score)
        ties = np.flatnonzero(utility == utility.min())
        best = ties[np.argmin(recency[ties])] if len(ties) > 1 else ties[0]
        return cols[2][best if index is None else index[best]]


def _min_max_array(values: np.ndarray) -> np.ndarray:
    """`_min_max` over an array: the same float64 operations, element by element."""
    lo, hi = values.min(), values.max()
    if hi == lo:
        return np.zeros(len(values))
    return (values - lo) / (hi - lo)


def _fast(policy, snapshots) -> bool:
    """Whether `snapshots` is a store's tier that `policy`'s per-tier index covers in full (it saw
    every snapshot the store holds); else the list path (a policy swapped into a filled store)."""
    return isinstance(snapshots, TierResidents) and policy._tracked() == len(snapshots.store)


def _lowest(snapshots: Sequence[Snapshot], utilities) -> Snapshot:
    """The candidate of lowest `utilities(snapshots)`; of equals the first, i.e. the least recently used."""
    require(len(snapshots) > 0, "snapshots", "nothing to evict")
    utility = utilities(snapshots)
    return snapshots[min(range(len(snapshots)), key=lambda i: (utility[i], i))]


class FlopAwareEviction:
    """Evict the lowest `recency + alpha * FLOPs-saved-per-byte` (both min-max normalized)."""

    name = "flop_aware"

    def __init__(self, alpha: float = 1.0):
        require(alpha >= 0, "alpha", f"must be >= 0 (0 = LRU), got {alpha}")
        self.alpha = alpha
        self._scores = _TierScores()  # the held snapshots' recency and FLOPs per byte, per tier

    @staticmethod
    def efficiency(snap: Snapshot) -> float:
        return snap.flops_saved / max(snap.nbytes, 1)

    def utilities(self, snapshots: Sequence[Snapshot]) -> list[float]:
        """Each candidate's utility (see the module docstring); the lowest is evicted."""
        return _recency_plus(snapshots, [self.efficiency(s) for s in snapshots], self.alpha)

    def _tracked(self) -> int:
        return len(self._scores)

    def saved(self, snap: Snapshot) -> None:
        self._scores.add(snap, self.efficiency(snap))

    def evicted(self, snap: Snapshot) -> None:
        if self._scores.holds(snap):
            self._scores.remove(snap)

    def touched(self, snap: Snapshot) -> None:
        """A restore, refresh, demotion or promotion: its recency or tier changed."""
        if self._scores.holds(snap):
            self._scores.sync(snap)

    restored = demoted = touched

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The lowest utility, ties broken least recently used first."""
        if _fast(self, snapshots):
            return self._scores.lowest(snapshots.tier, snapshots.keep, self.alpha)
        return _lowest(snapshots, self.utilities)


SEGLEN_WEIGHT = 0.85  # seglen's weight of replay length against recency (the SGLang PR's example)


class SeglenEviction:
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
        self._scores = _TierScores()  # the held snapshots' recency and seglen, per tier

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

    def utilities(self, snapshots: Sequence[Snapshot]) -> list[float]:
        return _recency_plus(snapshots, [float(self.seglen(s)) for s in snapshots], self.weight)

    def _tracked(self) -> int:
        return len(self._scores)

    def touched(self, snap: Snapshot) -> None:
        """A restore, refresh, demotion or promotion: its recency or tier changed."""
        if self._scores.holds(snap):
            self._scores.sync(snap)

    restored = demoted = touched

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        """The lowest utility, ties broken least recently used first."""
        if _fast(self, snapshots):
            return self._scores.lowest(snapshots.tier, snapshots.keep, self.weight)
        return _lowest(snapshots, self.utilities)


class NextUseEviction:
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


class LearnedValueEviction:
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
        if _fast(self, snapshots):
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
        if _fast(self, snapshots):
            return mine > self._credit[self._lowest_in(snapshots.tier, snapshots.keep).key]
        return mine > min(self._held_credit(s) for s in snapshots)
