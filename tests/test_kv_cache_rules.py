"""Rules of the KV block pool, the prefix cache's leases and the request record, pinned by hand.

Each rule comes from the docstring of the public function it tests (planner/block_pool.py,
planner/prefix_cache.py, planner/request.py) or from the meaning of a field its comment names;
every expected value is worked out by hand beside it. The cases aim at one-line slips: a bound
off by one (`n < 0` vs `n <= 0`), a `//` for `*`, a counter that subtracts, a default that is
not 0, a stale cached id table, a block published before its positions are computed.
"""

import pytest

from planner.block_pool import BlockPool, BlockPoolStats, KVBlock, extend_block_hashes, hash_block
from planner.prefix_cache import KVLease, PrefixCache
from planner.request import Request, RequestMetrics


# ---------------------------------------------------------------- argument checks (require)
# Each check accepts its boundary value and rejects the one just past it with a ValueError that
# names the argument ("name: ..." is kernels.checks.require's format).

def test_block_pool_needs_at_least_one_block():
    assert BlockPool(1).num_blocks == 1  # "num_blocks must be >= 1": 1 is accepted
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)


def test_block_size_must_be_at_least_one():
    assert extend_block_hashes([], [7], 1) == [hash_block(None, [7])]  # 1 token, 1 block of 1
    with pytest.raises(ValueError, match="block_size"):
        extend_block_hashes([], [7], 0)
    assert PrefixCache(BlockPool(1), 1).block_size == 1
    with pytest.raises(ValueError, match="block_size"):
        PrefixCache(BlockPool(1), 0)


def test_allocate_accepts_zero_and_rejects_negative_counts():
    pool = BlockPool(2)
    assert pool.allocate(0) == []  # "n must be >= 0": 0 blocks is an empty grant, not an error
    assert pool.num_free == 2
    with pytest.raises(ValueError, match="n: must be >= 0"):
        pool.allocate(-1)
    assert pool.num_free == 2 and pool.stats.allocated == 0  # nothing changed


def test_lease_advance_takes_one_to_the_remaining_capacity():
    cache = PrefixCache(BlockPool(2), 4)
    lease = cache.adopt([])
    assert cache.allocate(lease, 5)  # ceil(5 / 4) = 2 blocks: capacity 8
    with pytest.raises(ValueError, match="num_tokens"):
        lease.advance(0)  # "[1, ...]": 0 tokens is not an advance
    lease.advance(1)
    lease.advance(7)  # 1 + 7 = 8 = capacity: accepted
    assert lease.num_computed_tokens == 8
    with pytest.raises(ValueError, match="num_tokens"):
        lease.advance(1)  # 9 > 8


def test_request_needs_at_least_one_new_token():
    assert Request("r", [1], max_new_tokens=1).max_new_tokens == 1
    with pytest.raises(ValueError, match="max_new_tokens"):
        Request("r", [1], max_new_tokens=0)


# ---------------------------------------------------------------- counters and defaults

def test_fresh_records_start_at_zero():
    stats = BlockPool(3).stats
    assert (stats.allocated, stats.freed, stats.cache_hits, stats.evicted) == (0, 0, 0, 0)
    lease = KVLease(4)
    assert (lease.num_computed_tokens, lease.num_cached_tokens, lease.num_published_blocks) == (0, 0, 0)
    assert lease.blocks == [] and lease.block_ids == []
    m = Request("r", [1, 2]).metrics
    assert (m.kv_match_tokens, m.restore_at, m.replayed_tokens, m.snapshot_bytes) == (0, 0, 0, 0)
    assert (m.prefill_passes, m.decode_tokens, m.preemptions) == (0, 0, 0)
    assert Request("r", [1, 2]).max_new_tokens == 1  # the default: one token (the first sampled)


def test_pool_stats_count_blocks_allocated_freed_adopted_and_evicted():
    pool = BlockPool(4)
    blocks = pool.allocate(3)  # allocated 3: blocks 0, 1, 2 (free list now 3)
    pool.publish(blocks[0], b"h0")
    pool.publish(blocks[1], b"h1")
    pool.touch(blocks[:2])  # cache_hits 2; refs 2, 2, 1
    pool.free(blocks)  # freed 3; refs 1, 1, 0 (free list 3, 2)
    pool.free(blocks[:2])  # freed 5; refs 0, 0, 0 (free list 3, 2, 1, 0: last block first)
    pool.touch([blocks[0]])  # a free cached block adopted again: cache_hits 3 (free list 3, 2, 1)
    assert pool.stats == BlockPoolStats(allocated=3, freed=5, cache_hits=3, evicted=0)
    pool.allocate(3)  # takes 3, 2, 1; block 1 held h1: allocated 6, evicted 1
    assert pool.stats == BlockPoolStats(allocated=6, freed=5, cache_hits=3, evicted=1)
    pool.check_invariants()


# ---------------------------------------------------------------- block pool rules

def test_publishing_a_block_nobody_holds_is_refused():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.free([block])  # ref 1 -> 0: the block is free
    with pytest.raises(RuntimeError, match="nobody holds"):
        pool.publish(block, b"h")
    assert pool.get_cached(b"h") is None


def test_block_repr_says_whether_it_is_cached():
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    pool.publish(a, b"h")
    assert repr(a) == "KVBlock(0, ref=1, cached=True)"
    assert repr(b) == "KVBlock(1, ref=1, cached=False)"


def test_blocks_leases_and_requests_are_identities_not_values():
    # Two records with equal fields are still two blocks/leases/requests: each can be a set member
    # and neither equals the other (a queue's remove() must not take the wrong request). Block 0
    # of two fresh pools: both KVBlock(0, ref=1, uncached); two empty leases of block size 4.
    a, b = BlockPool(1).allocate(1)[0], BlockPool(1).allocate(1)[0]
    la, lb = PrefixCache(BlockPool(1), 4).adopt([]), PrefixCache(BlockPool(1), 4).adopt([])
    ra, rb = Request("r", [1]), Request("r", [1])
    for x, y in ((a, b), (la, lb), (ra, rb)):
        assert x != y and len({x, y}) == 2


# ---------------------------------------------------------------- chained block hashes

def test_extending_hashes_continues_the_chain_from_the_next_block():
    # Block size 4, 12 tokens = 3 blocks; the first block's hash is already known, so the next two
    # are hashed from tokens [4, 8) and [8, 12), chained on h0 (the module docstring's chain).
    tokens = list(range(10, 22))
    h0 = hash_block(None, tokens[0:4])
    h1 = hash_block(h0, tokens[4:8])
    h2 = hash_block(h1, tokens[8:12])
    assert extend_block_hashes([h0], tokens, 4) == [h0, h1, h2]
    assert extend_block_hashes([h0], tokens[:7], 4) == [h0]  # 7 tokens: still 1 full block


# ---------------------------------------------------------------- prefix match and publication

def _cache_with_published_prefix(tokens, block_size=4, num_blocks=8):
    """A cache whose pool holds `tokens`' full blocks, published and released (findable, free)."""
    cache = PrefixCache(BlockPool(num_blocks), block_size)
    hashes = extend_block_hashes([], tokens, block_size)
    lease = cache.adopt([])
    assert cache.allocate(lease, len(tokens))
    lease.advance(len(tokens))
    cache.publish(lease, hashes)
    cache.release(lease)
    return cache, hashes


def test_match_never_reaches_past_the_given_tokens():
    # 12 tokens (3 blocks of 4) cached. Matching only the first 6 tokens with the whole request's
    # 3 hashes: 6 // 4 = 1 full block may be matched, and 1 * 4 = 4 < 6 needs no back-off.
    tokens = list(range(12))
    cache, hashes = _cache_with_published_prefix(tokens)
    assert [b.block_id for b in cache.match(tokens[:6], hashes)] == [0]
    # 4 tokens: 1 block, which would cover the whole prompt, so it is backed off: nothing.
    assert cache.match(tokens[:4], hashes) == []


def test_publish_only_blocks_whose_positions_are_all_computed():
    # 8-token prompt, 2 blocks of 4, both hashes known, but only 5 positions computed: block 0
    # ([0, 4)) is complete, block 1 ([4, 8)) holds 1 computed position and must stay private.
    cache = PrefixCache(BlockPool(4), 4)
    hashes = extend_block_hashes([], list(range(8)), 4)
    lease = cache.adopt([])
    assert cache.allocate(lease, 8)
    lease.advance(5)
    cache.publish(lease, hashes)
    assert lease.num_published_blocks == 1  # 5 // 4
    assert cache.pool.get_cached(hashes[0]) is lease.blocks[0]
    assert cache.pool.get_cached(hashes[1]) is None
    lease.advance(3)  # 8 computed: 8 // 4 = 2 full blocks
    cache.publish(lease, hashes)
    assert lease.num_published_blocks == 2 and cache.pool.get_cached(hashes[1]) is lease.blocks[1]


def test_release_returns_the_blocks_and_resets_the_cursors():
    tokens = list(range(8))
    cache, hashes = _cache_with_published_prefix(tokens, num_blocks=4)
    lease = cache.adopt(cache.match(tokens + [99], hashes))  # 9 tokens: both blocks match
    assert (lease.num_cached_tokens, lease.num_published_blocks) == (8, 2)  # 2 blocks * 4
    assert cache.allocate(lease, 9)  # ceil(9 / 4) = 3 blocks
    lease.advance(9)
    cache.release(lease)
    assert lease.blocks == [] and cache.pool.num_free == 4
    assert (lease.num_computed_tokens, lease.num_cached_tokens, lease.num_published_blocks) == (0, 0, 0)


# ---------------------------------------------------------------- the lease's block-id table
# KVLease.block_ids: "returned without a copy ... a release starts a new list; an append only
# makes an old table longer".

def test_block_ids_is_one_table_that_appends_make_longer():
    cache = PrefixCache(BlockPool(4), 4)
    lease = cache.adopt([])
    assert cache.allocate(lease, 8)  # blocks 0, 1
    ids = lease.block_ids
    assert ids == [0, 1] and lease.block_ids is ids  # no change: the same list, not a copy
    assert cache.allocate(lease, 9)  # a third block: 2
    assert lease.block_ids is ids and ids == [0, 1, 2]


def test_block_ids_after_a_release_are_the_new_blocks():
    # Pool of 4. Blocks 0, 1 taken, their ids read, released (freed last first: free list 2, 3, 1, 0),
    # then 2 blocks taken again: 2, 3. The table must name 2, 3 and the old table stay [0, 1].
    cache = PrefixCache(BlockPool(4), 4)
    lease = cache.adopt([])
    assert cache.allocate(lease, 8)
    old = lease.block_ids
    assert old == [0, 1]
    cache.release(lease)
    assert cache.allocate(lease, 8)
    assert lease.block_ids == [2, 3] and old == [0, 1]


def test_lease_repr_hides_the_id_table():
    lease = PrefixCache(BlockPool(2), 4).adopt([])
    lease.block_ids  # fill the private table
    text = repr(lease)
    assert "num_computed_tokens=0" in text and "_ids" not in text


# ---------------------------------------------------------------- request tokens and metrics

def test_tokens_slices_prompt_then_output():
    # prompt [1, 2], output [3, 4, 5, 6]: positions 0..5 hold 1..6.
    req = Request("r", [1, 2], max_new_tokens=8)
    req.output_token_ids = [3, 4, 5, 6]
    assert req.tokens(2, 3) == [3]  # inside the output only
    assert req.tokens(3, 5) == [4, 5]
    assert req.tokens(1, 3) == [2, 3]  # across the boundary
    assert req.tokens(0, 2) == [1, 2]  # ends exactly at the prompt's end


def test_ttft_is_first_token_minus_arrival():
    assert RequestMetrics(arrival_s=1.0, first_token_s=3.5).ttft_s == 2.5  # 3.5 - 1.0
    assert RequestMetrics(arrival_s=1.0).ttft_s is None  # no first token yet
    assert RequestMetrics(first_token_s=3.5).ttft_s is None  # no arrival recorded


def test_decode_rate_is_decode_tokens_over_decode_time():
    # tokens / (finish - first token): 8 / (3.0 - 1.0) = 4.0 tokens/s; 1 / 2.0 = 0.5.
    assert RequestMetrics(first_token_s=1.0, finish_s=3.0, decode_tokens=8).decode_tokens_per_s == 4.0
    assert RequestMetrics(first_token_s=1.0, finish_s=3.0, decode_tokens=1).decode_tokens_per_s == 0.5
    # Zero decode time is clamped to 1e-9 s: 8 / 1e-9 = 8e9.
    assert RequestMetrics(first_token_s=2.0, finish_s=2.0, decode_tokens=8).decode_tokens_per_s == pytest.approx(8e9)
    # Undefined without decode tokens, a finish or a first token.
    assert RequestMetrics(first_token_s=1.0, finish_s=3.0, decode_tokens=0).decode_tokens_per_s is None
    assert RequestMetrics(first_token_s=1.0, decode_tokens=8).decode_tokens_per_s is None
    assert RequestMetrics(finish_s=3.0, decode_tokens=8).decode_tokens_per_s is None
