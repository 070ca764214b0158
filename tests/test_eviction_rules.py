"""Eviction and admission rules pinned by scripted save / restore / evict sequences (issue 23, item 2).

Every expected credit, probability, utility, inflation value, victim and counter below is worked
out by hand from the rule's own definition, written beside it:

* LRU and the store's budget, admission and counters: `planner/snapshot_store.py`'s docstrings
  (`SnapshotStore.save`: rejected when larger than the whole budget, speculative saves only into
  free memory unless the policy has `admits`, a duplicate save refreshes recency; `SnapshotStats`).
* FLOP-aware: Marconi (MLSys 2025, section 4.2) as written in `planner/evictions/`'s module
  docstring: utility = recency + alpha * efficiency, both min-max normalized over the held
  snapshots (a constant term is 0), lowest utility goes, ties in LRU order.
* Learned value: `LearnedValueEviction`'s docstring. credit = inflation + p(origin, restores) *
  flops_saved / nbytes, p = (again + prior_hits) / (again + evicted + prior_hits + prior_misses)
  per (origin, min(restores, 3)); a restore counts "restored again" at the level it had before the
  restore and the credit is then set at the new level; an eviction counts "evicted" at the held
  level; the victim is the lowest credit and inflation rises to it (GreedyDual, Young 1994); a new
  snapshot needing an eviction is admitted only if its credit is strictly above the lowest held;
  restore levels outlive an eviction for `history` keys (oldest forgotten first).
* Next use: Belady's MIN with bypass (`NextUseEviction`'s docstring).

States are tiny fakes (only `.nbytes` is read); prompts are `TOKENS` in blocks of `BS` tokens.
"""

import collections
import dataclasses
import math

import pytest

from planner.block_pool import hash_full_blocks
from planner.evictions.base import WrappedEviction
from planner.evictions.flop_aware import FlopAwareEviction
from planner.evictions.learned_value import LearnedValueEviction
from planner.evictions.next_use import NextUseEviction
from planner.evictions.registry import get_eviction
from planner.evictions.lru import LRUEviction
from planner.snapshot_store import SnapshotStats, SnapshotStore

BS = 4
TOKENS = list(range(64))
HASHES = hash_full_blocks(TOKENS, BS)


@dataclasses.dataclass
class Blob:
    nbytes: int = 100


class Recording(WrappedEviction):
    """A policy wrapper that records each victim's position and the candidates' utilities (if any);
    everything else (`admits`, observers) is the wrapped policy's own."""

    def __init__(self, policy):
        super().__init__(policy)
        self.policy = policy
        self.victims, self.utilities = [], []

    def choose_victim(self, snapshots, now):
        if hasattr(self.policy, "utilities"):
            self.utilities.append(self.policy.utilities(snapshots))
        victim = self.policy.choose_victim(snapshots, now)
        self.victims.append(victim.position)
        return victim

    def __getattr__(self, name):
        return getattr(self.policy, name)


def make_store(budget, policy):
    rec = Recording(policy)
    return SnapshotStore(BS, byte_budget=budget, eviction=rec), rec


def save(store, pos, flops=0.0, nbytes=100, origin="chunk"):
    return store.save(TOKENS, pos, Blob(nbytes), HASHES, flops_saved=flops, origin=origin)


def held(store, pos):
    snap = store.lookup(TOKENS, pos, HASHES)
    assert snap is not None and snap.position == pos
    return snap


def restore(store, pos, times=1):
    for _ in range(times):
        store.mark_restored(held(store, pos))


def key_at(pos):
    """`Snapshot.key` of a block-aligned position: (hash of the blocks below it, no partial tail)."""
    return (HASHES[pos // BS - 1], ())


def close(x):
    return pytest.approx(x, rel=1e-12, abs=1e-12)


# ================================================================ LRU and the store's budget
def test_lru_evicts_oldest_first():
    store, rec = make_store(300, get_eviction("lru"))
    for pos in (4, 8, 12, 16, 20):
        assert save(store, pos)
    assert rec.victims == [4, 8] and store.positions() == [12, 16, 20] and store.bytes_held == 300


def test_duplicate_save_refreshes_recency_order_and_clock():
    store, rec = make_store(300, get_eviction("lru"))
    for pos in (4, 8, 12):  # clock 1, 2, 3
        save(store, pos)
    assert save(store, 4)  # clock 4: same prefix, not stored twice, now the newest
    assert held(store, 4).last_used == 4
    assert (len(store), store.bytes_held, store.stats.duplicates, store.stats.saved) == (3, 300, 1, 3)
    save(store, 16)  # LRU order 8, 12, 4: 8 goes, not the re-saved 4
    save(store, 20)  # then 12
    assert rec.victims == [8, 12] and store.positions() == [4, 16, 20]


def test_restore_refreshes_recency_order():
    store, rec = make_store(300, get_eviction("lru"))
    for pos in (4, 8, 12):
        save(store, pos)
    restore(store, 4)  # clock 4; LRU order 8, 12, 4
    assert held(store, 4).last_used == 4 and held(store, 4).hits == 1
    save(store, 16)
    assert rec.victims == [8] and store.positions() == [4, 12, 16]


def test_snapshot_exactly_the_budget_fits_and_one_byte_over_is_rejected():
    store, rec = make_store(300, get_eviction("lru"))
    save(store, 4)
    save(store, 8)
    assert save(store, 12, nbytes=300)  # 300 <= 300: fits once both others are gone (300 + 0 <= 300)
    assert rec.victims == [4, 8] and store.positions() == [12] and store.bytes_held == 300
    assert not save(store, 16, nbytes=301)  # 301 > 300: rejected, nothing evicted for it
    assert store.stats.rejected == 1 and rec.victims == [4, 8] and store.bytes_held == 300
    empty, _ = make_store(300, get_eviction("lru"))
    assert save(empty, 4, nbytes=300) and empty.bytes_held == 300  # into an empty store, no eviction


def test_speculative_saves_fill_free_memory_only_and_never_evict():
    store, rec = make_store(300, get_eviction("lru"))
    assert save(store, 4)
    assert save(store, 8, origin="speculative")
    assert save(store, 12, origin="speculative")  # 200 + 100 = 300 is not over the budget: kept
    assert not save(store, 16, origin="speculative")  # 400 > 300: would evict, declined
    assert (store.stats.declined, store.stats.evicted, store.positions()) == (1, 0, [4, 8, 12])
    assert save(store, 8, origin="speculative")  # a held prefix is a duplicate (refreshed), even when full
    assert (store.stats.duplicates, store.stats.declined) == (1, 1)
    assert not save(store, 20, nbytes=301, origin="speculative")  # bigger than the budget: rejected, not declined
    assert (store.stats.rejected, store.stats.declined) == (1, 1)
    assert save(store, 16)  # a requested one evicts: LRU order 4, 12, 8 -> 4
    assert save(store, 24)  # -> 12, not 8 (refreshed by its duplicate save)
    assert rec.victims == [4, 12] and store.positions() == [8, 16, 24]


def test_snapshot_stats_after_a_script():
    store, _ = make_store(300, get_eviction("lru"))
    save(store, 4, origin="chunk")  # 1: saved 100 B
    save(store, 8, origin="mark")  # 2: saved
    save(store, 12, origin="speculative")  # 3: 300 B, exactly full
    save(store, 8, origin="mark")  # 4: duplicate; LRU order 4, 12, 8
    save(store, 16, origin="speculative")  # 5: declined
    save(store, 20, nbytes=400, origin="decode")  # 6: rejected
    restore(store, 12)  # 7: 100 B, 12 tokens of a speculative snapshot; order 4, 8, 12
    save(store, 24, nbytes=200, origin="decode")  # 8: 500 > 300 evicts 4 (400 > 300) and 8 (300): 200 B out
    assert store.positions() == [12, 24] and store.bytes_held == 300
    restore(store, 24, times=2)  # 2 x 200 B, 2 x 24 decode tokens
    restore(store, 12)  # 100 B, 12 more speculative tokens
    assert held(store, 12).hits == 2 and held(store, 24).hits == 2
    store.clear()  # evicts 12 and 24: 300 B more
    assert len(store) == 0 and store.bytes_held == 0
    assert store.stats == SnapshotStats(
        saved=4, saved_bytes=100 + 100 + 100 + 200,
        restored=4, restored_bytes=100 + 200 + 200 + 100,
        evicted=4, evicted_bytes=100 + 100 + 100 + 200,
        rejected=1, declined=1, duplicates=1,
        saved_by_origin=collections.Counter(chunk=1, mark=1, speculative=1, decode=1),
        restored_tokens_by_origin=collections.Counter(speculative=12 + 12, decode=24 + 24))


# ================================================================ FLOP-aware (Marconi)
def _flop_aware_store(alpha):
    """Four held snapshots (400 of 400 B) with last_used C=3, D=5, A=6, B=7 and FLOPs/byte
    C=4, D=0, A=1, B=2; then a 26-byte save needs one eviction (any one frees >= 25 B)."""
    store, rec = make_store(400, get_eviction("flop_aware", alpha=alpha))
    save(store, 4, flops=50, nbytes=50)  # A, clock 1: 1 FLOP/B
    save(store, 8, flops=200, nbytes=100)  # B, clock 2: 2
    save(store, 12, flops=100, nbytes=25)  # C, clock 3: 4
    save(store, 16, flops=0, nbytes=200)  # D, clock 4: 0 (375 B held)
    restore(store, 16)  # D: 5
    restore(store, 4)  # A: 6
    restore(store, 8)  # B: 7; LRU order C, D, A, B
    save(store, 20, flops=1, nbytes=26)  # clock 8: 401 > 400
    return store, rec


# candidates in LRU order C, D, A, B:
#   recency    (3, 5, 6, 7) - 3 over 7 - 3 = 0, 1/2, 3/4, 1
#   efficiency (4, 0, 1, 2) - 0 over 4 - 0 = 1, 0, 1/4, 1/2   (per byte: by FLOPs alone it would be
#                                                               100, 0, 50, 200 -> 1/2, 0, 1/4, 1)
@pytest.mark.parametrize("alpha, utilities, victim", [
    (0.0, [0.0, 0.5, 0.75, 1.0], 12),  # recency alone: LRU
    (0.25, [0.25, 0.5, 0.8125, 1.125], 12),
    (0.5, [0.5, 0.5, 0.875, 1.25], 12),  # C and D tie at 1/2: the least recently used (C) goes
    (1.0, [1.0, 0.5, 1.0, 1.5], 16),  # the old C outlives D by its FLOPs per byte
    (2.0, [2.0, 0.5, 1.25, 2.0], 16),
])
def test_flop_aware_exact_utilities_and_victim(alpha, utilities, victim):
    store, rec = _flop_aware_store(alpha)
    assert rec.utilities == [utilities]  # dyadic fractions: exact in floating point
    assert rec.victims == [victim]
    assert store.positions() == sorted({4, 8, 12, 16, 20} - {victim})


def test_flop_aware_constant_terms_are_zero():
    policy = FlopAwareEviction(alpha=1.0)
    store = SnapshotStore(BS, eviction=policy)
    save(store, 4, flops=300)
    assert policy.utilities([held(store, 4)]) == [0.0]  # one candidate: both terms constant -> 0 + 0
    save(store, 8, flops=300)
    save(store, 12, flops=300)  # same FLOPs per byte: efficiency 0 for all, utility = recency
    assert policy.utilities([held(store, p) for p in (4, 8, 12)]) == [0.0, 0.5, 1.0]


def test_flop_aware_duplicate_save_refreshes_recency():
    store, rec = make_store(300, get_eviction("flop_aware"))
    for pos in (4, 8, 12):  # clock 1, 2, 3; equal FLOPs per byte: recency decides
        save(store, pos, flops=100)
    save(store, 4, flops=100)  # duplicate, clock 4
    save(store, 16, flops=100)  # candidates 8, 12, 4: recency (2, 3, 4) -> 0, 1/2, 1
    assert rec.utilities == [[0.0, 0.5, 1.0]] and rec.victims == [8]


# ================================================================ learned value
def _teach(lv, store):
    """Four "mark" snapshots restored 0, 1, 2 and 7 times, then all evicted by `clear`.

    restored again (at the level before each restore) / evicted (at the held level), 3+ pooled:
      level 0: again B, C, D = 3; evicted A = 1       p = (3 + 1) / (4 + 10) = 2/7
      level 1: again C, D    = 2; evicted B = 1       p = (2 + 1) / (3 + 10) = 3/13
      level 2: again D       = 1; evicted C = 1       p = (1 + 1) / (2 + 10) = 1/6
      level 3+: again D at 3, 4, 5, 6 = 4; evicted D at 7 = 1   p = (4 + 1) / (5 + 10) = 1/3
    """
    for pos, restores in ((4, 0), (8, 1), (12, 2), (16, 7)):
        save(store, pos, flops=1.0, origin="mark")
        restore(store, pos, times=restores)
    store.clear()


def test_learned_value_learns_per_origin_and_level_with_3_plus_pooled():
    lv = LearnedValueEviction()
    _teach(lv, SnapshotStore(BS, eviction=lv))
    assert [lv.probability("mark", level) for level in (0, 1, 2, 3, 4, 9)] == \
        [close(2 / 7), close(3 / 13), close(1 / 6), close(1 / 3), close(1 / 3), close(1 / 3)]
    assert lv.probability("chunk", 0) == close(1 / 10)  # other origins keep the Beta(1, 9) prior
    assert lv.probability("chunk", 3) == close(1 / 10)
    assert lv.inflation == 0.0  # `clear` evicts without choosing a victim


# A probe "mark" snapshot (4200 FLOPs, 100 B: 42 per byte) after the teaching, restored k times;
# its credit (inflation 0) is read as the inflation it raises when chosen as the victim.
# The restore at level L first adds an "again" at L, then the credit uses the new level L + 1:
#   k=0: p(0) = 2/7                                   credit 42 * 2/7 = 12
#   k=1: level 0 again 4/1 -> 5/15; p(1) = 3/13        42 * 3/13        (old level: 42 * 1/3 = 14)
#   k=2: level 1 again 3/1 -> 4/14; p(2) = 1/6         42 / 6 = 7       (old level: 12)
#   k=3: level 2 again 2/1 -> 3/13; p(3+) = 1/3        14               (old level: 42 * 3/13)
#   k=4: level 3+ again 5/1 -> 6/16; p(3+) = 3/8       15.75            (no pooling: p(4) = 4/14 -> 12)
#   k=5: level 3+ again 6/1 -> 7/17; p(3+) = 7/17      42 * 7/17
@pytest.mark.parametrize("k, credit, before", [
    (0, 12.0, None),
    (1, 42 * 3 / 13, (0, 5 / 15)),
    (2, 7.0, (1, 4 / 14)),
    (3, 14.0, (2, 3 / 13)),
    (4, 15.75, (3, 6 / 16)),
    (5, 42 * 7 / 17, (3, 7 / 17)),
])
def test_learned_value_credit_at_each_restore_level(k, credit, before):
    lv = LearnedValueEviction()
    store = SnapshotStore(BS, eviction=lv)
    _teach(lv, store)
    save(store, 20, flops=4200.0, origin="mark")
    restore(store, 20, times=k)
    if before is not None:  # the level before the last restore learned one more "again"
        assert lv.probability("mark", before[0]) == close(before[1])
    assert lv.choose_victim([held(store, 20)], now=0).position == 20
    assert lv.inflation == close(credit)


def test_learned_value_greedy_dual_aging_and_restored_credit_through_the_store():
    # budget two 100-B snapshots; all "chunk", Beta(1, 9) prior; credit = inflation + p * FLOPs / 100
    lv = LearnedValueEviction()
    store, rec = make_store(200, lv)
    save(store, 4, flops=500)  # A: 0 + 0.1 * 5 = 0.5
    save(store, 8, flops=300)  # B: 0.3
    assert save(store, 12, flops=400)  # C asks 0.1 * 4 = 0.4 > min(0.5, 0.3): B goes, inflation 0.3
    assert rec.victims == [8] and lv.inflation == close(0.3)
    assert lv.probability("chunk", 0) == close(1 / 11)  # B evicted unrestored: 1 / (1 + 10)
    # C is credited after the eviction: 0.3 + 4/11 = 0.664
    assert save(store, 16, flops=300)  # D asks 0.3 + 3/11 = 0.573 > min(A 0.5, C 0.664): A goes
    assert rec.victims == [8, 4] and lv.inflation == close(0.5)  # aged: same FLOPs as B, yet A goes
    # D credited 0.5 + 3/12 = 0.75 (level 0 is now 1 / (2 + 10))
    assert not save(store, 20, flops=100)  # E asks 0.5 + 1/12 = 0.583 < min(C 0.664, D 0.75): declined
    assert store.stats.declined == 1 and rec.victims == [8, 4]
    restore(store, 12)  # C: "again" at level 0 -> 2/13; credit at level 1 (prior 0.1): 0.5 + 0.4 = 0.9
    assert lv.probability("chunk", 0) == close(2 / 13)
    assert save(store, 24, flops=1000)  # F asks 0.5 + 20/13 = 2.04 > min(C 0.9, D 0.75): D goes
    assert rec.victims == [8, 4, 16] and lv.inflation == close(0.75)
    # level 0 now 2 / 14 = 1/7; F credited 0.75 + 10/7
    assert save(store, 28, flops=2000)  # G asks 0.75 + 20/7 > min(C 0.9, F 2.18): C goes
    assert rec.victims == [8, 4, 16, 12]
    assert lv.inflation == close(0.5 + 0.1 * 4)  # C's credit used level 1; the old level would give 0.5 + 8/13
    assert lv.probability("chunk", 1) == close(1 / 11)  # C evicted at level 1
    assert save(store, 32, flops=10_000)  # H asks 0.9 + 100/7 > min(F, G 0.9 + 20/7): F goes
    assert rec.victims == [8, 4, 16, 12, 24]
    assert lv.inflation == close(0.75 + 10 / 7)  # F's credit: the inflation when saved + p * e
    assert store.positions() == [28, 32]
    assert (store.stats.saved, store.stats.evicted, store.stats.declined, store.stats.restored) == (7, 5, 1, 1)


def test_learned_value_admission_is_strict_and_covers_speculative_saves():
    lv = LearnedValueEviction()
    store, rec = make_store(100, lv)
    save(store, 4, flops=300)  # A: 0.1 * 3 = 0.3
    assert not save(store, 8, flops=300)  # asks exactly 0.3, not above 0.3: declined
    assert store.stats.declined == 1 and store.positions() == [4] and lv.inflation == 0.0
    assert save(store, 8, flops=301)  # 0.301 > 0.3: A goes
    assert rec.victims == [4] and lv.inflation == close(0.3)
    # B credited 0.3 + 1/11 * 3.01 = 0.5736 (A evicted unrestored: chunk level 0 is 1/11)
    assert not save(store, 12, flops=200, origin="speculative")  # 0.3 + 0.1 * 2 = 0.5 < 0.5736: declined
    assert save(store, 12, flops=300, origin="speculative")  # 0.3 + 0.3 = 0.6 > 0.5736: evicts B
    assert rec.victims == [4, 8] and lv.inflation == close(0.3 + 3.01 / 11)
    assert store.stats.declined == 2 and store.stats.saved_by_origin == {"chunk": 2, "speculative": 1}


def test_learned_value_ties_go_in_lru_order():
    lv = LearnedValueEviction()
    store, rec = make_store(200, lv)
    save(store, 4, flops=100)  # 0.1
    save(store, 8, flops=100)  # 0.1 as well
    save(store, 12, flops=1000)  # 1.0 > 0.1: the older of the two equal credits goes
    assert rec.victims == [4] and lv.inflation == close(0.1)


def test_learned_value_ghost_level_decides_admission_and_credit():
    lv = LearnedValueEviction()
    store, rec = make_store(100, lv)
    save(store, 4, flops=100, origin="mark")  # X: 0.1 * 1
    restore(store, 4, times=2)  # "again" at mark levels 0 and 1 (p 2/11 each); X at level 2 (p 0.1): 0.1
    save(store, 8, flops=1000)  # T asks 1.0 > 0.1: X goes at level 2, inflation 0.1
    assert rec.victims == [4] and lv.inflation == close(0.1)
    assert lv.probability("mark", 2) == close(1 / 11)
    # T credited 0.1 + 0.1 * 10 = 1.1. X comes back remembered at level 2 (p 1/11; level 0 is 2/11):
    assert not save(store, 4, flops=800, origin="mark")  # 0.1 + 8/11 = 0.83 < 1.1 (at level 0: 1.55)
    assert save(store, 4, flops=1200, origin="mark")  # 0.1 + 12/11 = 1.19 > 1.1: T goes, inflation 1.1
    assert rec.victims == [4, 8] and lv.inflation == close(1.1)
    save(store, 12, flops=10_000)  # asks 1.1 + 100/11 > X: X goes; its credit was set at level 2
    assert rec.victims == [4, 8, 4]
    assert lv.inflation == close(1.1 + 12 / 11)  # at level 0 it would be 1.1 + 24/11
    assert lv.probability("mark", 2) == close(1 / 12)  # evicted twice at level 2


# X ("mark") restored twice and Y ("decode") once, both evicted by `clear` (X first: LRU order),
# re-saved and restored once more. Remembered, the new "again" lands at the old level; forgotten,
# at level 0. Before that: mark 0: 1/0, 1: 1/0, 2: 0/1; decode 0: 1/0, 1: 0/1 (again/evicted).
X_REMEMBERED = {("mark", 0): 2 / 11, ("mark", 2): 2 / 12}
X_FORGOTTEN = {("mark", 0): 3 / 12, ("mark", 2): 1 / 11}
Y_REMEMBERED = {("decode", 0): 2 / 11, ("decode", 1): 2 / 12}
Y_FORGOTTEN = {("decode", 0): 3 / 12, ("decode", 1): 1 / 11}


@pytest.mark.parametrize("history, expected", [
    (2, {**X_REMEMBERED, **Y_REMEMBERED}),
    (1, {**X_FORGOTTEN, **Y_REMEMBERED}),  # the oldest ghost (X) is dropped, the newest kept
    (0, {**X_FORGOTTEN, **Y_FORGOTTEN}),  # nothing kept
])
def test_learned_value_ghost_history_is_bounded_oldest_first(history, expected):
    lv = LearnedValueEviction(history=history)
    store = SnapshotStore(BS, eviction=lv)
    save(store, 4, flops=1.0, origin="mark")
    restore(store, 4, times=2)
    save(store, 8, flops=1.0, origin="decode")
    restore(store, 8)
    store.clear()
    for pos, origin in ((4, "mark"), (8, "decode")):
        save(store, pos, flops=1.0, origin=origin)
        restore(store, pos)
    assert {key: lv.probability(*key) for key in expected} == {key: close(p) for key, p in expected.items()}


def test_learned_value_resave_takes_its_key_out_of_the_ghost_history():
    # history 3, a 200-B budget, all "mark". A re-saved key must not hold a ghost slot, or it
    # pushes out X's remembered level 2 (X's own re-save needs no eviction, so nothing else does).
    lv = LearnedValueEviction(history=3)
    store, rec = make_store(200, lv)
    save(store, 4, flops=100, origin="mark")  # X
    restore(store, 4, times=2)  # level 2, credit 0.1 * 1
    save(store, 8, flops=1e3, origin="mark")  # A: 2/11 * 10 = 1.8
    save(store, 12, flops=1e4, origin="mark")  # B evicts X (0.1): ghost X
    save(store, 16, flops=1e5, origin="mark")  # C evicts A (1.8): ghost X, A
    save(store, 8, flops=1e7, origin="mark")  # A again evicts B (18.3): ghost X, A, B, then A leaves it
    save(store, 20, flops=1e9, nbytes=50, origin="mark")  # D evicts C (168): ghost X, B, C (A left in: X dropped)
    save(store, 4, flops=1.0, nbytes=50, origin="mark")  # X again into free memory (150 + 50 B): level 2
    assert rec.victims == [4, 8, 12, 16] and store.positions() == [4, 8, 20]
    restore(store, 4)  # "again" at level 2: (1 + 1) / (1 + 1 + 10)
    assert lv.probability("mark", 2) == close(2 / 12)


def test_learned_value_credits_snapshots_held_before_it_was_swapped_in():
    store = SnapshotStore(BS, byte_budget=200)  # LRU first
    save(store, 4, flops=100)
    save(store, 8, flops=300)
    lv = store.eviction = LearnedValueEviction()
    assert save(store, 12, flops=200)  # held ones credited now: 0.1 and 0.3; asks 0.2 > 0.1: 4 goes
    assert store.positions() == [8, 12] and lv.inflation == close(0.1)


def test_learned_value_prior_is_beta_hits_misses():
    lv = LearnedValueEviction(prior_hits=2, prior_misses=3)
    assert lv.probability("chunk", 0) == close(2 / 5)
    store = SnapshotStore(BS, eviction=lv)
    save(store, 4)
    store.clear()  # evicted unrestored: 2 / (1 + 5)
    assert lv.probability("chunk", 0) == close(2 / 6)
    save(store, 8)
    restore(store, 8)  # again at level 0: (1 + 2) / (2 + 5)
    assert lv.probability("chunk", 0) == close(3 / 7)
    assert lv.probability("chunk", 1) == close(2 / 5)


# ================================================================ next use (Belady MIN with bypass)
def test_next_use_victims_bypass_and_served():
    # future restores: 4 by request 6, 8 by 2 and 9, 12 by 4, 16 by 6, 20 never
    future = NextUseEviction({key_at(4): [6], key_at(8): [9, 2, 2], key_at(12): [4], key_at(16): [6]})
    store, rec = make_store(300, future)
    for pos in (4, 8, 12):
        assert save(store, pos)
    assert held(store, 8).key == key_at(8)
    assert [future.next_use(key_at(p)) for p in (4, 8, 12, 20)] == [6, 2, 4, math.inf]
    assert not save(store, 16)  # next use 6 is no sooner than the farthest held (4's 6): bypassed
    assert not save(store, 20)  # never used
    assert store.stats.declined == 2 and rec.victims == []
    future.served(2)  # 8's next use is now 9
    assert save(store, 16)  # 6 < 9: admitted, the farthest (8) goes
    assert rec.victims == [8] and store.positions() == [4, 12, 16]
    future.served(6)
    future.served(4)  # 4, 12 and 16 have no use left
    restore(store, 4)  # LRU order 12, 16, 4
    assert save(store, 8)  # 9 < inf: admitted; all held tie at inf -> the least recently used, 12
    assert rec.victims == [8, 12] and store.positions() == [4, 8, 16]


def test_next_use_skips_every_served_request_at_the_head():
    future = NextUseEviction({key_at(4): [8, 3, 1]})
    future.served(1)
    future.served(3)  # both served before anyone asked
    assert future.next_use(key_at(4)) == 8
    future.served(8)
    assert future.next_use(key_at(4)) == math.inf


# ================================================================ policies by name
def test_get_eviction_builds_fresh_policies_by_name():
    assert type(get_eviction("lru")) is LRUEviction
    lv = get_eviction("learned_value", prior_hits=2.0, prior_misses=3.0, history=5)
    assert type(lv) is LearnedValueEviction and lv.prior == (2.0, 3.0) and lv.history == 5
    assert lv.probability("chunk", 0) == close(2 / 5)
    first, second = get_eviction("learned_value"), get_eviction("learned_value")
    store = SnapshotStore(BS, eviction=first)
    save(store, 4)
    store.clear()  # first learns a miss: 1/11; second keeps the prior
    assert (first.probability("chunk", 0), second.probability("chunk", 0)) == (close(1 / 11), close(1 / 10))
    future = NextUseEviction({})
    assert get_eviction(future) is future


@pytest.mark.parametrize("name, params, message", [
    ("next_use", {}, r"^eviction: must be one of \['flop_aware', 'learned_value', 'lru', 'seglen', 'shadow_best'\], got 'next_use'"),
    ("LRU", {}, r"^eviction: must be one of .* got 'LRU'"),
    ("lru", {"history": 1}, r"^history: not a parameter of eviction policy 'lru' \(it takes none\)"),
    ("learned_value", {"alpha": 1.0},
     r"^alpha: not a parameter of eviction policy 'learned_value' \(it takes \['history', 'prior_hits', 'prior_misses'\]\)"),
    ("learned_value", {"prior_hits": 0}, r"^prior_hits: the prior's counts must be > 0"),
    ("learned_value", {"prior_misses": -1.0}, r"^prior_hits: the prior's counts must be > 0"),
    ("learned_value", {"history": -1}, r"^history: must be >= 0, got -1"),
    ("flop_aware", {"alpha": -0.5}, r"^alpha: must be >= 0"),
])
def test_get_eviction_errors(name, params, message):
    with pytest.raises(ValueError, match=message):
        get_eviction(name, **params)


def test_get_eviction_rejects_params_with_a_policy_object():
    with pytest.raises(ValueError, match=r"^params: given with a policy object, not a name: \['history'\]"):
        get_eviction(LearnedValueEviction(), history=3)


# ================================================================ edges a mutation run found unpinned
def test_documented_defaults():
    # Marconi's exchange rate 1 (module docstring); the learned chance's Beta(1, 9) prior (0.1 before
    # any outcome) and 4,096 remembered keys (`LearnedValueEviction` docstring).
    assert FlopAwareEviction().alpha == 1.0
    lv = LearnedValueEviction()
    assert lv.prior == (1.0, 9.0) and lv.history == 4096 and lv.probability("chunk", 0) == close(0.1)


@pytest.mark.parametrize("policy", [FlopAwareEviction(), LearnedValueEviction(), NextUseEviction({})])
def test_choose_victim_from_nothing_names_the_argument(policy):
    with pytest.raises(ValueError, match="snapshots: nothing to evict"):
        policy.choose_victim([], now=1)


@pytest.mark.parametrize("policy", [FlopAwareEviction(), LearnedValueEviction(), NextUseEviction({})])
def test_a_lone_snapshot_is_the_victim(policy):
    # Budget of one snapshot: the second save (no `admits` objection for NextUse needs a known use,
    # so ask the policy directly) evicts the only candidate.
    store, rec = make_store(100, LRUEviction())
    save(store, 4)
    only = held(store, 4)
    assert policy.choose_victim([only], now=2) is only


def test_next_use_never_admits_what_no_request_will_use():
    # MIN with bypass: a snapshot with no future restore is not worth memory, even with nothing held.
    store, _ = make_store(None, LRUEviction())
    save(store, 4)
    assert NextUseEviction({}).admits(held(store, 4), []) is False
    assert NextUseEviction({key_at(4): [3]}).admits(held(store, 4), []) is True


def test_learned_value_judges_a_new_key_at_restore_level_0():
    lv = LearnedValueEviction()
    store, rec = make_store(200, lv)
    save(store, 4, flops=100)  # "chunk", level 0: 0.1 * 100 / 100 = 0.1
    save(store, 8, flops=100, origin="mark")  # 0.1
    restore(store, 8)  # mark: again at level 0 -> p(mark, 0) = 2/11; held at level 1: p 1/10 -> 0.1
    # A new mark at 80 FLOPs / 100 bytes: level 0 credit 0.8 * 2/11 = 0.145 > 0.1 (at level 1 it
    # would be 0.08 < 0.1 and declined): admitted, the chunk snapshot (first of the 0.1 ties) goes.
    assert save(store, 12, flops=80, origin="mark")
    assert rec.victims == [4] and lv.inflation == close(0.1)


def test_learned_value_counts_snapshots_it_never_saw_at_level_0():
    # Swapped in over a store that LRU filled: a restore of an unseen snapshot is "restored again"
    # at level 0, an eviction of an unseen one "evicted" at level 0.
    store, _ = make_store(None, LRUEviction())
    save(store, 4, origin="mark")
    save(store, 8, origin="decode")
    lv = LearnedValueEviction()
    store.eviction = lv
    restore(store, 4)
    assert lv.probability("mark", 0) == close(2 / 11) and lv.probability("mark", 1) == close(0.1)
    store.clear()  # 4 evicted at level 1, 8 (never seen) at level 0
    assert lv.probability("decode", 0) == close(1 / 11) and lv.probability("mark", 1) == close(1 / 11)


def test_learned_value_prior_counts_must_be_positive():
    with pytest.raises(ValueError, match="prior_hits"):
        LearnedValueEviction(prior_hits=0.0)
    with pytest.raises(ValueError, match="prior_hits"):
        LearnedValueEviction(prior_misses=0.0)
    assert LearnedValueEviction(prior_hits=1e-9, prior_misses=1e-9).probability("chunk", 0) == close(0.5)


def test_zero_byte_snapshots_are_scored_per_byte_as_one_byte():
    # `max(nbytes, 1)`: a state that holds nothing (a model without SSM layers) must not divide by 0.
    store, rec = make_store(None, LRUEviction())
    save(store, 4, flops=5, nbytes=0)  # clock 1, efficiency 5 / 1
    save(store, 8, flops=100, nbytes=100)  # clock 2, efficiency 1
    a, b = held(store, 4), held(store, 8)
    assert FlopAwareEviction().utilities([a, b]) == [0.0 + 1.0, 1.0 + 0.0]
    lv = LearnedValueEviction()
    lv_store, lv_rec = make_store(100, lv)
    save(lv_store, 4, flops=5, nbytes=0)  # 0.1 * 5 / 1 = 0.5
    save(lv_store, 8, flops=10, nbytes=100)  # 0.1 * 10 / 100 = 0.01
    save(lv_store, 12, flops=1000, nbytes=100)  # 1.0 beats 0.01: 8 goes, the empty one stays
    assert lv_rec.victims == [8] and lv.inflation == close(0.01)


# ---------------------------------------------------------------- the store's own checks and edges
def test_store_accepts_the_smallest_block_and_a_zero_budget():
    one = SnapshotStore(1)
    assert one.save(TOKENS, 3, Blob(), hash_full_blocks(TOKENS, 1)) and one.positions() == [3]
    zero = SnapshotStore(BS, byte_budget=0)
    assert not save(zero, 4) and zero.stats.rejected == 1  # 100 > 0 bytes
    assert save(zero, 8, nbytes=0) and zero.positions() == [8]  # 0 <= 0: fits
    with pytest.raises(ValueError, match="block_size"):
        SnapshotStore(0)
    with pytest.raises(ValueError, match="byte_budget"):
        SnapshotStore(BS, byte_budget=-1)


def test_save_position_is_within_the_tokens():
    store, _ = make_store(None, LRUEviction())
    assert save(store, len(TOKENS))  # the whole prompt: position == len(token_ids) is allowed
    assert store.positions() == [64]
    with pytest.raises(ValueError, match="position"):
        save(store, 0)
    with pytest.raises(ValueError, match="position"):
        save(store, len(TOKENS) + 1)


def test_lookup_walks_only_the_hashes_it_is_given():
    # A caller that knows the hashes of the first 2 blocks only (8 tokens) can find what lies at or
    # below them, even when asked for more: 12 is held, but its anchor is the third block's hash.
    store, _ = make_store(None, LRUEviction())
    save(store, 6)
    save(store, 12)
    assert store.lookup(TOKENS, 64, HASHES[:2]).position == 6
    assert store.lookup(TOKENS, 64, HASHES).position == 12
