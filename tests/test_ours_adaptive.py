"""ours-adaptive: ours-plus's rules, its junction mark gated by the store's per-origin payback.

Expected marks are worked out from the rule in planner/policies/ours_adaptive.py: the junction is
`kv_match` when `restore_at < kv_match < total`; after 8 saved marks it is kept only while restored
tokens per saved mark >= restored tokens per saved decode state, or when the explore hash
`(kv_match * 2654435761 + total) mod 2^32 mod 8` is 0. With kv_match a multiple of 8, the
product is a multiple of 8 and so is 2^32, so the hash is `total mod 8`: total 40 explores, 41 does not.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest

from planner.policies.base import PlanContext
from planner.policies.ours_adaptive import ADAPTIVE_EXPLORE_EVERY, ADAPTIVE_WARMUP_MARKS, payback
from planner.policies.registry import get_policy
from planner.scheduler import Scheduler, SchedulerConfig
from planner.snapshot_store import SnapshotStats, SnapshotStore

ADAPTIVE, PLUS = get_policy("ours-adaptive"), get_policy("ours-plus")
KV, RESTORE, TOTAL, TOTAL_EXPLORES = 16, 0, 41, 40  # 41 % 8 = 1: not explored; 40 % 8 = 0: explored


def stats(marks_saved: int, mark_tokens: int, decode_saved: int, decode_tokens: int) -> SnapshotStats:
    return SnapshotStats(saved_by_origin=collections.Counter(mark=marks_saved, decode=decode_saved),
                         restored_tokens_by_origin=collections.Counter(mark=mark_tokens, decode=decode_tokens))


def ctx(st, bounded: bool = True) -> PlanContext:
    return PlanContext(16, snapshot_memory_bounded=bounded, snapshot_stats=st)


def test_constants_are_the_documented_ones():
    assert (ADAPTIVE_WARMUP_MARKS, ADAPTIVE_EXPLORE_EVERY) == (8, 8)


def test_engine_defaults_and_other_rules_are_ours_plus():
    for field in ("kv_block", "decode_grid", "match_unit", "eviction", "mark_mode", "needs_oracle"):
        assert getattr(ADAPTIVE, field) == getattr(PLUS, field), field
    c = ctx(stats(100, 0, 100, 10_000))  # marks shut: only marks() may differ
    for total in (1, 17, 2048, 5000):
        assert ADAPTIVE.speculative_marks(KV, RESTORE, total, c) == PLUS.speculative_marks(KV, RESTORE, total, c)
        assert ADAPTIVE.last_captures(0, total, total, c) == PLUS.last_captures(0, total, total, c)


@pytest.mark.parametrize("st, bounded, want", [
    (None, True, (KV,)),  # no counters (a context outside a scheduler): ours-plus's junction
    (stats(100, 0, 100, 10_000), False, (KV,)),  # no budget: ours-plus's junction
    (stats(7, 0, 100, 10_000), True, (KV,)),  # warm-up: 7 < 8 saved marks, admitted however they pay
    (stats(8, 0, 100, 10_000), True, ()),  # 0 tokens a mark < 100 a decode state: shut (41 % 8 != 0)
    (stats(40, 4_000, 100, 10_000), True, (KV,)),  # 100 == 100 tokens a save: admitted (>=)
    (stats(40, 3_999, 100, 10_000), True, ()),  # 99.975 < 100: shut
    (stats(40, 40, 0, 0), True, (KV,)),  # no decode state saved yet: its payback reads 0, marks pass
])
def test_junction_is_gated_by_payback(st, bounded, want):
    assert ADAPTIVE.marks(KV, RESTORE, TOTAL, ctx(st, bounded)) == want


def test_a_shut_gate_still_explores_one_junction_in_eight():
    shut = ctx(stats(40, 0, 100, 10_000))
    assert ADAPTIVE.marks(KV, RESTORE, TOTAL_EXPLORES, shut) == (KV,)
    explored = [t for t in range(KV + 1, KV + 1 + 80) if ADAPTIVE.marks(KV, RESTORE, t, shut)]
    assert explored == [t for t in range(KV + 1, KV + 81) if t % 8 == 0] and len(explored) == 10


def test_no_junction_no_mark_and_counters_untouched():
    st = SnapshotStats()  # empty counters: reading them must not insert an origin (the rows report them)
    assert ADAPTIVE.marks(KV, KV, TOTAL, ctx(st)) == ()  # restore point at the match: no junction
    assert ADAPTIVE.marks(KV, RESTORE, TOTAL, ctx(st)) == (KV,)
    assert payback(st, "decode") == 0.0 and st.saved_by_origin == {} and st.restored_tokens_by_origin == {}


def test_scheduler_hands_the_live_counters_and_contexts_compare_without_them():
    store = SnapshotStore(16, byte_budget=1 << 20)
    sched = Scheduler(SchedulerConfig(block_size=16, policy="ours-adaptive"), store)
    assert sched.context.snapshot_stats is store.stats and sched.context.snapshot_memory_bounded
    store.stats.saved_by_origin["mark"] += 40
    store.stats.saved_by_origin["decode"] += 1
    store.stats.restored_tokens_by_origin["decode"] += 100  # a decode state paid 100, marks nothing
    assert sched.policy.marks(KV, RESTORE, TOTAL, sched.context) == ()  # the gate reads the live store
    assert dataclasses.replace(sched.context, snapshot_stats=None) == sched.context
    hash(sched.context)  # hashable: the counters are out of the hash
