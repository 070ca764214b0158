"""Per-request KV leases over the block pool, and the block-floored prefix match.

A request's KV is a lease: the blocks it holds, in position order, and two cursors read off
it. `num_computed_tokens` is where the request's prefill resumes (its KV *and* SSM state
cover [0, num_computed_tokens)); `num_cached_tokens` is how many leading positions came from
the cache. In a hybrid model the two differ: a warm request can adopt 32768 tokens of KV but
restore its SSM state only at a snapshot at 24577, so it replays from 24577 and must not
rewrite the shared blocks below 32768 (their KV is already there, and identical).

The match is block-floored and backed off one block when the cached blocks would cover the
whole prompt: at least one token must run to produce the logits the first sampled token
comes from.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from kernels.checks import require
from planner.block_pool import BlockHash, BlockPool, KVBlock


@dataclasses.dataclass(eq=False)
class KVLease:
    """The KV blocks one request holds, in position order, and the cursors read off them:
    `num_computed_tokens` (where its prefill resumes), `num_cached_tokens` (leading positions
    adopted from the cache) and `num_published_blocks` (blocks already findable by hash)."""

    block_size: int
    blocks: list[KVBlock] = dataclasses.field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_published_blocks: int = 0

    _ids: list[int] = dataclasses.field(default_factory=list, repr=False)
    _ids_of: list | None = dataclasses.field(default=None, repr=False)

    @property
    def block_ids(self) -> list[int]:
        """Block ids in position order. Blocks are only appended, so the list is extended, not
        rebuilt, and returned without a copy: a decode row asks for it every token, and a copy of a
        12,000-token prompt's 750 ids per decode token was 5% of a trace simulation. Read it, do
        not change it (a release starts a new list; an append only makes an old table longer)."""
        if self._ids_of is not self.blocks or len(self._ids) > len(self.blocks):
            self._ids, self._ids_of = [], self.blocks
        if len(self._ids) < len(self.blocks):
            self._ids.extend(b.block_id for b in self.blocks[len(self._ids):])
        return self._ids

    @property
    def capacity(self) -> int:
        return len(self.blocks) * self.block_size

    def advance(self, num_tokens: int) -> None:
        """Record that the next `num_tokens` positions were computed and written."""
        if not (1 <= num_tokens and self.num_computed_tokens + num_tokens <= self.capacity):  # message built only here
            require(False, "num_tokens", f"must be in [1, {self.capacity - self.num_computed_tokens}] "
                    f"(lease capacity {self.capacity}, computed {self.num_computed_tokens}), got {num_tokens}")
        self.num_computed_tokens += num_tokens


class PrefixCache:
    """Block-floored prefix matching and publication over a `BlockPool`."""

    def __init__(self, pool: BlockPool, block_size: int, enabled: bool = True):
        require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled

    def match(self, token_ids: Sequence[int], block_hashes: Sequence[BlockHash]) -> list[KVBlock]:
        """The cached blocks covering the longest cached prefix, backed off one block if whole.

        Does not take references: call `adopt` with the result.
        """
        if not self.enabled:
            return []
        matched: list[KVBlock] = []
        for h in block_hashes[: len(token_ids) // self.block_size]:
            block = self.pool.get_cached(h)
            if block is None:
                break
            matched.append(block)
        if matched and len(matched) * self.block_size >= len(token_ids):
            matched.pop()
        return matched

    def adopt(self, blocks: list[KVBlock]) -> KVLease:
        """A new lease holding `blocks` (references taken); its computed cursor starts at 0."""
        self.pool.touch(blocks)
        return KVLease(self.block_size, list(blocks), 0, len(blocks) * self.block_size, len(blocks))

    def allocate(self, lease: KVLease, num_tokens: int) -> bool:
        """Grow `lease` to hold `num_tokens` positions; False (lease unchanged) when the pool is short."""
        need = -(-num_tokens // self.block_size) - len(lease.blocks)
        if need <= 0:
            return True
        fresh = self.pool.allocate(need)
        if fresh is None:
            return False
        lease.blocks.extend(fresh)
        return True

    def publish(self, lease: KVLease, block_hashes: Sequence[BlockHash]) -> None:
        """Publish every full block whose positions are all computed (prompt and decode alike)."""
        if not self.enabled or lease.num_computed_tokens // self.block_size <= lease.num_published_blocks:
            return  # nothing new is full (a decode row, 15 times in 16 at block 16)
        full = min(lease.num_computed_tokens // self.block_size, len(block_hashes), len(lease.blocks))
        for i in range(lease.num_published_blocks, full):
            self.pool.publish(lease.blocks[i], block_hashes[i])
        lease.num_published_blocks = max(lease.num_published_blocks, full)

    def release(self, lease: KVLease) -> None:
        """Return every block of `lease` to the pool (last block first)."""
        self.pool.free(lease.blocks)
        lease.blocks = []
        lease.num_computed_tokens = lease.num_cached_tokens = lease.num_published_blocks = 0
