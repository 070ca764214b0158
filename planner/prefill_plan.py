"""A prompt's prefill chunks under a placement policy: where each ends and where it leaves a snapshot.

The rules are the policy's (`planner.policies`: one class per policy, named in
`planner.policies.registry`); this module applies them one chunk at a time (`plan_chunk`, which
the scheduler calls tick by tick) or to a whole prompt (`plan_prompt`). Why chunk ends decide
what a later request can restore: `planner/policies/aligned.py`.

Positions are token counts from the prompt start; `block_size` is the KV block size.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from kernels.checks import require
from planner.policies.base import PlacementPolicy, PlanContext
from planner.policies.registry import get_policy


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
    """One planned prefill chunk [offset, offset + length) of a `total`-token prompt."""

    offset: int
    length: int
    total: int
    snapshot_at_end: bool  # a non-last chunk whose end saves an SSM snapshot
    capture_offsets: tuple[int, ...]  # in-chunk offsets whose state the chunk captures in its scan launch
    # The positions among `snapshot_positions` that the policy's own chunk rules save (a saving
    # chunk end, a last chunk's captures), whatever marks also asked for them: such a save is never
    # speculative, even where it lands on a speculative grid (ours-plus's tail split point at 2048).
    rule_positions: tuple[int, ...] = ()

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
    offset: int, total: int, proposed: int, block_size: int, interval: int, policy: PlacementPolicy,
    marks: Sequence[int] = (), ctx: PlanContext | None = None,
) -> ChunkPlan:
    """The chunk at `offset` under `policy`, with its snapshot and capture decisions. `policy` is the
    object, never a name: the scheduler calls this every tick, and a name is resolved once, where the
    engine is built (`planner.policies.registry.get_policy`). `marks`: positions this request must
    leave a snapshot at (the policy's admission marks); `ctx` defaults to `PlanContext(block_size,
    interval)`. `interval` is checked where it is used (`planner.policies.aligned.is_checkpoint_chunk_end`)."""
    if not isinstance(policy, PlacementPolicy):  # (the message is built only then: this runs every chunk)
        require(False, "policy",
                f"must be a PlacementPolicy (resolve a name once: planner.policies.registry.get_policy), got {policy!r}")
    ctx = ctx or PlanContext(block_size, interval)
    length = policy.chunk_len(offset, total, proposed, ctx)
    inside = [m for m in marks if offset < m < offset + length]
    if inside and policy.mark_mode == "stop":
        length = min(inside) - offset
        inside = []
    end = offset + length
    if end < total:
        by_rule = policy.saves_snapshot(end, total, ctx)
        return ChunkPlan(offset, length, total, by_rule or end in marks, tuple(m - offset for m in sorted(inside)),
                         (end,) if by_rule else ())
    by_rule = set(policy.last_captures(offset, length, total, ctx))
    captures = by_rule | {m - offset for m in inside}
    return ChunkPlan(offset, length, total, False, tuple(sorted(captures)), tuple(sorted(offset + o for o in by_rule)))


def plan_prompt(
    total: int, block_size: int, budget_per_chunk: Callable[[int], int] | int, interval: int,
    policy: PlacementPolicy | str = "aligned", start: int = 0, marks: Sequence[int] = (),
    ctx: PlanContext | None = None,
) -> list[ChunkPlan]:
    """Every chunk of one prompt from `start`, given the budget of the i-th chunk (no scheduler).

    A quick way to see a policy's chunk ends (`policy`: the object or its name, resolved here once
    for the prompt); the scheduler builds the same plans tick by tick.
    """
    policy = get_policy(policy)
    budget = (lambda i: budget_per_chunk) if isinstance(budget_per_chunk, int) else budget_per_chunk
    plans, offset = [], start
    while offset < total:
        plan = plan_chunk(offset, total, min(budget(len(plans)), total - offset), block_size, interval, policy,
                          marks, ctx)
        plans.append(plan)
        offset = plan.end
    return plans
