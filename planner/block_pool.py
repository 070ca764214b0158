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

What the index costs until a lookup reads it: a full block registered at publication
(`register_blocks`) keeps a reference to the tokens its publisher already holds (one slice per
publication, shared by its blocks), not a tuple of its own; reusing the block only marks its
entry dead (the bucket keeps it until the dead outnumber the live, then every bucket is swept
once). On the whole Mooncake conversation trace (ours-plus, token-granular) 7.3 M blocks were
registered and 7.0 M unregistered, each through a tuple, a key and a one-entry dict made and
dropped, for ~13 K lookups.
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


# A block findable by content, as a list (made 7.3 M times on a whole trace: a list is the cheapest
# mutable record): [block, parent hash, tokens, offset, length], its rows holding
# tokens[offset:offset + length] (a sequence the publisher shares with its other blocks: nothing is
# copied until a lookup compares them).
_BLOCK, _PARENT, _TOKENS, _OFFSET, _LENGTH = range(5)


def _entry_content(entry: list) -> tuple[int, ...]:
    return tuple(entry[_TOKENS][entry[_OFFSET]:entry[_OFFSET] + entry[_LENGTH]])


@dataclasses.dataclass(eq=False)
class KVBlock:
    """One paged-KV block: its id (its row range in the KV cache tensors), how many leases hold it,
    and, once full and published, the chained hash that makes it findable by later prompts."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and published
    # Findable by content (`BlockPool.register_content`): its live index entry (None: not findable).
    entry: list | None = dataclasses.field(default=None, repr=False)

    @property
    def parent(self) -> BlockHash | None:
        """The chained hash of the prefix before it, while findable by content."""
        return None if self.entry is None else self.entry[_PARENT]

    @parent.setter
    def parent(self, value: BlockHash) -> None:  # (tests spoil an entry through it)
        self.entry[_PARENT] = value

    @property
    def content(self) -> tuple[int, ...]:
        """The tokens its written rows hold, while findable by content (else ())."""
        return () if self.entry is None else _entry_content(self.entry)

    @content.setter
    def content(self, value: Sequence[int]) -> None:  # (tests spoil an entry through it)
        self.entry[_TOKENS:] = [tuple(value), 0, len(value)]

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
        # (parent hash, first token) -> entries of blocks findable by content, oldest first; an entry
        # whose block has moved on (`block.entry is not entry`) is dead and skipped (module docstring)
        self._by_content: dict[tuple[BlockHash, int], list[list]] = {}
        self._entries = self._dead_entries = 0  # entries in the buckets, and of them the dead
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
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                block.block_hash = None
                self.stats.evicted += 1
            if block.entry is not None:  # no longer findable by content: its entry is dead
                block.entry = None
                self._dead_entries += 1
            block.ref_cnt = 1
            out.append(block)
        self.stats.allocated += n
        if self._dead_entries > max(self._entries - self._dead_entries, 4096):
            self._sweep_content()
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
        for block in reversed(blocks):
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
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

    def publish_blocks(self, blocks: Sequence[KVBlock], hashes: Sequence[BlockHash], first: int, end: int) -> list[int]:
        """`publish` of blocks[i] under hashes[i] for i in [first, end), in order (one call a chunk, not
        one a block); returns the indices it published."""
        cached, out = self._cached, []
        for i in range(first, end):
            block, block_hash = blocks[i], hashes[i]
            if block.ref_cnt <= 0:
                raise RuntimeError(f"publishing block {block.block_id}, which nobody holds")
            if block.block_hash is None and block_hash not in cached:
                block.block_hash = block_hash
                cached[block_hash] = block
                out.append(i)
        return out

    def register_content(self, block: KVBlock, parent: BlockHash, content: Sequence[int]) -> None:
        """Make `block` findable by content: its rows [0, len(content)) hold the K/V of `content`,
        the tokens after the prefix whose chained hash is `parent`.

        A block is registered once per allocation: a full block when it is first published, a partial
        one when the lease writing it is released (`PrefixCache.register_tail`), and allocation drops
        the entry. A second registration is a bookkeeping slip (it could leave a block findable under
        a prefix it no longer holds), so it raises."""
        if not content:
            return
        content = tuple(content)
        self._register(block, parent, content, 0, len(content))

    def register_blocks(self, blocks: Sequence[KVBlock], hashes: Sequence[BlockHash], indices: Sequence[int],
                        tokens: Sequence[int], block_size: int) -> None:
        """`register_content` of each full block blocks[i], i in `indices` (ascending): its parent is
        hashes[i - 1] (ROOT for the first), its rows hold tokens[(i - indices[0]) * block_size:][:block_size].
        `tokens` is referenced, not copied: the caller never changes it."""
        by_content, base = self._by_content, indices[0]
        for i in indices:
            block = blocks[i]
            if block.entry is not None:
                self._refuse_second(block)
            offset = (i - base) * block_size
            parent = hashes[i - 1] if i else ROOT
            block.entry = entry = [block, parent, tokens, offset, block_size]
            bucket = by_content.get((parent, tokens[offset]))
            if bucket is None:
                by_content[(parent, tokens[offset])] = [entry]
            else:
                bucket.append(entry)
        self._entries += len(indices)

    def _register(self, block: KVBlock, parent: BlockHash, tokens: Sequence[int], offset: int, length: int) -> None:
        if block.entry is not None:
            self._refuse_second(block)
        block.entry = entry = [block, parent, tokens, offset, length]
        bucket = self._by_content.get((parent, tokens[offset]))
        if bucket is None:
            self._by_content[(parent, tokens[offset])] = [entry]
        else:
            bucket.append(entry)
        self._entries += 1

    @staticmethod
    def _refuse_second(block: KVBlock) -> None:
        raise RuntimeError(f"block {block.block_id} is already findable by content; it is registered once "
                           "between allocations")

    def _sweep_content(self) -> None:
        """Drop every dead entry (amortised: run once the dead outnumber the live)."""
        swept = {}
        for key, bucket in self._by_content.items():
            live = [e for e in bucket if e[_BLOCK].entry is e]
            if live:
                swept[key] = live
        self._by_content = swept
        self._entries -= self._dead_entries
        self._dead_entries = 0

    def longest_content_match(self, parent: BlockHash, tokens: Sequence[int]) -> tuple[KVBlock | None, int]:
        """The block registered under `parent` whose content shares the longest prefix with
        `tokens`, and that length (None, 0 when none begins with tokens[0]); ties go to the block
        registered last."""
        if not tokens:
            return None, 0
        best, best_len = None, 0
        for entry in self._by_content.get((parent, tokens[0]), ()):
            block = entry[_BLOCK]
            if block.entry is not entry:
                continue  # dead: its block was reused
            held, o = entry[_TOKENS], entry[_OFFSET]
            n, limit = 0, min(entry[_LENGTH], len(tokens))
            while n < limit and held[o + n] == tokens[n]:
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
        filed = set()
        for (parent, first), bucket in self._by_content.items():
            for e in bucket:
                block = e[_BLOCK]
                if block.entry is e:  # live (a dead one is only waiting for the sweep)
                    assert e[_PARENT] == parent and _entry_content(e)[0] == first, e
                    assert self.blocks[block.block_id] is block, e
                    filed.add(id(e))
        for b in self.blocks:
            assert b.entry is None or (b.entry[_BLOCK] is b and id(b.entry) in filed), b
        dead = sum(e[_BLOCK].entry is not e for bucket in self._by_content.values() for e in bucket)
        assert (self._entries - self._dead_entries, self._dead_entries) == (len(filed), dead)
