"""The evictions' per-tier indexes (issue 32: a store's LRU heap, learned value's credit heaps,
FLOP-aware's and seglen's score arrays) pick exactly the victim, and admit exactly the snapshot, that
the same policy picks from the plain list of a tier's residents in LRU order (the rule as its
docstring states it). Random traffic over a device and two lower tiers, with refreshes, restores
from every tier, promotions and speculative offers; every decision is taken both ways and compared.
Were a store event not told (a refresh's new recency, a promotion's tier), an index would keep a
stale order and a comparison here fails."""

import random

import pytest

from planner.block_pool import hash_full_blocks
from planner.evictions.base import WrappedEviction
from planner.evictions.registry import get_eviction
from planner.snapshot_store import SnapshotStore, TierResidents
from planner.snapshot_tiers import Tier

BS = 4


class State:
    def __init__(self, nbytes):
        self.nbytes = nbytes


class BothWays(WrappedEviction):
    """Wraps a policy: each decision on a store's tier is taken on its index and on the plain list."""

    def __init__(self, policy):
        super().__init__(policy)
        self.policy = policy
        self.decisions = 0
        self.indexed = 0

    def choose_victim(self, snapshots, now):
        assert isinstance(snapshots, TierResidents)
        listed = list(snapshots)
        assert len(listed) == len(snapshots)
        assert [s.last_used for s in listed] == sorted(s.last_used for s in listed)
        fast = self.policy.choose_victim(snapshots, now)
        slow = self.policy.choose_victim(listed, now)  # the list path: what the rule's docstring says
        assert fast is slow, (self.name, fast.position, slow.position)
        self.decisions += 1
        return fast

    def admits(self, candidate, snapshots):
        fast = self.policy.admits(candidate, snapshots)
        assert fast == self.policy.admits(candidate, list(snapshots))
        self.decisions += 1
        return fast


def traffic(store, rng, steps):
    """Saves (varied sizes and origins), refreshes, lookups restored from any tier, on shared prefixes."""
    bases = [[rng.randrange(6) for _ in range(24)] for _ in range(4)]
    prompts = []
    for b in bases:
        for _ in range(3):  # prompts that share a base's first blocks and part of a block
            cut = rng.randrange(1, 24)
            p = b[:cut] + [rng.randrange(6) for _ in range(24 - cut)]
            prompts.append((p, hash_full_blocks(p, BS)))
    for _ in range(steps):
        tokens, hashes = prompts[rng.randrange(len(prompts))]
        r = rng.random()
        if r < 0.35:
            snap = store.lookup(tokens, rng.randrange(1, 25), hashes)
            if snap is not None:
                store.mark_restored(snap)
        elif r < 0.45:
            store.refresh(tokens, rng.randrange(1, 25), hashes)
        else:
            # a few sizes, so that FLOPs per byte differ and ties in credit and score occur
            store.save(tokens, rng.randrange(1, 25), State(rng.choice((1, 1, 2))), hashes,
                       flops_saved=float(rng.choice((1, 2, 3, 5))), origin=rng.choice(("mark", "decode", "speculative", "chunk")))


@pytest.mark.parametrize("name", ["lru", "flop_aware", "learned_value", "seglen", "shadow_best"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_indexed_decisions_equal_the_listed_ones(name, seed):
    rng = random.Random(seed)
    policy = BothWays(get_eviction(name))
    store = SnapshotStore(BS, byte_budget=5, eviction=policy,
                          lower_tiers=(Tier("host", 7, 1.0), Tier("disk", 6, 1.0)))
    traffic(store, rng, 1500)
    assert policy.decisions > 300
    assert store.stats.evicted > 50 and sum(store.stats.promoted.values()) > 20


@pytest.mark.parametrize("name", ["flop_aware", "learned_value", "seglen"])
def test_the_index_is_what_decides(name):
    """The fast path is taken (not the list path in disguise): the policy's index covers the store."""
    policy = get_eviction(name)
    store = SnapshotStore(BS, byte_budget=3, eviction=policy)
    traffic(store, random.Random(5), 300)
    assert policy._tracked() == len(store)
