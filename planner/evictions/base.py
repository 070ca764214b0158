"""What a snapshot eviction is: the store's extension point (`EvictionPolicy`), whose hooks do
nothing by default, and a rule that hands every decision and event to another (`WrappedEviction`).

The store (`planner.snapshot_store.SnapshotStore`) calls every hook directly: a rule overrides the
ones it needs, so nothing is probed with `getattr`.
"""

from __future__ import annotations

from typing import Sequence

# `Snapshot` and `SnapshotStore` in the annotations are planner.snapshot_store's, named only: the
# store imports this module, and an import back (even under TYPE_CHECKING) would close a circle
# (tests/test_layering.py).

# The store's events and requests, in the order the docstring of `EvictionPolicy` lists them.
HOOKS = ("bind", "saved", "restored", "evicted", "demoted", "touched", "offered", "looked_up")


class EvictionPolicy:
    """Which snapshot leaves when a new one needs room; selected by name in `planner.evictions.registry`.

    * `choose_victim(snapshots, now)`: the snapshot to drop next, from the candidates of one tier in
      least-recently-used-first order (a `planner.snapshot_store.TierResidents`: a rule may read it
      as the list, or keep its own order per tier and ask the tier: `store`, `tier`, `keep`). The
      same rule picks who leaves each tier.
    * `admits(candidate, snapshots)`: asked only when a new snapshot needs an eviction to fit
      (speculative ones included): False keeps what is held and drops the new one (counted as
      `declined`). By default everything but a speculative capture is admitted.
    * Events, after the fact (default: nothing): `saved(snap)`, `restored(snap)`, `evicted(snap)`
      (it left the store), `demoted(snap)` (one tier down), `touched(snap)` (a refresh of a held
      prefix or a promotion: its recency or tier changed; what a rule's own per-tier order follows).
    * Requests, told before the store acts on them (default: nothing; a rule that replays the
      store's traffic on shadow stores reads them): `offered(token_ids, position, nbytes,
      block_hashes, flops_saved, origin)` for every `save` (a `refresh` of a held prefix is offered
      as a save of the held snapshot's kind); `looked_up(token_ids, max_position, block_hashes)`
      for every lookup a request acted on.
    * `bind(store)`: called once by the store that holds the rule (its block size, budgets, tiers).
    * `leaders()`: a run's record of which candidate rule decided (shadow_best's); None by default.
    * `needs_prefix = True`: the store keeps each snapshot's prompt block hashes and tokens
      (`Snapshot.prefix_hashes`, `prefix_tokens`) for the rule to read.

    A subclass sets `name` (its registry name, or a label for one built only in code).
    """

    name: str = ""
    needs_prefix: bool = False

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        raise NotImplementedError(f"{type(self).__name__} must implement choose_victim")

    def admits(self, candidate: Snapshot, snapshots: Sequence[Snapshot]) -> bool:
        """Everything but a speculative capture (no request asked for it: free memory only)."""
        return candidate.origin != "speculative"

    def bind(self, store: SnapshotStore) -> None:
        pass

    def saved(self, snap: Snapshot) -> None:
        pass

    def restored(self, snap: Snapshot) -> None:
        pass

    def evicted(self, snap: Snapshot) -> None:
        pass

    def demoted(self, snap: Snapshot) -> None:
        pass

    def touched(self, snap: Snapshot) -> None:
        pass

    def offered(self, token_ids, position: int, nbytes: int, block_hashes, flops_saved: float, origin: str) -> None:
        pass

    def looked_up(self, token_ids, max_position: int, block_hashes) -> None:
        pass

    def leaders(self) -> dict[str, int] | None:
        """For a rule that follows one of several candidates: the lookups each led at, by name (a
        run's record); None for a single rule."""
        return None


class WrappedEviction(EvictionPolicy):
    """A rule that is `base` in every decision and event; a subclass overrides what it changes (a
    gate on `admits`, a recorder around `choose_victim`). The base's hooks are bound onto the
    wrapper at construction: an event costs the wrapper nothing."""

    def __init__(self, base: EvictionPolicy, name: str | None = None):
        self.base = base
        self.name = base.name if name is None else name
        self.needs_prefix = base.needs_prefix
        for hook in HOOKS:
            setattr(self, hook, getattr(base, hook))

    def choose_victim(self, snapshots: Sequence[Snapshot], now: int) -> Snapshot:
        return self.base.choose_victim(snapshots, now)

    def admits(self, candidate: Snapshot, snapshots: Sequence[Snapshot]) -> bool:
        return self.base.admits(candidate, snapshots)
