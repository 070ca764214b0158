"""Snapshot store: exact-prefix keys, deepest usable lookup, byte budget with LRU eviction."""

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from planner.block_pool import hash_full_blocks
from planner.snapshot_store import SnapshotStore


@dataclasses.dataclass
class Blob:
    tag: str
    nbytes: int = 100


def save(store, tokens, pos, tag, nbytes=100):
    return store.save(tokens, pos, Blob(tag, nbytes), hash_full_blocks(tokens, store.block_size))


def lookup(store, tokens, max_pos):
    snap = store.lookup(tokens, max_pos, hash_full_blocks(tokens, store.block_size))
    return None if snap is None else (snap.position, snap.state.tag)


def test_deepest_at_or_below_the_match_including_unaligned_positions():
    store = SnapshotStore(block_size=16)
    prompt = list(range(32772))
    for pos in (8193, 16385, 24577, 32769):  # the legacy incident's chunk ends
        assert save(store, prompt, pos, f"s{pos}")
    assert lookup(store, prompt, 32768) == (24577, "s24577")  # 32769 is deeper than the match
    assert lookup(store, prompt, 32769) == (32769, "s32769")
    assert lookup(store, prompt, 8192) is None
    assert store.positions() == [8193, 16385, 24577, 32769]


def test_never_returned_for_another_prefix():
    store = SnapshotStore(block_size=4)
    a = [1, 2, 3, 4, 5, 6, 7]
    save(store, a, 6, "a6")
    b = [1, 2, 3, 4, 5, 9, 7]  # differs inside the partial block
    assert lookup(store, b, 7) is None
    c = [0, 2, 3, 4, 5, 6, 7]  # differs in an earlier full block
    assert lookup(store, c, 7) is None
    assert lookup(store, a[:6] + [8, 8, 8], 9) == (6, "a6")  # a longer prompt sharing the prefix


def test_duplicate_save_refreshes_instead_of_storing_twice():
    store = SnapshotStore(block_size=4)
    t = list(range(10))
    save(store, t, 8, "first")
    save(store, t, 8, "second")
    assert len(store) == 1 and store.bytes_held == 100 and store.stats.duplicates == 1
    assert lookup(store, t, 9) == (8, "first")


def test_refresh_is_a_duplicate_save_without_the_state():
    """`refresh` does what a duplicate `save` does (the LRU order, the duplicate count) for a prefix
    held on the device, and nothing for one that is not: then the caller saves with the state."""
    store = SnapshotStore(block_size=4, byte_budget=200)
    t = list(range(20))
    h = hash_full_blocks(t, 4)
    save(store, t, 6, "a")
    save(store, t, 9, "b")  # LRU order: 6, 9
    held = store.refresh(t, 6, h)
    assert held is not None and held.position == 6 and store.stats.duplicates == 1
    save(store, t, 13, "c")  # 300 > 200: the least recently used (9 now) leaves
    assert store.positions() == [6, 13]
    assert store.refresh(t, 9, h) is None and store.refresh(t, 7, h) is None
    assert store.stats.duplicates == 1 and store.stats.saved == 3


def test_byte_budget_evicts_least_recently_used_and_counts():
    store = SnapshotStore(block_size=4, byte_budget=250)
    t = list(range(40))
    save(store, t, 4, "p4")
    save(store, t, 8, "p8")
    store.mark_restored(store.lookup(t, 4, hash_full_blocks(t, 4)))  # p4 becomes most recent
    save(store, t, 12, "p12")  # 300 > 250: evict the LRU one, p8
    assert store.positions() == [4, 12]
    assert store.bytes_held == 200
    s = store.stats
    assert (s.saved, s.restored, s.evicted, s.evicted_bytes, s.restored_bytes) == (3, 1, 1, 100, 100)
    assert not save(store, t, 16, "huge", nbytes=1000) and store.stats.rejected == 1
    store.clear()
    assert len(store) == 0 and store.bytes_held == 0 and store.stats.evicted == 3


def test_speculative_saves_fill_free_memory_and_never_evict():
    store = SnapshotStore(block_size=4, byte_budget=250)
    t = list(range(40))
    h = hash_full_blocks(t, 4)
    assert store.save(t, 4, Blob("p4"), h, origin="speculative")  # free memory: kept like any other
    assert store.save(t, 8, Blob("p8"), h)
    assert not store.save(t, 12, Blob("p12"), h, origin="speculative")  # would need an eviction
    assert store.positions() == [4, 8] and store.stats.declined == 1 and store.stats.evicted == 0
    assert store.save(t, 16, Blob("p16"), h)  # a requested one evicts as usual (LRU: p4)
    assert store.positions() == [8, 16] and store.stats.evicted == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size"):
        SnapshotStore(0)
    with pytest.raises(ValueError, match="byte_budget"):
        SnapshotStore(4, byte_budget=-1)
    store = SnapshotStore(4)
    with pytest.raises(ValueError, match="position"):
        save(store, [1, 2], 3, "x")
    with pytest.raises(ValueError, match="block_hashes"):
        store.save([1] * 9, 8, Blob("x"), [])


@given(st.integers(1, 5), st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=14), min_size=1, max_size=6),
       st.lists(st.integers(0, 2), min_size=1, max_size=14), st.data())
@settings(max_examples=300, deadline=None)
def test_lookup_matches_a_brute_force_search(bs, saved_prompts, query, data):
    """The returned snapshot is exactly the deepest stored (prefix, position) that the query extends."""
    store = SnapshotStore(block_size=bs)
    held = {}
    for p in saved_prompts:
        pos = data.draw(st.integers(1, len(p)))
        save(store, p, pos, repr(p[:pos]))
        held.setdefault(tuple(p[:pos]), repr(p[:pos]))
    max_pos = data.draw(st.integers(0, len(query)))
    candidates = [k for k in held if len(k) <= max_pos and tuple(query[: len(k)]) == k]
    expected = max(candidates, key=len, default=None)
    got = lookup(store, query, max_pos)
    assert got == (None if expected is None else (len(expected), held[expected]))
