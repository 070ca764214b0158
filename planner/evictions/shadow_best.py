"""Shadow-best eviction (`shadow_best`, ours-plus's own): follow whichever of a few candidate rules
would have restored the most tokens over the recent past, judged on shadow stores that replay the
real store's traffic.

Why: under a device-only budget no single rule wins every budget on the Mooncake trace with
ours-plus's placement (results/LOG.md, 2026-12-03 seventh session; restored tokens, first 1,000
requests, chains): LRU with speculative and chunk-end captures kept out of a full store is best at
0.25 GB (494,080; learned value 438,784), learned value with that gate at 4 GB (1,159,171 vs
915,503 ungated), seglen with it at 16 GB (1,842,270 vs 1,722,593), and ungated learned value at
64 GB (2,249,716 vs 2,192,869 gated). Which one tops a budget also moves with the window. Marconi
picks its eviction's alpha the same way, by replaying past requests over a grid (MLSys 2025);
this policy does it continuously, the way adaptive caches choose between experts by
keeping a shadow ("virtual") cache of each (ACME, Ari et al., 2002; set dueling in CPU caches,
Qureshi et al., ISCA 2007).

How: every candidate (`CANDIDATES`) runs twice. Its shadow store (`SnapshotStore` of the real one's
budgets, tiers without spill files, and states that are only byte counts) sees every save the real
store is offered and every lookup the real store answers, restoring what it holds; its restored
tokens are its score, decayed with a half-life of `half_life` lookups so a run that changes regime
changes leader. Its real-side instance observes the real store's saves, restores and evictions, so
it is ready to decide for the real store at any moment. The real store's victims and admissions
are the leader's. A challenger takes the lead only with a score more than `switch_margin` (5%)
above the leader's (the first of the highest; the first candidate, ungated learned value, leads
until then). Why a margin: a new leader inherits a store its rule did not fill, so its shadow's
score is not what it brings at once. With no margin, at 64 GB (Mooncake first 1,000, chains) the
lead went back and forth between learned value and its gated twin, and the real store restored
2,183,494 tokens against 2,249,716 for learned value alone; at 16 GB, 1,762,368 against 1,842,270
for gated seglen alone. With 5%: 2,249,716 and 1,842,209. The margin was picked from 0 / 0.05 /
0.2 on that window and requests 5,000-5,999 (0.2 kept learned value too long: -12% at 0.25 GB) and
checked on requests 2,000-2,999, which it did not see: 0.25 / 4 / 16 / 64 GB 485,376 / 955,484 /
1,446,809 / 1,998,338 against 492,544 / 765,334 / 1,424,614 / 2,012,382 with no margin
(results/LOG.md, eighth session). Shadows are approximate in one way: the real store's restores
decide where a request's junction mark lies, and so what every shadow is offered.

Cost: each shadow keeps keys and byte counts, no states; it adds one store's bookkeeping per
candidate to every save and lookup. A simulated Mooncake window of 1,000 requests (Bamba-9B) runs
in ~25 s instead of ~20 s at 0.25-4 GB, ~100 s instead of ~28 s at 64 GB (1,024 snapshots scanned
per eviction, five times), ~60 s with a 256 GB host tier.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from kernels.checks import require
from planner.evictions.base import EvictionPolicy, WrappedEviction
from planner.evictions.learned_value import LearnedValueEviction
from planner.evictions.lru import LRUEviction
from planner.evictions.seglen import SeglenEviction
from planner.snapshot_store import Snapshot, SnapshotStore

FREE_MEMORY_ONLY = ("speculative", "chunk")  # origins a gated candidate never evicts for
SWITCH_MARGIN = 0.05  # a challenger leads only > 5% above the leader: each switch costs (module docstring)
SHADOW_HALF_LIFE = 1024  # lookups; about the Mooncake windows of 1,000 requests the factorial studies


class GatedEviction(WrappedEviction):
    """An eviction whose store takes snapshots of `origins` into free memory only (never evicting
    for them); everything else is as `base` decides."""

    def __init__(self, base: EvictionPolicy, origins: Sequence[str] = FREE_MEMORY_ONLY):
        super().__init__(base, f"{base.name}+gate")
        self.origins = frozenset(origins)

    def admits(self, candidate: Snapshot, snapshots: Sequence[Snapshot]) -> bool:
        return candidate.origin not in self.origins and self.base.admits(candidate, snapshots)


def _learned_value():
    return LearnedValueEviction()


def _seglen():
    return SeglenEviction()


# name -> a fresh instance; the first is the default leader (ours-plus's eviction before this one)
CANDIDATES = {
    "learned_value": _learned_value,
    "learned_value+gate": lambda: GatedEviction(_learned_value()),
    "seglen+gate": lambda: GatedEviction(_seglen()),
    "lru+gate": lambda: GatedEviction(LRUEviction()),
}


@dataclasses.dataclass(eq=False)
class _Bytes:
    """A shadow's stand-in for a state: its size only."""

    nbytes: int


class ShadowBestEviction(EvictionPolicy):
    """Follow the candidate rule whose shadow store restored the most tokens lately (module docstring);
    `half_life` in lookups (`float("inf")`: no decay, the restored tokens of the whole run);
    `switch_margin`: how far above the leader's score (a fraction of it) a challenger must be to lead."""

    name = "shadow_best"

    def __init__(self, half_life: float = SHADOW_HALF_LIFE, switch_margin: float = SWITCH_MARGIN):
        require(half_life > 0, "half_life", f"must be > 0 lookups, got {half_life}")
        require(switch_margin >= 0, "switch_margin", f"must be >= 0, got {switch_margin}")
        self.half_life = half_life
        self.switch_margin = switch_margin
        self._decay = 0.5 ** (1.0 / half_life)
        self.names = tuple(CANDIDATES)
        self._real = [CANDIDATES[n]() for n in self.names]
        self.needs_prefix = any(p.needs_prefix for p in self._real)
        self._shadows: list[SnapshotStore] = []
        self._bound = False
        self.scores = [0.0] * len(self.names)
        self.leader = 0
        self.lookups_led = [0] * len(self.names)  # lookups each candidate led at (a run's record)

    def bind(self, store: SnapshotStore) -> None:
        """Called by the real store: the shadows take its block, budgets and tiers (without spill files)."""
        require(not self._bound, "store", "this shadow_best policy already serves a store")
        self._bound = True
        if store.byte_budget is not None:  # unbounded, every candidate keeps everything: no shadows
            tiers = [dataclasses.replace(t, spill=None) for t in store.lower_tiers]
            self._shadows = [SnapshotStore(store.block_size, store.byte_budget, CANDIDATES[n](), tiers)
                             for n in self.names]
        for policy in self._real:
            policy.bind(store)

    def leaders(self) -> dict[str, int]:
        """The lookups each candidate led at, by name."""
        return dict(zip(self.names, self.lookups_led))

    @property
    def leader_name(self) -> str:
        return self.names[self.leader]

    @property
    def shadows(self) -> dict[str, SnapshotStore]:
        """Each candidate's shadow store by name (empty for an unbounded store)."""
        return dict(zip(self.names, self._shadows))

    @property
    def deciders(self) -> dict[str, object]:
        """Each candidate's real-side instance by name (the leader's decides for the real store)."""
        return dict(zip(self.names, self._real))

    # -- the real store's traffic, replayed on the shadows
    def offered(self, token_ids, position: int, nbytes: int, block_hashes, flops_saved: float, origin: str) -> None:
        for shadow in self._shadows:
            shadow.save(token_ids, position, _Bytes(nbytes), block_hashes, flops_saved, origin)

    def looked_up(self, token_ids, max_position: int, block_hashes) -> None:
        for i, shadow in enumerate(self._shadows):
            self.scores[i] *= self._decay
            snap = shadow.lookup(token_ids, max_position, block_hashes)
            if snap is not None:
                shadow.mark_restored(snap)
                self.scores[i] += snap.position
        best = max(range(len(self.scores)), key=lambda i: (self.scores[i], -i))
        if self.scores[best] > self.scores[self.leader] * (1.0 + self.switch_margin):
            self.leader = best
        self.lookups_led[self.leader] += 1

    # -- the real store's decisions: the leader's
    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        return self._real[self.leader].choose_victim(snapshots, now)

    def admits(self, candidate: Snapshot, snapshots: Sequence[Snapshot]) -> bool:
        return self._real[self.leader].admits(candidate, snapshots)

    # -- the real store's events: every real-side candidate keeps up
    def saved(self, snap: Snapshot) -> None:
        for policy in self._real:
            policy.saved(snap)

    def restored(self, snap: Snapshot) -> None:
        for policy in self._real:
            policy.restored(snap)

    def evicted(self, snap: Snapshot) -> None:
        for policy in self._real:
            policy.evicted(snap)

    def demoted(self, snap: Snapshot) -> None:
        for policy in self._real:
            policy.demoted(snap)

    def touched(self, snap: Snapshot) -> None:
        for policy in self._real:
            policy.touched(snap)
