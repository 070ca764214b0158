"""Token-granular prefix matching (issue 21): rules pinned by hand, then the engine end to end.

The rules (planner/prefix_cache.py's module docstring): with a match unit u under the block, the
match is the longest cached prefix capped at n - 1 and floored to u; whole blocks are shared by
hash; a match ending inside a block copies that block's leading rows into a fresh block
(copy-on-write), the source held until the tick's forward has run. Findable by content are full
published blocks and a released lease's partly written last block (planner/block_pool.py). At the
block unit nothing changes (`match`'s blocks). The expected numbers are worked out beside each case.

End to end (placeholder runner, which checks every row's SSM state against the KV under it):
ours-plus's identical repeat replays 1 token and a next turn its new tokens + 1; no block is
leaked, no shared block is ever written, and under random traces with preemption and snapshot
budgets the greedy tokens equal those of an engine without any cache.
"""

from __future__ import annotations

import random

import pytest

from model.engine import Engine
from planner.block_pool import ROOT, BlockPool, hash_full_blocks
from planner.prefix_cache import PrefixCache
from planner.scheduler import SchedulerConfig


def computed(cache: PrefixCache, tokens: list[int], finish: bool = True):
    """A lease that computed `tokens` (every full block published, content registered); released
    when `finish` (its partial last block then registered too)."""
    hashes = hash_full_blocks(tokens, cache.block_size)
    lease = cache.adopt([])
    assert cache.allocate(lease, len(tokens))
    lease.advance(len(tokens))
    cache.publish(lease, hashes, lambda a, b: tokens[a:b])
    if finish:
        cache.register_tail(lease, hashes, lambda a, b: tokens[a:b])
        cache.release(lease)
    return lease


def found(cache: PrefixCache, prompt: list[int]) -> tuple[int, int, int]:
    m = cache.find(prompt, hash_full_blocks(prompt, cache.block_size))
    return len(m.blocks), m.rows, m.num_tokens


A = list(range(1, 11))  # 10 tokens on block 4: blocks [1-4], [5-8] full, [9, 10] the partial tail


# ---------------------------------------------------------------- the match rule
def test_unit_one_matches_into_the_partial_tail():
    cache = PrefixCache(BlockPool(8), 4, match_unit=1)
    computed(cache, A)
    # B shares 9 tokens: limit 10, two whole blocks (hashes[:10 // 4 = 2]), then [9, 99] vs the
    # tail's (9, 10): 1 common row -> 8 + 1 = 9
    assert found(cache, A[:9] + [99, 100]) == (2, 1, 9)
    # the identical repeat: limit 9, two blocks, [9] vs (9, 10): 1 row -> 9 = n - 1
    assert found(cache, A) == (2, 1, 9)
    # an 8-token repeat: limit 7, one whole block (hashes[:1]); [5, 6, 7] vs the full block (5..8): 3 rows
    assert found(cache, A[:8]) == (1, 3, 7)
    # longer than A: limit 12, blocks 0-1 whole; block 2 is not cached by hash (A never filled it);
    # [9, 10, 11, 12] vs (9, 10): 2 rows -> 10, all A computed
    assert found(cache, A + [11, 12, 13]) == (2, 2, 10)
    # nothing in common with the first token: no block, no rows
    assert found(cache, [77] + A) == (0, 0, 0)


def test_the_unit_floors_the_rows():
    cache = PrefixCache(BlockPool(8), 4, match_unit=2)
    computed(cache, A)
    assert found(cache, A[:9] + [99, 100]) == (2, 0, 8)  # 1 common row floored to 2 -> 0
    assert found(cache, A + [11]) == (2, 2, 10)  # limit 10: 2 rows of the tail
    assert found(cache, A[:8]) == (1, 2, 6)  # limit 7: 3 rows floored to 2


def test_the_block_unit_is_the_block_floored_match():
    cache = PrefixCache(BlockPool(8), 4)  # unit 0: the block
    computed(cache, A)
    for prompt in (A, A[:9] + [99, 100], A[:8], A + [11, 12, 13]):
        hashes = hash_full_blocks(prompt, 4)
        m = cache.find(prompt, hashes)
        assert m.partial is None and list(m.blocks) == cache.match(prompt, hashes)
    assert found(cache, A[:8]) == (1, 0, 4)  # 8 tokens whole: backed off one block


def test_match_unit_must_divide_the_block():
    assert PrefixCache(BlockPool(1), 16, match_unit=8).match_unit == 8
    with pytest.raises(ValueError, match="prefix_match_unit"):
        PrefixCache(BlockPool(1), 16, match_unit=3)
    with pytest.raises(ValueError, match="prefix_match_unit"):
        SchedulerConfig(block_size=16, prefix_match_unit=5)
    assert SchedulerConfig(block_size=16, prefix_match_unit=0).match_unit == 16


def test_a_running_requests_tail_is_not_findable_until_released():
    cache = PrefixCache(BlockPool(8), 4, match_unit=1)
    lease = computed(cache, A, finish=False)
    assert found(cache, A) == (2, 0, 8)  # the tail (9, 10) is still being written
    cache.register_tail(lease, hash_full_blocks(A, 4), lambda a, b: A[a:b])
    assert found(cache, A) == (2, 1, 9)


def test_a_reused_block_is_no_longer_findable_by_content():
    pool = BlockPool(3)
    cache = PrefixCache(pool, 4, match_unit=1)
    computed(cache, A)  # 3 blocks, all free again, all registered
    assert pool.longest_content_match(ROOT, [1, 2])[1] == 2
    pool.allocate(3)  # reuse all three (oldest freed first)
    assert pool.longest_content_match(ROOT, [1, 2]) == (None, 0)
    pool.check_invariants()


def test_ties_go_to_the_block_registered_last():
    pool = BlockPool(4)
    first, second = pool.allocate(2)
    pool.register_content(first, ROOT, (5, 6, 7))
    pool.register_content(second, ROOT, (5, 6, 8))
    assert pool.longest_content_match(ROOT, [5, 6, 9]) == (second, 2)
    assert pool.longest_content_match(ROOT, [5, 6, 7]) == (first, 3)
    assert pool.longest_content_match(b"other parent", [5, 6, 7]) == (None, 0)


# ---------------------------------------------------------------- copy-on-write bookkeeping
def test_adopt_match_books_a_copy_and_holds_its_source():
    pool = BlockPool(8)
    cache = PrefixCache(pool, 4, match_unit=1)
    computed(cache, A)  # blocks 0, 1, 2 (the tail) now free and findable
    m = cache.find(A, hash_full_blocks(A, 4))
    lease, copy = cache.adopt_match(m)
    src = m.partial
    assert copy == (src.block_id, lease.blocks[-1].block_id, 1) and src.block_id == 2
    assert src.ref_cnt == 1 and lease.blocks[-1].ref_cnt == 1 and lease.blocks[-1] is not src
    assert (lease.num_cached_tokens, lease.num_published_blocks, len(lease.blocks)) == (9, 2, 3)
    assert (pool.stats.partial_hits, pool.stats.copied_rows) == (1, 1)
    pool.free([src])
    cache.release(lease)
    assert pool.num_free == 8
    pool.check_invariants()


def test_no_free_block_for_the_copy_ends_the_match_at_the_whole_blocks():
    pool = BlockPool(3)
    cache = PrefixCache(pool, 4, match_unit=1)
    computed(cache, A)
    m = cache.find(A, hash_full_blocks(A, 4))
    # every block is one of the match's: after adopting 0, 1 and holding the source 2, none is free
    lease, copy = cache.adopt_match(m)
    assert copy is None and lease.num_cached_tokens == 8 and len(lease.blocks) == 2
    assert m.partial.ref_cnt == 0  # the source's hold was given back
    cache.release(lease)
    pool.check_invariants()


# ---------------------------------------------------------------- the engine, end to end
class WriteGuard:
    """Wraps a runner: every position a row writes (at or above its cached length) lies in a block
    only this request holds, not published and not findable by content; copies go to such blocks."""

    def __init__(self, engine: Engine):
        self.inner, self.pool = engine.runner, engine.scheduler.pool
        self.copies = 0
        engine.runner = self

    def _private(self, block_id: int) -> None:
        b = self.pool.blocks[block_id]
        assert b.ref_cnt == 1 and b.block_hash is None and not b.content, f"write into shared block {b}"

    def copy_kv_blocks(self, copies):
        for _, dst, _ in copies:
            self._private(dst)
        self.copies += len(copies)
        self.inner.copy_kv_blocks(copies)

    def forward(self, rows):
        for row in rows:
            bs = self.pool_block_size
            first = max(row.start_pos, row.kv_cached_len)
            for pos in range(first, row.start_pos + row.num_tokens):
                self._private(row.block_table[pos // bs])
        return self.inner.forward(rows)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def engine(**settings):
    base = dict(policy="ours-plus", block_size=16, prefill_budget=8192, max_batch_size=2, num_kv_blocks=256)
    eng = Engine.for_placeholder(**{**base, **settings})
    guard = WriteGuard(eng)
    guard.pool_block_size = eng.config.scheduler.block_size
    return eng, guard


def served(eng, prompt, new=1, forced=None):
    req = eng.add_request(prompt, new, forced_output_ids=forced)
    eng.run_until_done()
    return req


def triple(req):
    m = req.metrics
    return m.kv_match_tokens, m.restore_at, m.replayed_tokens


def test_ours_plus_repeat_replays_one_token_and_a_next_turn_its_new_tokens_plus_one():
    """A: 100 prompt tokens, 5 generated: 104 computed (the 5th sampled, never run); snapshots at the
    split 96 - 16 = 80, at n - 1 = 99 (captured in the launch) and at finish 104 (exact decode state).
    Repeat of A's prompt: match 99 = n - 1 (6 whole blocks + 3 rows copied from block 6), restore 99,
    replay 1. Turn 2 = A's 105 tokens + 30 new: match 104 (6 whole blocks + 8 rows copied from A's
    tail), restore 104, replay 135 - 104 = 31 = 30 new + the reply's last token."""
    eng, guard = engine()
    a = served(eng, list(range(1000, 1100)), 5)
    assert a.metrics.snapshot_positions == [80, 99, 104]
    b = served(eng, list(range(1000, 1100)))
    assert triple(b) == (99, 99, 1) and b.metrics.kv_copied_tokens == 3
    c = served(eng, a.all_token_ids + list(range(5000, 5030)))
    assert triple(c) == (104, 104, 31) and c.metrics.kv_copied_tokens == 8
    assert b.output_token_ids == a.output_token_ids[:1]
    assert guard.copies == 2
    pool = eng.scheduler.pool
    assert pool.num_free == pool.num_blocks  # nothing leaked
    pool.check_invariants()


def test_the_block_unit_keeps_the_block_floored_repeat():
    """The same with prefix_match_unit=16: the repeat matches 96 (6 blocks), restores at the split 80,
    replays 20; no copy."""
    eng, guard = engine(prefix_match_unit=16)
    served(eng, list(range(1000, 1100)), 5)
    b = served(eng, list(range(1000, 1100)))
    assert triple(b) == (96, 80, 20) and guard.copies == 0


def test_aligned_keeps_the_seeds_reproduction():
    """`aligned` and `legacy` run the block unit whatever ours-plus does: the incident's replays
    (planner/policies/aligned.py: 8195 legacy, 20 aligned at 32772 tokens, budget 8192 + 1 slot)."""
    for policy, replay in (("aligned", 20), ("legacy", 8195)):
        eng, _ = engine(policy=policy, max_batch_size=1, num_kv_blocks=4200)
        p = list(range(32772))
        served(eng, p)
        assert triple(served(eng, p))[2] == replay
        assert eng.effective_settings["prefix_match_unit"] == 0


def random_trace(rng: random.Random, n: int) -> list[tuple[list[int], list[int]]]:
    """Requests that extend, repeat or branch from earlier prompt + reply at random token offsets."""
    trace, history = [], []
    for _ in range(n):
        if history and rng.random() < 0.8:
            base = rng.choice(history)
            cut = rng.randint(1, len(base))
            prompt = base[:cut] + [rng.randrange(2000, 3000) for _ in range(rng.randint(0, 40))]
        else:
            prompt = [rng.randrange(2000, 3000) for _ in range(rng.randint(1, 90))]
        reply = [rng.randrange(3000, 4000) for _ in range(rng.randint(1, 12))]
        trace.append((prompt, reply))
        history.append(prompt + reply)
    return trace


def tight_pool(trace, block: int = 8) -> int:
    """KV blocks for the largest request and 2 more: two requests at once must preempt at times."""
    return max(-(-(len(p) + len(r)) // block) for p, r in trace) + 2


@pytest.mark.parametrize("seed", range(12))
def test_random_traces_match_an_uncached_engine(seed):
    """Random shared-prefix traces, two at a time, on block 8 with a unit of 1, 2 or 4, a pool small
    enough to preempt and a snapshot budget of a few snapshots: the placeholder checks every row's
    state against its KV (a wrong copy, restore or overwritten block fails there), the write guard
    that no shared block is written; the sampled tokens equal an uncached engine's, nothing leaks."""
    rng = random.Random(seed)
    trace = random_trace(rng, 30)
    unit = (1, 2, 4)[seed % 3]
    budget = (None, 3 << 20, 1 << 20)[seed % 3 if seed < 6 else (seed + 1) % 3]
    eng, guard = engine(block_size=8, prefix_match_unit=unit, num_kv_blocks=tight_pool(trace), max_batch_size=2,
                        prefill_budget=64, snapshot_byte_budget=budget)
    plain = Engine.for_placeholder(policy="aligned", block_size=8, num_kv_blocks=tight_pool(trace), max_batch_size=2,
                                   prefill_budget=64, enable_prefix_caching=False)
    ours = [eng.add_request(p, len(r)) for p, r in trace]  # sampled, not forced: the tokens are the test
    ref = [plain.add_request(p, len(r)) for p, r in trace]
    eng.run_until_done()
    plain.run_until_done()
    assert [r.output_token_ids for r in ours] == [r.output_token_ids for r in ref]
    copied = sum(r.metrics.kv_copied_tokens for r in ours)
    assert copied > 0 and guard.copies > 0  # the traces do exercise copies
    assert all(r.metrics.kv_copied_tokens % unit == 0 for r in ours)
    pool = eng.scheduler.pool
    assert pool.num_free == pool.num_blocks
    pool.check_invariants()


def test_random_traces_do_preempt():
    """The pool above is small enough that some of the seeds' requests are preempted (else the
    differential test would not cover copy-on-write under preemption)."""
    preempted = 0
    for seed in range(12):
        rng = random.Random(seed)
        trace = random_trace(rng, 30)
        eng, _ = engine(block_size=8, prefix_match_unit=1, num_kv_blocks=tight_pool(trace), max_batch_size=2,
                        prefill_budget=64)
        reqs = [eng.add_request(p, len(r)) for p, r in trace]
        eng.run_until_done()
        preempted += sum(r.metrics.preemptions for r in reqs)
    assert preempted > 0


def test_a_runner_without_copies_is_refused_for_a_token_unit():
    class NoCopy:
        def forward(self, rows): ...
        def read_state(self, slot): ...
        def write_state(self, slot, state): ...

    with pytest.raises(ValueError, match="prefix_match_unit.*copy_kv_blocks"):
        Engine.for_runner(lambda config: NoCopy(), None, policy="ours-plus", num_kv_blocks=8)
    Engine.for_runner(lambda config: NoCopy(), None, policy="ours-plus", num_kv_blocks=8, prefix_match_unit=16)


# ---------------------------------------------------------------- slips the mutation run found unpinned
def test_a_block_is_registered_by_content_once_per_allocation():
    pool = BlockPool(2)
    block, = pool.allocate(1)
    pool.register_content(block, ROOT, (5, 6))
    with pytest.raises(RuntimeError, match="already findable by content"):
        pool.register_content(block, ROOT, (5, 6, 7))
    pool.free([block])
    _, again = pool.allocate(2)  # the never-used block first, then the freed one: its entry dropped
    assert again is block and pool.longest_content_match(ROOT, [5, 6]) == (None, 0)
    pool.register_content(again, ROOT, (9,))  # a fresh allocation registers again
    assert pool.longest_content_match(ROOT, [9, 1]) == (again, 1)


@pytest.mark.parametrize("written, rows", [(5, 1), (3, 3), (7, 3)])
def test_a_released_tail_of_any_length_is_findable(written, rows):
    """Block 4: a lease that wrote `written` tokens leaves `written % 4` rows in its last block (5: one
    row past a boundary; 3: a first block never filled); a prompt sharing them and going on copies them."""
    cache = PrefixCache(BlockPool(8), 4, match_unit=1)
    computed(cache, A[:written])
    assert found(cache, A[:written] + [99, 98]) == (written // 4, rows, written)


def test_a_tail_ending_on_a_boundary_registers_nothing():
    """8 tokens on block 4: both blocks are full (published by hash and content); no partial tail."""
    pool = BlockPool(4)
    cache = PrefixCache(pool, 4, match_unit=1)
    lease = computed(cache, A[:8], finish=False)
    assert cache.allocate(lease, 9)  # a third block, as a decode row at 8 would allocate, unwritten
    cache.register_tail(lease, hash_full_blocks(A[:8], 4), lambda a, b: A[a:b])
    assert lease.blocks[2].content == () and found(cache, A[:8] + [1]) == (2, 0, 8)
    pool.check_invariants()


@pytest.mark.parametrize("spoil", ["parent", "first token", "block id"])
def test_check_invariants_catches_a_misfiled_content_entry(spoil):
    pool = BlockPool(3)
    a, b = pool.allocate(2)
    pool.register_content(a, ROOT, (5, 6))
    pool.check_invariants()
    if spoil == "parent":
        a.parent = b"another prefix"
    elif spoil == "first token":
        a.content = (7, 6)
    else:
        pool._by_content[(ROOT, 5)] = {b.block_id: a}
    with pytest.raises(AssertionError):
        pool.check_invariants()


def test_a_partly_written_block_is_not_published():
    """A chunk ending inside a block (legacy's 8193, or 22 here on block 8) leaves the lease's last block
    partly written; the prompt's hashes already name it, but publishing counts computed rows: 2 blocks,
    not the 3 the lease holds (a later prompt would adopt rows 22-23, never written)."""
    tokens = list(range(1, 97))
    cache = PrefixCache(BlockPool(16), 8)
    hashes = hash_full_blocks(tokens, 8)  # all 12 of the prompt's blocks, as admission computes them
    lease = cache.adopt([])
    assert cache.allocate(lease, 22) and len(lease.blocks) == 3
    lease.advance(22)
    cache.publish(lease, hashes, lambda a, b: tokens[a:b])
    assert lease.num_published_blocks == 2 and cache.pool.get_cached(hashes[2]) is None
    assert found(cache, tokens) == (2, 0, 16)


def test_a_cache_refuses_a_block_size_under_one():
    with pytest.raises(ValueError, match="^block_size: must be >= 1"):  # its own line, not the unit's
        PrefixCache(BlockPool(4), 0)
