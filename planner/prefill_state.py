"""One request's prefill as a resumable state machine.

Chunking is a scheduling boundary, not a numerical one: each chunk runs the same prompt slice
at the same positions, so chunk sizes never change logits. The position a prefill resumes
from is read off its KV lease every time, never kept in a second counter: a counter that
started at 0 beside a lease that had adopted a cached prefix is how a warm request ends up
re-running its whole prompt on top of that prefix. A lease that adopted a prefix and a cold
one take the same path.
"""

from __future__ import annotations

from typing import Sequence

from kernels.checks import require
from planner.policies.base import PlacementPolicy, PlanContext
from planner.prefill_plan import ChunkPlan, plan_chunk
from planner.prefix_cache import KVLease


class PrefillState:
    """One request's prefill in progress: its prompt, its KV lease (where it resumes) and the
    positions it must leave snapshots at; `plan_next` asks the placement policy where the next
    chunk ends."""

    def __init__(self, token_ids: Sequence[int], lease: KVLease, marks: Sequence[int] = ()):
        """`marks`: positions this prefill must leave a snapshot at (its policy's admission marks)."""
        require(len(token_ids) > 0, "token_ids", "a prompt needs at least one token to produce logits")
        # The prefix match backs off one block so at least one token is left to run;
        # a prefill with nothing to run produces no logits to sample the first token from.
        require(lease.num_computed_tokens < len(token_ids), "lease",
                f"{lease.num_computed_tokens} of {len(token_ids)} tokens already computed; "
                "the adopted prefix was not backed off")
        self.token_ids = list(token_ids)
        self.lease = lease
        self.marks = tuple(marks)

    @property
    def position(self) -> int:
        """Prompt positions already computed: read off the KV lease."""
        return self.lease.num_computed_tokens

    @property
    def total(self) -> int:
        return len(self.token_ids)

    @property
    def remaining(self) -> int:
        return self.total - self.position

    @property
    def is_done(self) -> bool:
        return self.remaining == 0

    def plan_next(self, budget: int, policy: PlacementPolicy, ctx: PlanContext) -> ChunkPlan:
        """The next chunk given at most `budget` tokens this tick (budget >= 1), under `policy` (the
        object, resolved once where the engine was built) with what its rules read, `ctx` (the KV
        block and snapshot interval among it)."""
        if self.is_done:
            raise RuntimeError("plan_next on a finished prefill")
        require(budget >= 1, "budget", f"must be >= 1, got {budget}")
        return plan_chunk(self.position, self.total, min(budget, self.remaining), ctx.block_size, ctx.interval, policy,
                          self.marks, ctx)

    def chunk_tokens(self, plan: ChunkPlan) -> list[int]:
        return self.token_ids[plan.offset : plan.end]

    def commit(self, plan: ChunkPlan) -> bool:
        """Record that `plan` ran; returns whether the prompt is finished."""
        if plan.offset != self.position:
            raise RuntimeError(f"chunk at {plan.offset} committed, but the KV says the prefill is at {self.position}")
        self.lease.advance(plan.length)
        return self.is_done
