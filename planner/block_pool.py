"""A fixed pool of paged-KV blocks: reference counts, chained block hashes, an O(1) LRU free list.

A block's identity is its whole prefix: its hash chains the parent block's hash with its own
token ids (sha256, so two different prefixes collide with probability ~2^-256, and a cached
block is never served for a prefix it does not hold). A block whose reference count drops to
zero keeps its hash and stays findable until it is reused: free blocks sit in an LRU list
(oldest first) and allocation takes from the front, evicting that block's cache entry.

Allocation reports a shortage by returning None, never by raising, so the caller can make
the request wait or preempt another one. Blocks are freed in reverse order, so a sequence's
tail blocks (the least shareable) are evicted before its head blocks.

For a match that may end inside a block (`planner.prefix_cache`, `prefix_match_unit` < block),
a block can also be findable by its *content*: its parent's chained hash and the token ids its
written rows hold (`register_content`), full or partial. They are indexed by (parent, first
token), so a lookup compares tokens with the few blocks that begin the same way under the same
parent (exact, no second hash): one entry per block, where hashing every unit-long prefix would
take block/unit entries (16 at unit 1). Reusing the block drops the entry.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from array import array
from typing import Iterable, Sequence

from kernels.checks import require

BlockHash = bytes
ROOT: BlockHash = b"root"  # the parent of a sequence's first block (`hash_block`'s chain start)


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """Hash of a full block given its parent's hash (None for the first block)."""
    return hashlib.sha256((parent or ROOT) + array("q", token_ids).tobytes()).digest()


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Append the chained hashes of the full blocks of `token_ids` not yet in `hashes`.

    The tokens are packed to bytes once, not per block: the hashing counts towards a warm
    request's TTFT.
    """
    require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
    first, last = len(hashes), len(token_ids) // block_size
    if last <= first:
        return hashes
    return append_block_hashes(hashes, token_ids[first * block_size : last * block_size], block_size)


def append_block_hashes(hashes: list[BlockHash], block_tokens: Sequence[int], block_size: int) -> list[BlockHash]:
    """Append the chained hashes of the whole blocks `block_tokens` holds, the block after
    `hashes[-1]` first (a trailing partial block is ignored). For a caller that has the new
    blocks' tokens without the whole sequence (a decoding request, every 16 tokens)."""
    data = memoryview(array("q", block_tokens).tobytes())
    step = block_size * 8
    parent = hashes[-1] if hashes else ROOT
    for i in range(len(block_tokens) // block_size):
        parent = hashlib.sha256(parent + data[i * step : (i + 1) * step]).digest()
        hashes.append(parent)
    return hashes


def hash_full_blocks(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """Chained hashes of every full block of `token_ids`."""
    return extend_block_hashes([], token_ids, block_size)


@dataclasses.dataclass(eq=False)
class KVBlock:
    """One paged-KV block: its id (its row range in the KV cache tensors), how many leases hold it,
    and, once full and published, the chained hash that makes it findable by later prompts."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and published
    # Findable by content (`BlockPool.register_content`): its parent's hash and its written rows' tokens.
    parent: BlockHash | None = None
    content: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


@dataclasses.dataclass
class BlockPoolStats:
    """Counters over a pool's lifetime (block counts, not tokens)."""

    allocated: int = 0
    freed: int = 0
    cache_hits: int = 0  # blocks adopted from the cache
    evicted: int = 0  # cached blocks reused for new content
    partial_hits: int = 0  # blocks whose leading rows a match copied into a fresh block (copy-on-write)
    copied_rows: int = 0  # token rows those copies moved


class BlockPool:
    """The fixed set of KV blocks: allocation (None on shortage, never a raise), reference counts,
    the hash -> block index of published blocks, and the LRU list of free blocks that keep their
    hash until reused. Leases over it live in `planner.prefix_cache`."""

    def __init__(self, num_blocks: int):
        require(num_blocks >= 1, "num_blocks", f"must be >= 1, got {num_blocks}")
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> block, oldest-freed first; OrderedDict gives O(1) pop-front, append, remove.
        self._free: collections.OrderedDict[int, KVBlock] = collections.OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        # (parent hash, first token) -> {block_id: block} of blocks findable by content
        self._by_content: dict[tuple[BlockHash, int], dict[int, KVBlock]] = {}
        self.stats = BlockPoolStats()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def free_block_ids(self) -> list[int]:
        """Free blocks in eviction order (next to be allocated first)."""
        return list(self._free)

    def get_cached(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def allocate(self, n: int) -> list[KVBlock] | None:
        """`n` fresh blocks with ref_cnt 1, or None (nothing changes) when fewer than `n` are free."""
        if n < 0:
            require(False, "n", f"must be >= 0, got {n}")
        if n > len(self._free):
            return None
        # the content entry dropped inline, names bound once: ~7 M blocks a whole-trace point
        pop, cached, by_content = self._free.popitem, self._cached, self._by_content
        out = []
        evicted = 0
        for _ in range(n):
            block = pop(False)[1]
            if block.block_hash is not None:
                del cached[block.block_hash]
                block.block_hash = None
                evicted += 1
            content = block.content
            if content:
                key = (block.parent, content[0])
                bucket = by_content[key]
                del bucket[block.block_id]
                if not bucket:
                    del by_content[key]
                block.parent, block.content = None, ()
            block.ref_cnt = 1
            out.append(block)
        self.stats.evicted += evicted
        self.stats.allocated += n
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cached blocks a request adopts (pulling free ones off the LRU list)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1
            self.stats.cache_hits += 1

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference from each block, last block first."""
        free = self._free
        for block in reversed(blocks):
            refs = block.ref_cnt
            if refs <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_cnt = refs - 1
            if refs == 1:
                free[block.block_id] = block
        self.stats.freed += len(blocks)

    def publish(self, block: KVBlock, block_hash: BlockHash) -> bool:
        """Make a full, computed block findable by its hash.

        Returns False when the hash is already cached by another block (this one stays a
        private duplicate) or the block is already published.
        """
        if block.ref_cnt <= 0:
            raise RuntimeError(f"publishing block {block.block_id}, which nobody holds")
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        self._cached[block_hash] = block
        return True

    def register_content(self, block: KVBlock, parent: BlockHash, content: Sequence[int]) -> None:
        """Make `block` findable by content: its rows [0, len(content)) hold the K/V of `content`,
        the tokens after the prefix whose chained hash is `parent`.

        A block is registered once per allocation: a full block when it is first published, a partial
        one when the lease writing it is released (`PrefixCache.register_tail`), and allocation drops
        the entry. A second registration is a bookkeeping slip (it could leave a block findable under
        a prefix it no longer holds), so it raises."""
        if not content:
            return
        if block.content:
            raise RuntimeError(f"block {block.block_id} is already findable by content; it is registered once "
                               "between allocations")
        content = tuple(content)
        block.parent, block.content = parent, content
        self._by_content.setdefault((parent, content[0]), {})[block.block_id] = block

    def publish_run(self, blocks: Sequence[KVBlock], block_hashes: Sequence[BlockHash], first: int, end: int,
                    content: Sequence[int] | None = None, block_size: int = 0) -> None:
        """`publish(blocks[i], block_hashes[i])` for i in [first, end), in order; with `content` (the
        tokens of blocks [first, end), `block_size` each) every block it publishes is also registered
        by content under its parent's hash (`register_content`). One call per chunk or decode block:
        the per-block calls were ~1/3 of a trace simulation's KV bookkeeping (7.4 M blocks)."""
        cached, by_content = self._cached, self._by_content
        parent = block_hashes[first - 1] if first else ROOT
        for i in range(first, end):
            block, block_hash = blocks[i], block_hashes[i]
            if block.ref_cnt <= 0:
                raise RuntimeError(f"publishing block {block.block_id}, which nobody holds")
            if block.block_hash is None and block_hash not in cached:
                block.block_hash = block_hash
                cached[block_hash] = block
                if content is not None:
                    if block.content:
                        raise RuntimeError(f"block {block.block_id} is already findable by content; it is "
                                           "registered once between allocations")
                    start = (i - first) * block_size
                    tokens = tuple(content[start:start + block_size])
                    block.parent, block.content = parent, tokens
                    key = (parent, tokens[0])
                    bucket = by_content.get(key)
                    if bucket is None:
                        by_content[key] = {block.block_id: block}
                    else:
                        bucket[block.block_id] = block
            parent = block_hash

    def longest_content_match(self, parent: BlockHash, tokens: Sequence[int]) -> tuple[KVBlock | None, int]:
        """The block registered under `parent` whose content shares the longest prefix with
        `tokens`, and that length (None, 0 when none begins with tokens[0]); ties go to the block
        registered last."""
        if not tokens:
            return None, 0
        best, best_len = None, 0
        for block in (self._by_content.get((parent, tokens[0])) or {}).values():
            n, limit = 0, min(len(block.content), len(tokens))
            while n < limit and block.content[n] == tokens[n]:
                n += 1
            if n >= best_len:
                best, best_len = block, n
        return best, best_len

    def check_invariants(self) -> None:
        """Internal consistency (tests call this after every operation)."""
        free_ids = set(self._free)
        for b in self.blocks:
            assert b.ref_cnt >= 0, b
            assert (b.ref_cnt == 0) == (b.block_id in free_ids), b
            if b.block_hash is not None:
                assert self._cached.get(b.block_hash) is b, b
        assert all(b.block_hash == h for h, b in self._cached.items())
        for (parent, first), bucket in self._by_content.items():
            assert all(b.parent == parent and b.content[0] == first and self.blocks[i] is b for i, b in bucket.items())
