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

With a `match_unit` under the block (`SchedulerConfig.prefix_match_unit`; 1 = any token) the match
is the longest cached prefix floored to the unit and capped at the prompt length minus one (the
same rule: at the block unit it is the block-floored, backed-off match above). Whole blocks are
still found by hash and shared; where the match ends inside a block, the leading rows of a block
that holds them (`BlockPool.longest_content_match`: a full block of another prompt, or a finished
request's partial last block) are copied into a fresh block the new request owns, and it writes
the rest (copy-on-write: a shared block is never written). The copy is a (source, destination,
rows) triple the engine runs before the tick's forward; the source is held until then.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from kernels.checks import require
from planner.block_pool import ROOT, BlockHash, BlockPool, KVBlock


def _parent(block_hashes: Sequence[BlockHash], index: int) -> BlockHash:
    """The chained hash of the prefix before block `index` (ROOT for the first block)."""
    return block_hashes[index - 1] if index else ROOT


@dataclasses.dataclass(frozen=True)
class PrefixMatch:
    """A prompt's cached prefix: whole blocks shared by hash, then optionally the first `rows` rows
    of `partial` (another block) to copy into a fresh block. `num_tokens` positions in all."""

    blocks: tuple[KVBlock, ...]
    block_size: int
    partial: KVBlock | None = None
    rows: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.blocks) * self.block_size + self.rows


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
        ids, blocks = self._ids, self.blocks
        if self._ids_of is blocks and len(ids) == len(blocks):
            return ids  # (a decode row, 15 times in 16)
        if self._ids_of is not blocks or len(ids) > len(blocks):
            ids = self._ids = []
            self._ids_of = blocks
        if len(ids) < len(blocks):
            ids.extend(b.block_id for b in blocks[len(ids):])
        return ids

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

    def __init__(self, pool: BlockPool, block_size: int, enabled: bool = True, match_unit: int = 0):
        """`match_unit`: the granularity a match ends on, dividing `block_size` (0: the block)."""
        require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
        match_unit = match_unit or block_size
        require(match_unit >= 1 and block_size % match_unit == 0, "prefix_match_unit",
                f"must divide block_size={block_size} (0: the block), got {match_unit}")
        self.pool = pool
        self.block_size = block_size
        self.enabled = enabled
        self.match_unit = match_unit

    @property
    def token_granular(self) -> bool:
        """Whether a match may end inside a block (a unit under the block)."""
        return self.match_unit < self.block_size

    def match(self, token_ids: Sequence[int], block_hashes: Sequence[BlockHash]) -> list[KVBlock]:
        """The cached blocks covering the longest cached prefix, backed off one block if whole.

        Does not take references: call `adopt` with the result.
        """
        if not self.enabled:
            return []
        matched = self._whole_blocks(block_hashes, len(token_ids) // self.block_size)
        if matched and len(matched) * self.block_size >= len(token_ids):
            matched.pop()
        return matched

    def _whole_blocks(self, block_hashes: Sequence[BlockHash], most: int) -> list[KVBlock]:
        """The cached blocks of the leading `block_hashes`, at most `most`, up to the first not cached."""
        blocks: list[KVBlock] = []
        for h in block_hashes[:most]:
            block = self.pool.get_cached(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def find(self, token_ids: Sequence[int], block_hashes: Sequence[BlockHash]) -> PrefixMatch:
        """The longest cached prefix of `token_ids`, floored to the match unit and capped at
        len(token_ids) - 1 (module docstring). At the block unit: `match`'s blocks."""
        bs = self.block_size
        if not self.token_granular or not self.enabled:
            return PrefixMatch(tuple(self.match(token_ids, block_hashes)), bs)
        limit = len(token_ids) - 1
        blocks = self._whole_blocks(block_hashes, limit // bs)
        start = len(blocks) * bs
        want = token_ids[start : min(start + bs, limit)]
        source, common = self.pool.longest_content_match(_parent(block_hashes, len(blocks)), want)
        rows = common // self.match_unit * self.match_unit
        return PrefixMatch(tuple(blocks), bs, source if rows else None, rows)

    def adopt(self, blocks: Sequence[KVBlock]) -> KVLease:
        """A new lease holding `blocks` (references taken); its computed cursor starts at 0."""
        self.pool.touch(blocks)
        return KVLease(self.block_size, list(blocks), 0, len(blocks) * self.block_size, len(blocks))

    def adopt_match(self, match: PrefixMatch) -> tuple[KVLease, tuple[int, int, int] | None]:
        """A lease over `match`: its whole blocks adopted and, for a partial block, a fresh block whose
        first `match.rows` rows are to be copied from `match.partial`. Returns the lease and the copy
        (source id, destination id, rows), or None when there is nothing to copy or no free block
        (the lease then ends at the whole blocks). With a copy, the source is held (a reference taken
        here) so no allocation hands it out; the caller drops it (`pool.free`) once the copy has run."""
        lease = self.adopt(match.blocks)
        if match.partial is None:
            return lease, None
        self.pool.touch([match.partial])  # no allocation below may hand the source out
        fresh = self.pool.allocate(1)
        if fresh is None:
            self.pool.free([match.partial])
            return lease, None
        lease.blocks.extend(fresh)
        lease.num_cached_tokens += match.rows
        self.pool.stats.partial_hits += 1
        self.pool.stats.copied_rows += match.rows
        return lease, (match.partial.block_id, fresh[0].block_id, match.rows)

    def register_tail(self, lease: KVLease, block_hashes: Sequence[BlockHash],
                      tokens: Callable[[int, int], Sequence[int]]) -> None:
        """Make the lease's partly written last block findable by content (token-granular matching
        only): its rows hold `tokens(block start, written end)`, the written end being the larger of
        the computed and cached cursors. Called before the lease is released."""
        if not (self.enabled and self.token_granular):
            return
        bs = self.block_size
        end = max(lease.num_computed_tokens, lease.num_cached_tokens)
        full = end // bs
        if end % bs == 0 or full >= len(lease.blocks) or full > len(block_hashes):
            return
        self.pool.register_content(lease.blocks[full], _parent(block_hashes, full), tokens(full * bs, end))

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

    def publish(self, lease: KVLease, block_hashes: Sequence[BlockHash],
                tokens: Callable[[int, int], Sequence[int]] | None = None) -> None:
        """Publish every full block whose positions are all computed (prompt and decode alike);
        with `tokens(start, end)` (the sequence's tokens in [start, end), `Request.tokens`) and a unit
        under the block, each is also made findable by content, for matches ending inside it."""
        if not self.enabled or lease.num_computed_tokens // self.block_size <= lease.num_published_blocks:
            return  # nothing new is full (a decode row, 15 times in 16 at block 16)
        bs, first = self.block_size, lease.num_published_blocks
        full = min(lease.num_computed_tokens // bs, len(block_hashes), len(lease.blocks))
        if full > first:  # the blocks' tokens fetched once, not per block
            content = tokens(first * bs, full * bs) if self.token_granular and tokens is not None else None
            self.pool.publish_run(lease.blocks, block_hashes, first, full, content, bs)
        lease.num_published_blocks = max(lease.num_published_blocks, full)

    def release(self, lease: KVLease) -> None:
        """Return every block of `lease` to the pool (last block first)."""
        self.pool.free(lease.blocks)
        lease.blocks = []
        lease.num_computed_tokens = lease.num_cached_tokens = lease.num_published_blocks = 0
