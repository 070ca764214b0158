"""TensorRT-LLM's snapshot placement (`trtllm`).

Source: the project brief's facts (sections 4 and 6) on TensorRT-LLM's MambaStateConfig; not
checked against TensorRT-LLM's source.
"""

from __future__ import annotations

from planner.policies.aligned import last_block_boundary
from planner.policies.base import PlacementPolicy, PlanContext, junction_marks

TRTLLM_PERIOD_TOKENS = 4096  # our choice of `periodic_snapshot_interval` (TRT-LLM sets no default)


class TensorRTLLM(PlacementPolicy):
    """TensorRT-LLM MambaStateConfig per the brief (not checked against its source):
    periodic_snapshot_interval = TRTLLM_PERIOD_TOKENS (4096 tokens, our choice), an offset from the
    end landing on the last block boundary under n, enable_branch_snapshot at the junction; each
    snapshot position modelled as a chunk stop (no in-forward capture is documented)."""

    name = "trtllm"
    mark_mode = "stop"

    def marks(self, kv_match: int, restore_at: int, total: int, ctx: PlanContext) -> tuple[int, ...]:
        """Every period, the last block boundary under the prompt end and the junction, above the
        restore point."""
        periodic = range(TRTLLM_PERIOD_TOKENS, total, TRTLLM_PERIOD_TOKENS)
        tail = last_block_boundary(total, ctx.block_size)
        marks = {m for m in (*periodic, tail, *junction_marks(kv_match, restore_at, total)) if restore_at < m < total}
        return tuple(sorted(marks))
