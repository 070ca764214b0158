"""KV block pool and prefix cache: exact block ids, eviction order, and a stateful model check."""

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from planner.block_pool import BlockPool, hash_block, hash_full_blocks
from planner.block_pool import append_block_hashes, extend_block_hashes
from planner.prefix_cache import KVLease, PrefixCache


@pytest.mark.parametrize("prompt_len,out_len", [(7, 0), (16, 5), (20, 13), (3, 30)])
def test_decode_block_hashes_from_a_token_slice_equal_the_whole_sequence(prompt_len, out_len):
    from planner.request import Request

    req = Request("r", list(range(100, 100 + prompt_len)), max_new_tokens=40)
    req.output_token_ids = list(range(900, 900 + out_len))
    whole = req.all_token_ids
    for a, b in ((0, len(whole)), (2, prompt_len), (prompt_len, len(whole)), (max(prompt_len - 2, 0), len(whole) - 1)):
        assert req.tokens(a, b) == whole[a:b], (a, b)
    bs = 4
    hashes = hash_full_blocks(req.prompt_token_ids, bs)
    known = len(hashes)
    append_block_hashes(hashes, req.tokens(known * bs, len(whole) // bs * bs + 3), bs)  # a partial block is ignored
    assert hashes == hash_full_blocks(whole, bs) and len(hashes) == len(whole) // bs


def test_allocate_exact_ids_and_shortage():
    pool = BlockPool(4)
    a = pool.allocate(3)
    assert [b.block_id for b in a] == [0, 1, 2] and all(b.ref_cnt == 1 for b in a)
    assert pool.allocate(2) is None and pool.num_free == 1  # shortage reported, nothing taken
    assert [b.block_id for b in pool.allocate(1)] == [3]
    assert pool.allocate(1) is None
    pool.check_invariants()


def test_free_in_reverse_order_evicts_tail_first():
    pool = BlockPool(4)
    blocks = pool.allocate(3)
    for i, b in enumerate(blocks):
        assert pool.publish(b, hash_block(None, [i]))
    pool.free(blocks)
    # block 3 was never used; then the sequence's tail block (2) is evicted before its head (0).
    assert pool.free_block_ids() == [3, 2, 1, 0]
    got = pool.allocate(2)
    assert [b.block_id for b in got] == [3, 2]
    assert pool.stats.evicted == 1 and pool.get_cached(hash_block(None, [2])) is None
    assert pool.get_cached(hash_block(None, [0])) is blocks[0]
    pool.check_invariants()


def test_touch_pulls_cached_block_off_the_free_list():
    pool = BlockPool(3)
    (b,) = pool.allocate(1)
    pool.publish(b, b"h")
    pool.free([b])
    assert 0 in pool.free_block_ids()
    pool.touch([b])
    assert b.ref_cnt == 1 and 0 not in pool.free_block_ids()
    pool.touch([b])
    assert b.ref_cnt == 2
    pool.free([b]); pool.free([b])
    assert pool.free_block_ids()[-1] == 0  # most recently freed: evicted last
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([b])


def test_publish_duplicate_hash_keeps_first():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    assert pool.publish(a, b"same") and not pool.publish(b, b"same")
    assert pool.get_cached(b"same") is a and b.block_hash is None


def test_hash_chain_identity_is_the_whole_prefix():
    h = hash_full_blocks([1, 2, 3, 4, 5, 6], 2)
    assert len(h) == 3
    assert hash_full_blocks([9, 9, 3, 4], 2)[1] != h[1]  # same block tokens, different parent
    assert hash_full_blocks([1, 2, 3, 4], 2) == h[:2]
    assert extend_block_hashes([], [1, 2, 3, 4, 5, 6, 7], 2) == h


def test_match_is_block_floored_and_backs_off_a_whole_prompt():
    bs = 4
    pool = BlockPool(8)
    cache = PrefixCache(pool, bs)
    tokens = list(range(10))
    hashes = extend_block_hashes([], tokens, bs)
    lease = cache.adopt([])
    assert cache.allocate(lease, 10) and lease.block_ids == [0, 1, 2]
    lease.advance(10)
    cache.publish(lease, hashes)
    assert lease.num_published_blocks == 2  # the partial third block is not published
    assert [b.block_id for b in cache.match(tokens, hashes)] == [0, 1]  # 8 of 10 tokens
    eight = tokens[:8]
    assert [b.block_id for b in cache.match(eight, hashes[:2])] == [0]  # whole prompt cached: back off
    other = [99] + tokens[1:]
    assert cache.match(other, extend_block_hashes([], other, bs)) == []
    cache.release(lease)
    warm = cache.adopt(cache.match(tokens, hashes))
    assert warm.block_ids == [0, 1] and warm.num_cached_tokens == 8 and warm.num_computed_tokens == 0
    assert pool.num_free == 6
    pool.check_invariants()


def test_disabled_prefix_cache_never_matches():
    pool = BlockPool(4)
    cache = PrefixCache(pool, 2, enabled=False)
    lease = cache.adopt([])
    cache.allocate(lease, 4)
    lease.advance(4)
    hashes = extend_block_hashes([], [1, 2, 3, 4], 2)
    cache.publish(lease, hashes)
    assert pool.num_cached == 0 and cache.match([1, 2, 3, 4, 5], hashes) == []


def test_lease_advance_past_capacity_is_an_error():
    lease = KVLease(4)
    with pytest.raises(ValueError, match="num_tokens"):
        lease.advance(1)


class PoolAndCacheMachine(RuleBasedStateMachine):
    """Random allocate / advance / publish / match / adopt / release against a tiny pool.

    The model tracks every live lease; the checks: no block is held by two owners unless it is
    published and adopted, reference counts equal the number of live leases holding a block,
    in-use blocks are never on the free list or evicted, and all blocks come back at the end.
    """

    BS = 2
    NUM_BLOCKS = 6

    def __init__(self):
        super().__init__()
        self.pool = BlockPool(self.NUM_BLOCKS)
        self.cache = PrefixCache(self.pool, self.BS)
        self.leases: list[tuple[KVLease, list[int], list[bytes]]] = []

    @rule(prompt=st.lists(st.integers(0, 2), min_size=1, max_size=8))
    def admit(self, prompt):
        hashes = extend_block_hashes([], prompt, self.BS)
        matched = self.cache.match(prompt, hashes)
        assert len(matched) * self.BS < len(prompt)
        for i, b in enumerate(matched):
            assert b.block_hash == hashes[i]  # a match is only ever its own prefix
        free_before = self.pool.num_free
        lease = self.cache.adopt(matched)
        if not self.cache.allocate(lease, len(prompt)):
            self.cache.release(lease)
            assert self.pool.num_free == free_before
            return
        self.leases.append((lease, prompt, hashes))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def compute_and_publish(self, data):
        lease, prompt, hashes = data.draw(st.sampled_from(self.leases))
        left = len(prompt) - lease.num_computed_tokens
        if left:
            lease.advance(data.draw(st.integers(1, left)))
        self.cache.publish(lease, hashes)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data):
        i = data.draw(st.integers(0, len(self.leases) - 1))
        lease, _, _ = self.leases.pop(i)
        self.cache.release(lease)

    @invariant()
    def consistent(self):
        self.pool.check_invariants()
        holders = {}
        for lease, _, _ in self.leases:
            for b in lease.blocks:
                holders[b.block_id] = holders.get(b.block_id, 0) + 1
        for b in self.pool.blocks:
            assert b.ref_cnt == holders.get(b.block_id, 0), (b, holders)
            if holders.get(b.block_id, 0) > 1:
                assert b.block_hash is not None  # only published blocks are shared
        assert self.pool.num_free == self.NUM_BLOCKS - len(holders)

    def teardown(self):
        for lease, _, _ in self.leases:
            self.cache.release(lease)
        assert self.pool.num_free == self.NUM_BLOCKS
        self.pool.check_invariants()


TestPoolAndCache = PoolAndCacheMachine.TestCase
TestPoolAndCache.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
