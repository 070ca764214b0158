"""SGLang's `seglen` eviction (planner.evictions.seglen.SeglenEviction) through the snapshot store: the
ancestry it keeps, the replay lengths it reads off it, and the victims it picks, each derived by
hand from the rule in its docstring:

    utility(s) = recency(s) + weight * seglen(s), both min-max normalized over the candidates
    seglen(s)  = s.position - (position of the deepest other held snapshot on s's prefix, else 0)

Block 4 throughout; every snapshot 1 byte, so a budget of k bytes holds k snapshots.
"""

import pytest

from planner.block_pool import hash_full_blocks
from planner.evictions.seglen import SEGLEN_WEIGHT, SeglenEviction
from planner.evictions.registry import EVICTION_POLICIES, get_eviction
from planner.snapshot_store import SnapshotStore

BS = 4


class State:
    nbytes = 1


def store(budget=None, weight=SEGLEN_WEIGHT):
    return SnapshotStore(BS, byte_budget=budget, eviction=SeglenEviction(weight))


def save(st, tokens, position):
    assert st.save(tokens, position, State(), hash_full_blocks(tokens, BS))
    return st.lookup(tokens, position, hash_full_blocks(tokens, BS))


P = list(range(100, 132))  # one 32-token prompt
Q = list(range(200, 232))  # another, sharing nothing with P
P_BRANCH = P[:12] + list(range(900, 920))  # P's first 12 tokens (3 blocks), then its own


def test_registered_by_name_with_the_prs_weight():
    assert EVICTION_POLICIES["seglen"] is SeglenEviction
    policy = get_eviction("seglen")
    assert policy.weight == 0.85 and policy.needs_prefix
    with pytest.raises(ValueError, match="^weight: must be >= 0"):
        SeglenEviction(-0.1)


def test_store_keeps_prefixes_only_for_an_eviction_that_asks():
    plain = SnapshotStore(BS)
    assert plain.save(P, 8, State(), hash_full_blocks(P, BS))
    held = plain.lookup(P, 8, hash_full_blocks(P, BS))
    assert held.prefix_hashes is None and held.prefix_tokens is None
    st = store()
    snap = save(st, P, 8)
    assert list(snap.prefix_hashes[:2]) == hash_full_blocks(P, BS)[:2]
    assert list(snap.prefix_tokens) == P[:8]  # its own tokens, not the request's longer list
    assert st.eviction.block_size == BS


def test_seglen_is_the_replay_to_the_nearest_held_ancestor():
    st = store()
    p8, p16, q12 = save(st, P, 8), save(st, P, 16), save(st, Q, 12)
    pol = st.eviction
    # p8 has no ancestor: 8 - 0; p16 sits on p8: 16 - 8; q12 shares nothing: 12
    assert [pol.seglen(s) for s in (p8, p16, q12)] == [8, 8, 12]
    branch = save(st, P_BRANCH, 20)  # P's blocks 0-2 then its own: p8 (2 blocks) is on its prefix, p16 is not
    assert pol.seglen(branch) == 20 - 8


def test_a_shallower_save_relinks_the_deeper_one_above_it():
    st = store()
    p24 = save(st, P, 24)
    assert st.eviction.seglen(p24) == 24
    save(st, P, 12)  # now between 0 and 24 on the same prefix
    assert st.eviction.seglen(p24) == 24 - 12
    q8 = save(st, Q, 8)  # another prefix: relinks nothing of P
    assert st.eviction.seglen(p24) == 12 and st.eviction.seglen(q8) == 8


def test_inside_one_block_the_tail_tokens_decide():
    st = store()
    a = save(st, P, 13)  # 3 full blocks + tail (112,)
    other = P[:13] + [0, 0, 0]  # same first 13 tokens; 14 diverges
    b = save(st, other, 14)  # same anchor, tail (112, 0): a is on its prefix
    assert st.eviction.seglen(b) == 1
    c = save(st, P[:12] + [7, 7, 7], 14)  # same anchor, tail (7, 7): a (tail 112) is not
    assert st.eviction.seglen(c) == 14  # nothing held lies on its prefix


def test_below_a_deeper_block_the_partial_block_is_compared_token_by_token():
    st = store()
    save(st, P, 13)  # 3 full blocks + tail (112,)
    keeps = save(st, P[:13] + list(range(950, 969)), 20)  # token 12 is P's: 13 lies on its prefix
    assert st.eviction.seglen(keeps) == 20 - 13
    parts = save(st, P[:12] + list(range(970, 990)), 20)  # blocks 0-2 hash alike, token 12 differs
    assert st.eviction.seglen(parts) == 20  # on full blocks alone it would read 20 - 13


def test_ancestry_stays_exact_when_an_eviction_hands_children_up():
    # 13 and 14 part inside block 3 (tails (112,) and (300, 301)); 20 and, later, 17 follow 14's
    # tokens. 14 evicted, 20 has no held ancestor; 17 then lies between 0 and 20. On full blocks
    # alone 13 would pass for 17's ancestor, and 20 (a root) would never be re-linked under 17.
    st = store()
    a = save(st, P, 13)
    tokens_b = P[:12] + [300, 301] + list(range(400, 420))
    b, c = save(st, tokens_b, 14), save(st, tokens_b, 20)
    pol = st.eviction
    assert [pol.seglen(s) for s in (a, b, c)] == [13, 14, 20 - 14]
    st._evict(b)
    assert pol.seglen(c) == 20
    save(st, tokens_b, 17)
    assert pol.seglen(c) == 20 - 17


def test_eviction_moves_children_up_to_the_grandparent():
    st = store()
    save(st, P, 8)
    p16, p24 = save(st, P, 16), save(st, P, 24)
    pol = st.eviction
    assert pol.seglen(p24) == 8
    st._evict(p16)
    assert pol.seglen(p24) == 24 - 8
    st._evict(st.lookup(P, 8, hash_full_blocks(P, BS)))
    assert pol.seglen(p24) == 24


def test_victim_by_recency_plus_weighted_seglen():
    # Saved in order p8 (clock 1), p16 (2), q12 (3); a fourth save needs an eviction (budget 3).
    # recency  = (1, 2, 3) -> (0, 0.5, 1); seglen = (8, 8, 12) -> (0, 0, 1)
    # utility  = (0, 0.5, 1 + 0.85) -> p8 goes, though LRU would also pick it; then p16's parent is gone.
    st = store(budget=3)
    p8, p16, q12 = save(st, P, 8), save(st, P, 16), save(st, Q, 12)
    save(st, Q, 4)
    assert st.positions() == [4, 12, 16]
    assert st.eviction.seglen(p16) == 16 and st.eviction.seglen(q12) == 12 - 4


def test_a_long_segment_outlives_a_more_recent_short_one():
    # p4 (clock 1), q28 (2), p8 (3): recency (0, 0.5, 1); seglen 4, 28, 4 -> (0, 1, 0)
    # weight 0.85: utilities (0, 1.35, 1) -> p4 goes; then restore p4's child... use weight 0 -> LRU.
    st = store(budget=3)
    save(st, P, 4)
    q28 = save(st, Q, 28)
    p8 = save(st, P, 8)
    st.mark_restored(q28)  # clock 4: q28 is now the most recent
    # candidates LRU-first: p4 (1), p8 (3), q28 (4): recency (0, 2/3, 1); seglen (4, 4, 28) -> (0, 0, 1)
    # utilities (0, 0.667, 1.85): p4 goes
    save(st, P_BRANCH, 20)
    assert st.positions() == [8, 20, 28]
    # p8 is now a root: seglen 8; the branch's nearest ancestor is p8 (2 blocks of P): 12
    assert st.eviction.seglen(p8) == 8
    # next: candidates p8 (3), q28 (4), branch (5): recency (0, .5, 1); seglen (8, 28, 12) -> (0, 1, .2)
    # utilities (0, 1.35, 1.17): p8 goes, although a weight-0 (LRU) policy would also take p8
    save(st, Q, 4)
    assert st.positions() == [4, 20, 28]


def test_seglen_spares_the_oldest_when_its_segment_is_longest():
    # q28 (clock 1), p8 (2), r12 (3), r another prompt: recency (0, .5, 1); seglen (28, 8, 12) -> (1, 0, .2)
    # utilities (0.85, 0.5, 1.17): p8 goes, where LRU would take q28
    st = store(budget=3)
    save(st, Q, 28)
    save(st, P, 8)
    save(st, list(range(300, 332)), 12)
    save(st, P_BRANCH, 16)
    assert st.positions() == [12, 16, 28]


def test_weight_zero_is_lru_and_a_big_weight_keeps_the_long_segment():
    for weight, survivor in ((0.0, [8, 12]), (10.0, [12, 28])):
        st = store(budget=2, weight=weight)
        save(st, Q, 28)  # clock 1, seglen 28
        save(st, P, 8)  # clock 2, seglen 8
        # third save: candidates q28 (1), p8 (2): recency (0, 1); seglen (28, 8) -> (1, 0)
        # utilities (w, 1): w = 0 evicts q28 (LRU); w = 10 evicts p8
        save(st, P_BRANCH, 12)
        assert st.positions() == survivor
