"""FLOP-aware, next-use and learned-value eviction: exact victim order on tiny stores, and the FLOPs the
engine stamps on a snapshot (the count itself, `model.cost`, is pinned in tests/test_cost_model.py)."""

import dataclasses
import math
import random

import pytest

from model.families import PRESETS
from model.cost import ModelCost
from model.engine import Engine, EngineConfig
from model.engine import PlaceholderRunner
from planner.block_pool import hash_full_blocks
from planner.evictions.base import EvictionPolicy
from planner.evictions.flop_aware import FlopAwareEviction
from planner.evictions.learned_value import LearnedValueEviction
from planner.evictions.next_use import NextUseEviction
from planner.evictions.registry import EVICTION_POLICIES, get_eviction
from planner.scheduler import SchedulerConfig
from planner.evictions.lru import LRUEviction
from planner.snapshot_store import SnapshotStore


@dataclasses.dataclass
class Blob:
    nbytes: int = 100


class Recording(EvictionPolicy):
    """Wraps a policy and records the position of every victim, in order (its admission and
    observers are the base's, doing nothing, unless a test hands over the policy's own)."""

    def __init__(self, policy):
        self.policy, self.name, self.victims = policy, policy.name, []

    def choose_victim(self, snapshots, now):
        victim = self.policy.choose_victim(snapshots, now)
        self.victims.append(victim.position)
        return victim


TOKENS = list(range(64))


def save(store, pos, flops, nbytes=100, **kw):
    return store.save(TOKENS, pos, Blob(nbytes), hash_full_blocks(TOKENS, store.block_size), flops_saved=flops, **kw)


def restore(store, pos):
    snap = store.lookup(TOKENS, pos, hash_full_blocks(TOKENS, store.block_size))
    assert snap.position == pos
    store.mark_restored(snap)


def key_at(pos, block_size=4):
    return (hash_full_blocks(TOKENS[:pos], block_size)[-1], ())


# ---------------------------------------------------------------- victim order
def test_next_use_evicts_the_farthest_and_declines_what_comes_later():
    # snapshot at 4 is restored by request 5, at 8 by 3, at 12 by 10, at 16 by 1, at 20 never
    future = NextUseEviction({key_at(4): [5], key_at(8): [3], key_at(12): [10], key_at(16): [1, 7]})
    rec = Recording(future)
    rec.admits = future.admits
    store = SnapshotStore(block_size=4, byte_budget=200, eviction=rec)
    assert save(store, 4, 4.0) and save(store, 8, 8.0)
    assert not save(store, 12, 12.0)  # used at 10, after both held ones: declined, nothing evicted
    assert not save(store, 20, 20.0)  # never used again
    assert store.stats.declined == 2 and store.positions() == [4, 8]
    assert save(store, 16, 16.0)  # used at 1: the one used at 5 goes
    assert rec.victims == [4] and store.positions() == [8, 16]
    future.served(1)
    future.served(3)  # 8's only use is behind: next use inf, 16's is now 7
    assert future.next_use(key_at(8)) == math.inf and future.next_use(key_at(16)) == 7
    assert save(store, 4, 4.0)  # used at 5 again: evicts 8 (never used), not 16
    assert rec.victims == [4, 8] and store.positions() == [4, 16]


def test_next_use_with_no_known_use_declines_every_eviction():
    store = SnapshotStore(block_size=4, byte_budget=200, eviction=NextUseEviction({}))
    assert save(store, 4, 4.0) and save(store, 8, 8.0)
    assert not save(store, 12, 12.0)  # no use known: nothing is worth an eviction
    assert store.positions() == [4, 8] and store.stats.evicted == 0


def test_flop_aware_keeps_the_old_deep_snapshot_that_lru_drops():
    runs = {}
    for policy in (LRUEviction(), FlopAwareEviction(alpha=1.0)):
        rec = Recording(policy)
        store = SnapshotStore(block_size=4, byte_budget=300, eviction=rec)
        for pos in (12, 4, 8, 16, 20):  # flops = position, equal bytes: efficiency ~ depth
            assert save(store, pos, float(pos))
        runs[policy.name] = (rec.victims, store.positions())
    # LRU: the oldest first. FLOP-aware at the first eviction: recency 12:0 4:.5 8:1, efficiency
    # 12:1 4:0 8:.5 -> utility 1, .5, 1.5 -> 4. Then {12, 8, 16}: recency 0, 2/3, 1, efficiency
    # .5, 0, 1 -> .5, .67, 2 -> 12.
    assert runs["lru"] == ([12, 4], [8, 16, 20])
    assert runs["flop_aware"] == ([4, 12], [8, 16, 20])


def test_a_restore_refreshes_recency():
    rec = Recording(FlopAwareEviction(alpha=1.0))
    store = SnapshotStore(block_size=4, byte_budget=300, eviction=rec)
    for pos in (4, 8, 12):
        save(store, pos, float(pos))
    restore(store, 4)  # 4 becomes the newest: recency 8:0 12:.5 4:1, efficiency 8:.5 12:1 4:0
    save(store, 16, 16.0)  # utilities 8: .5, 12: 1.5, 4: 1.0 -> 8
    assert rec.victims == [8]
    assert store.positions() == [4, 12, 16]


def test_utility_tie_goes_to_the_least_recently_used():
    rec = Recording(FlopAwareEviction(alpha=1.0))
    store = SnapshotStore(block_size=4, byte_budget=200, eviction=rec)
    save(store, 8, 8.0)  # oldest, most FLOPs: 0 + 1 = 1
    save(store, 4, 4.0)  # newest, fewest FLOPs: 1 + 0 = 1
    save(store, 12, 12.0)
    assert rec.victims == [8]


def test_efficiency_is_per_byte_not_per_snapshot():
    rec = Recording(FlopAwareEviction(alpha=100.0))  # efficiency dominates recency
    store = SnapshotStore(block_size=4, byte_budget=450, eviction=rec)
    save(store, 4, 100.0, nbytes=100)  # 1.0 FLOP/byte
    save(store, 8, 150.0, nbytes=300)  # more FLOPs, 0.5 FLOP/byte
    save(store, 12, 120.0, nbytes=100)  # 1.2 FLOP/byte, needs 100 more bytes: evict one
    assert rec.victims == [8]
    assert store.positions() == [4, 12] and store.bytes_held == 200


def test_constant_efficiency_falls_back_to_lru():
    rec = Recording(FlopAwareEviction(alpha=5.0))
    store = SnapshotStore(block_size=4, byte_budget=200, eviction=rec)
    for pos in (4, 8, 12, 16):
        save(store, pos, 7.0)  # same FLOPs and bytes: efficiency is 0 for all, recency decides
    assert rec.victims == [4, 8]


@pytest.mark.parametrize("seed", range(3))
def test_alpha_zero_is_exactly_lru(seed):
    rnd = random.Random(seed)
    ops = [("save", rnd.randrange(1, 64), rnd.random() * 1e9) if rnd.random() < 0.7 else ("restore",)
           for _ in range(200)]

    def run(policy):
        rec = Recording(policy)
        store = SnapshotStore(block_size=4, byte_budget=500, eviction=rec)
        for op in ops:
            if op[0] == "save":
                save(store, op[1], op[2])
            elif len(store):
                restore(store, store.positions()[len(rec.victims) % len(store)])
        return rec.victims

    lru = run(LRUEviction())
    assert len(lru) > 20
    assert run(FlopAwareEviction(alpha=0.0)) == lru
    assert run(FlopAwareEviction(alpha=1.0)) != lru


def test_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        FlopAwareEviction(alpha=-1.0)
    with pytest.raises(ValueError, match="nothing to evict"):
        FlopAwareEviction().choose_victim([], 0)


def test_eviction_policies_by_name():
    assert sorted(EVICTION_POLICIES) == ["flop_aware", "learned_value", "lru", "seglen", "shadow_best"]
    assert all(EVICTION_POLICIES[name].name == name for name in EVICTION_POLICIES)
    assert isinstance(get_eviction("lru"), LRUEviction)
    tuned = get_eviction("flop_aware", alpha=0.5)
    assert isinstance(tuned, FlopAwareEviction) and tuned.alpha == 0.5
    assert get_eviction("flop_aware") is not get_eviction("flop_aware")  # a fresh policy each time
    policy = FlopAwareEviction()
    assert get_eviction(policy) is policy
    with pytest.raises(ValueError, match=r"^eviction: must be one of \['flop_aware', 'learned_value', 'lru', 'seglen', 'shadow_best'\], got 'fifo'"):
        get_eviction("fifo")
    with pytest.raises(ValueError, match="^alpha: not a parameter of eviction policy 'lru'"):
        get_eviction("lru", alpha=1.0)
    with pytest.raises(ValueError, match="^beta: not a parameter of eviction policy 'flop_aware'"):
        get_eviction("flop_aware", beta=1.0)
    with pytest.raises(ValueError, match="^alpha: must be >= 0"):
        get_eviction("flop_aware", alpha=-1.0)
    with pytest.raises(ValueError, match="^params:"):
        get_eviction(policy, alpha=1.0)


# ---------------------------------------------------------------- the FLOPs stamped
def test_engine_stamps_flops_saved_on_every_snapshot():
    cfg = SchedulerConfig(block_size=4, prefill_budget=8, num_kv_blocks=64, policy="aligned", snapshot_interval_blocks=1)
    flops = ModelCost(PRESETS["tiny"]).snapshot_flops
    engine = Engine(PlaceholderRunner(1, 64, 4), EngineConfig(cfg), eviction=FlopAwareEviction(), snapshot_flops=flops)
    req = engine.add_request(list(range(30)))
    engine.run_until_done()
    snaps = sorted(engine.snapshots._lru.values(), key=lambda s: s.position)
    assert [s.position for s in snaps] == req.metrics.snapshot_positions == [8, 16, 24]  # 24: the tail split point
    assert [s.flops_saved for s in snaps] == [flops(p) for p in (8, 16, 24)]
    assert flops(8) < flops(16) < flops(24)  # a deeper snapshot spares more
    assert engine.snapshots.eviction.name == "flop_aware"


# ---------------------------------------------------------------- learned value
def test_learned_value_prior_and_learning_per_origin_and_restore_count():
    lv = LearnedValueEviction(prior_hits=1, prior_misses=9)
    assert lv.probability("decode", 0) == pytest.approx(0.1)  # the prior alone
    store = SnapshotStore(block_size=4, byte_budget=200, eviction=lv)
    save(store, 4, 1000.0, origin="decode")
    restore(store, 4)  # a decode state with 0 restores was restored again: 1 success at level 0
    assert lv.probability("decode", 0) == pytest.approx(2 / 11)
    assert lv.probability("mark", 0) == pytest.approx(0.1)  # other origins keep the prior
    save(store, 8, 1.0, origin="chunk")
    assert not save(store, 12, 1.0, origin="chunk")  # full, and no better than the lowest held: declined
    assert save(store, 12, 2.0, origin="chunk")  # better: 8 goes, evicted with 0 restores
    assert store.positions() == [4, 12] and lv.probability("chunk", 0) == pytest.approx(1 / 11)
    for _ in range(5):
        restore(store, 4)
    assert lv.probability("decode", 3) == pytest.approx((3 + 1) / (3 + 10))  # levels 3, 4, 5 share the 3+ bucket


def test_learned_value_victims_admission_and_inflation():
    # budget 3 x 100 bytes; credit = inflation + p(origin, restores) * flops / 100
    lv = LearnedValueEviction(prior_hits=1, prior_misses=9)
    rec = Recording(lv)
    rec.admits, rec.saved, rec.restored, rec.evicted = lv.admits, lv.saved, lv.restored, lv.evicted
    store = SnapshotStore(block_size=4, byte_budget=300, eviction=rec)
    save(store, 4, 80.0, origin="mark")
    for _ in range(6):
        restore(store, 4)  # successes at levels 0, 1, 2 and three in the 3+ bucket
    assert lv.probability("mark", 3) == pytest.approx(4 / 13)  # credit 4/13 * 0.8 = 0.246
    save(store, 32, 60.0)  # chunk, prior 0.1: credit 0.06
    save(store, 36, 80.0)  # 0.08
    assert save(store, 40, 90.0)  # 0.09 beats the lowest held (0.06): the cheap unused one goes
    assert rec.victims == [32] and lv.inflation == pytest.approx(0.06)  # 40 credited 0.06 + 0.09
    assert lv.probability("chunk", 0) == pytest.approx(1 / 11)  # 32 left unrestored
    assert save(store, 44, 90.0)  # 0.06 + 0.9 / 11 = 0.142 > 0.08: 36 goes, inflation 0.08
    assert rec.victims == [32, 36] and lv.inflation == pytest.approx(0.08)
    assert not save(store, 48, 10.0)  # 0.08 + 0.1 / 12 = 0.088 < 0.15 (40): declined, nothing evicted
    assert store.stats.declined == 1 and rec.victims == [32, 36]
    assert save(store, 52, 500.0, origin="speculative")  # a speculative capture worth an eviction is admitted
    assert rec.victims == [32, 36, 40] and store.positions() == [4, 44, 52]  # the popular cheap state stays
    assert store.stats.saved_by_origin == {"mark": 1, "chunk": 4, "speculative": 1}
    assert store.stats.restored_tokens_by_origin == {"mark": 6 * 4}


def test_learned_value_restore_counts_outlive_an_eviction():
    def run(history):
        lv = LearnedValueEviction(history=history)
        store = SnapshotStore(block_size=4, byte_budget=100, eviction=lv)
        save(store, 4, 1.0, origin="mark")
        restore(store, 4)
        restore(store, 4)  # level 2
        save(store, 8, 1000.0)  # evicts 4 with two restores
        save(store, 4, 1e6, origin="mark")  # back (evicts 8)
        restore(store, 4)
        return lv

    assert run(history=16).probability("mark", 2) == pytest.approx(2 / 12)  # level 2: evicted once, restored once
    assert run(history=0).probability("mark", 0) == pytest.approx(3 / 12)  # forgotten: level 0 again
    with pytest.raises(ValueError, match=r"^history: must be >= 0, got -1"):
        LearnedValueEviction(history=-1)
