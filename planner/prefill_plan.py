"""Where prefill chunks end, and which chunk ends carry an SSM snapshot.

A later request's prefix match is *block-floored* (whole KV blocks only), and an SSM layer
can resume only from a snapshot at or below the match. So chunk ends decide what is reusable:

* a non-last chunk ends on a KV block boundary, and a chunk that would span the prompt's
  tail split point ends exactly there;
* a last chunk is never shortened; if it spans the split point, the state at that offset is
  captured inside the chunk (the scan emits it in-pass) or the chunk runs as two passes.

The legacy policy (before the fix) kept every non-last chunk at its proposed length and saved
a snapshot at every non-last chunk end. With the dense-serve budget (first chunk 8193 =
8192 + 1 slot, later ones 8192) its chunk ends sit one token past a block boundary, and a
32772-token prompt's split point 32752 falls inside the chunk 24577..32769: no tail snapshot,
so the identical warm request matches 32768 tokens of KV but restores at 24577 and replays
8195 tokens instead of 20.

Positions are token counts from the prompt start; `block_size` is the KV block size.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from kernels.checks import require


def _check_total_and_block(total: int, block_size: int) -> None:
    require(block_size >= 1, "block_size", f"must be >= 1, got {block_size}")
    require(total >= 1, "total", f"must be >= 1, got {total}")


def last_block_boundary(total: int, block_size: int) -> int:
    """The last block boundary strictly under `total` (0 when total <= block_size)."""
    _check_total_and_block(total, block_size)
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
    _check_total_and_block(total, block_size)
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


def _check_chunk_args(offset: int, total: int, proposed: int, block_size: int) -> None:
    _check_total_and_block(total, block_size)
    require(0 <= offset < total, "offset", f"must be in [0, {total}) for total={total}, got {offset}")
    require(
        1 <= proposed <= total - offset,
        "proposed",
        f"must be in [1, {total - offset}] (tokens left after offset={offset}), got {proposed}",
    )


def plan_chunk_len(offset: int, total: int, proposed: int, block_size: int) -> int:
    """Length of the prefill chunk at `offset` of a `total`-token prompt (aligned policy).

    `proposed` is already capped by the token budget and by what is left. A last chunk is
    returned unchanged; a non-last chunk spanning the split point ends there; otherwise its
    end is floored to a block boundary when that leaves at least one token. Always in
    1..=proposed.
    """
    _check_chunk_args(offset, total, proposed, block_size)
    end = offset + proposed
    if end >= total:
        return proposed
    split = tail_split_point(total, block_size)
    if split is not None and offset < split < end:
        return split - offset
    floored = (end // block_size) * block_size
    return floored - offset if floored > offset else proposed


def plan_chunk_len_legacy(offset: int, total: int, proposed: int, block_size: int) -> int:
    """Legacy policy: every chunk keeps its proposed length."""
    _check_chunk_args(offset, total, proposed, block_size)
    return proposed


def is_checkpoint_chunk_end_legacy(end_token: int, total: int, block_size: int, interval: int) -> bool:
    """Legacy policy: every non-last chunk end saves a snapshot, aligned or not (`interval` unused)."""
    _check_total_and_block(total, block_size)
    return 0 < end_token < total


def last_chunk_capture_offsets(offset: int, length: int, total: int, block_size: int) -> tuple[int, ...]:
    """In-chunk offsets to capture for the last chunk [offset, offset+length) of the prompt.

    Both policies cut a last chunk at the tail split point when it spans it (the seed's
    `prefill_chunk_dispatch`); this returns that cut relative to the chunk start, or ().
    """
    _check_chunk_args(offset, total, length, block_size)
    if offset + length < total:
        return ()
    split = tail_split_point(total, block_size)
    if split is not None and offset < split < total:
        return (split - offset,)
    return ()


@dataclasses.dataclass(frozen=True)
class PlanContext:
    """What a policy's rules may read besides the chunk itself.

    `block_size` is the KV block (the prefix match's granularity); `state_block` the granularity
    at which a policy keeps block-aligned states (vLLM's padded block; 0 = the KV block);
    `kernel_chunk` the SSD kernel's chunk (SGLang's state grid); `interval` interval snapshots
    in KV blocks (0 = off).
    """

    block_size: int
    interval: int = 0
    state_block: int = 0
    kernel_chunk: int = 256

    @property
    def state_grid(self) -> int:
        return self.state_block or self.block_size


def _no_marks(kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class ChunkPolicy:
    """A named set of placement rules: where chunks end, which non-last ends save a snapshot,
    which in-chunk offsets a last chunk captures, and which positions a request must leave a
    snapshot at, decided once at admission from its KV match and restore point (`marks`).

    A mark strictly inside a chunk either stops the chunk there (`mark_mode="stop"`: one more
    forward, the state saved at the chunk end) or is captured inside the same scan launch
    (`"capture"`). `speculative_marks` are marks no request has asked for yet (a grid, say):
    planned like the others, but their snapshots go into free snapshot memory only, unless the
    eviction policy's `admits` judges them worth an eviction (`SnapshotStore.save(origin="speculative")`).
    `source` names where the rules come from.
    """

    name: str
    chunk_len: Callable[[int, int, int, PlanContext], int]
    saves_snapshot: Callable[[int, int, PlanContext], bool]
    last_captures: Callable[[int, int, int, PlanContext], tuple[int, ...]] = \
        lambda offset, length, total, ctx: last_chunk_capture_offsets(offset, length, total, ctx.block_size)
    marks: Callable[[int, int, int, PlanContext], tuple[int, ...]] = _no_marks
    mark_mode: str = "stop"
    speculative_marks: Callable[[int, int, int, PlanContext], tuple[int, ...]] = _no_marks
    source: str = ""

    def __post_init__(self):
        require(self.mark_mode in ("stop", "capture"), "mark_mode",
                f"must be 'stop' or 'capture', got {self.mark_mode!r}")


POLICIES: dict[str, ChunkPolicy] = {
    "aligned": ChunkPolicy(
        "aligned", lambda o, t, p, ctx: plan_chunk_len(o, t, p, ctx.block_size),
        lambda e, t, ctx: is_checkpoint_chunk_end(e, t, ctx.block_size, ctx.interval),
        source="this project: the seed's fix (planner.prefill_plan module docstring)"),
    "legacy": ChunkPolicy(
        "legacy", lambda o, t, p, ctx: plan_chunk_len_legacy(o, t, p, ctx.block_size),
        lambda e, t, ctx: is_checkpoint_chunk_end_legacy(e, t, ctx.block_size, ctx.interval),
        source="the seed's engine before the fix"),
}


def get_policy(policy: ChunkPolicy | str) -> ChunkPolicy:
    """The chunk policy named `policy` (a `ChunkPolicy` is returned as is): the one place a name is resolved."""
    if isinstance(policy, ChunkPolicy):
        return policy
    require(policy in POLICIES, "policy", f"must be one of {sorted(POLICIES)}, got {policy!r}")
    return POLICIES[policy]


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """One planned prefill chunk [offset, offset + length) of a `total`-token prompt."""

    offset: int
    length: int
    total: int
    snapshot_at_end: bool  # a non-last chunk whose end saves an SSM snapshot
    capture_offsets: tuple[int, ...]  # in-chunk offsets whose state the chunk captures in its scan launch

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def is_last(self) -> bool:
        return self.end >= self.total

    @property
    def snapshot_positions(self) -> tuple[int, ...]:
        """Absolute positions this chunk leaves a snapshot at."""
        captured = tuple(self.offset + o for o in self.capture_offsets)
        return captured + ((self.end,) if self.snapshot_at_end else ())


def plan_chunk(
    offset: int, total: int, proposed: int, block_size: int, interval: int, policy: ChunkPolicy | str = "aligned",
    marks: Sequence[int] = (), ctx: PlanContext | None = None,
) -> ChunkPlan:
    """The chunk at `offset` under `policy` (a `ChunkPolicy` or its name), with its snapshot and
    capture decisions. `marks`: positions this request must leave a snapshot at (the policy's
    admission marks); `ctx` defaults to `PlanContext(block_size, interval)`. `interval` is checked
    where it is used (`is_checkpoint_chunk_end`)."""
    policy = get_policy(policy)
    ctx = ctx or PlanContext(block_size, interval)
    length = policy.chunk_len(offset, total, proposed, ctx)
    inside = [m for m in marks if offset < m < offset + length]
    if inside and policy.mark_mode == "stop":
        length = min(inside) - offset
        inside = []
    end = offset + length
    if end < total:
        snap = policy.saves_snapshot(end, total, ctx) or end in marks
        return ChunkPlan(offset, length, total, snap, tuple(m - offset for m in sorted(inside)))
    captures = set(policy.last_captures(offset, length, total, ctx)) | {m - offset for m in inside}
    return ChunkPlan(offset, length, total, False, tuple(sorted(captures)))


def plan_prompt(
    total: int, block_size: int, budget_per_chunk: Callable[[int], int] | int, interval: int,
    policy: ChunkPolicy | str = "aligned", start: int = 0, marks: Sequence[int] = (), ctx: PlanContext | None = None,
) -> list[ChunkPlan]:
    """Every chunk of one prompt from `start`, given the budget of the i-th chunk (no scheduler).

    A quick way to see a policy's chunk ends; the scheduler builds the same plans tick by tick.
    """
    budget = (lambda i: budget_per_chunk) if isinstance(budget_per_chunk, int) else budget_per_chunk
    plans, offset = [], start
    while offset < total:
        plan = plan_chunk(offset, total, min(budget(len(plans)), total - offset), block_size, interval, policy,
                          marks, ctx)
        plans.append(plan)
        offset = plan.end
    return plans


# The peers' placements (built from this module's rules) add themselves to POLICIES on import.
import planner.placements  # noqa: E402,F401
