"""The seed's pinned placement rules and the `aligned` policy built from them (the fix).

A later request's prefix match is *block-floored* (whole KV blocks only), and an SSM layer
can resume only from a snapshot at or below the match. So chunk ends decide what is reusable:

* a non-last chunk ends on a KV block boundary, and a chunk that would span the prompt's
  tail split point ends exactly there;
* a last chunk is never shortened; if it spans the split point, the state at that offset is
  captured inside the chunk (the scan emits it in-pass) or the chunk runs as two passes.

The legacy policy (before the fix, `legacy.py`) kept every non-last chunk at its proposed length
and saved a snapshot at every non-last chunk end. With the dense-serve budget (first chunk
8193 = 8192 + 1 slot, later ones 8192) its chunk ends sit one token past a block boundary, and
a 32772-token prompt's split point 32752 falls inside the chunk 24577..32769: no tail snapshot,
so the identical warm request matches 32768 tokens of KV but restores at 24577 and replays
8195 tokens instead of 20.

Positions are token counts from the prompt start; `block_size` is the KV block size.
"""

from __future__ import annotations

from kernels.checks import require
from planner.policies.base import PlacementPolicy, PlanContext, check_chunk_args, check_total_and_block


def last_block_boundary(total: int, block_size: int) -> int:
    """The last block boundary strictly under `total` (0 when total <= block_size)."""
    check_total_and_block(total, block_size)
    return ((total - 1) // block_size) * block_size


def tail_split_point(total: int, block_size: int) -> int | None:
    """One block below the last boundary under `total`, or None when that is not above 0.

    An identical warm request matches up to the last boundary (its full blocks, backed off one
    block when they cover the whole prompt); a next turn's match lands at or one block below
    it. A snapshot here is restorable by both.
    """
    split = last_block_boundary(total, block_size) - block_size
    return split if split > 0 else None


def is_prompt_tail_end(end_token: int, total: int, block_size: int) -> bool:
    """Whether a chunk end is a prompt-tail checkpoint: the last boundary or the split point."""
    check_total_and_block(total, block_size)
    if end_token <= 0:
        return False
    return end_token == last_block_boundary(total, block_size) or end_token == tail_split_point(total, block_size)


def check_interval(interval: int, name: str = "interval") -> None:
    """The snapshot interval's one check: a count of blocks, 0 turning interval snapshots off."""
    require(interval >= 0, name, f"must be >= 0 blocks (0 = off), got {interval}")


def is_checkpoint_chunk_end(end_token: int, total: int, block_size: int, interval: int) -> bool:
    """Whether a non-last chunk ending at `end_token` saves an SSM snapshot (aligned policy).

    A prompt-tail end, or a block boundary whose block index is a positive multiple of
    `interval` blocks (`interval=0` turns interval snapshots off; block 0 never checkpoints).
    """
    check_interval(interval)
    if is_prompt_tail_end(end_token, total, block_size):
        return True
    if interval == 0 or end_token <= 0 or end_token % block_size:
        return False
    return (end_token // block_size) % interval == 0


def plan_chunk_len(offset: int, total: int, proposed: int, block_size: int) -> int:
    """Length of the prefill chunk at `offset` of a `total`-token prompt (aligned policy).

    `proposed` is already capped by the token budget and by what is left. A last chunk is
    returned unchanged; a non-last chunk spanning the split point ends there; otherwise its
    end is floored to a block boundary when that leaves at least one token. Always in
    1..=proposed.
    """
    check_chunk_args(offset, total, proposed, block_size)
    end = offset + proposed
    if end >= total:
        return proposed
    split = tail_split_point(total, block_size)
    if split is not None and offset < split < end:
        return split - offset
    floored = (end // block_size) * block_size
    return floored - offset if floored > offset else proposed


def last_chunk_capture_offsets(offset: int, length: int, total: int, block_size: int) -> tuple[int, ...]:
    """In-chunk offsets to capture for the last chunk [offset, offset+length) of the prompt.

    Both the aligned and the legacy policy cut a last chunk at the tail split point when it spans
    it (the seed's `prefill_chunk_dispatch`); this returns that cut relative to the chunk start, or ().
    """
    check_chunk_args(offset, total, length, block_size)
    if offset + length < total:
        return ()
    split = tail_split_point(total, block_size)
    if split is not None and offset < split < total:
        return (split - offset,)
    return ()


class Aligned(PlacementPolicy):
    """This project: the seed's fix (planner/policies/aligned.py's module docstring). Non-last
    chunks end on KV block boundaries and at the prompt's tail split point; a snapshot at the tail
    ends (and every `interval` blocks); a last chunk spanning the split point captures the state
    there."""

    name = "aligned"

    def chunk_len(self, offset: int, total: int, proposed: int, ctx: PlanContext) -> int:
        return plan_chunk_len(offset, total, proposed, ctx.block_size)

    def saves_snapshot(self, end: int, total: int, ctx: PlanContext) -> bool:
        return is_checkpoint_chunk_end(end, total, ctx.block_size, ctx.interval)

    def last_captures(self, offset: int, length: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        return last_chunk_capture_offsets(offset, length, total, ctx.block_size)
