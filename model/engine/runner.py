"""The runner contract: what the engine asks of whatever executes its rows (the hybrid model,
or the model-free placeholder).

A runner takes the model core's own row type, `model.batch.SequenceChunk`, and answers with
its `BatchOutput`: the engine converts a scheduled row into a `SequenceChunk` once
(`model.engine.engine.to_chunk`) and every runner reads the same fields. A runner's state is
its own type (the model's `SSMState`, the placeholder's hash); the engine only copies it between
a slot and the snapshot store and reads its `.nbytes`.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from model.batch import BatchOutput, SequenceChunk


class Runner(Protocol):
    """Executes one batched forward over rows and exposes the per-slot SSM state."""

    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        """Run every row once; per row: its last-token logits and one state per capture offset."""

    def read_state(self, slot: int) -> Any:
        """A detached copy (with `.nbytes`) of the state in `slot`: what a snapshot holds."""

    def write_state(self, slot: int, state: Any) -> None:
        """Restore a snapshot into `slot`, so the next row there resumes from it."""

    # Optional: `copy_kv_blocks(copies)`, copies as (source block, destination block, rows): the
    # leading rows of each source block's K/V written into the destination block, before the
    # tick's forward (a prefix match ending inside a block: `planner.prefix_cache`). Required for a
    # prefix match unit under the KV block.
    # Optional: `charge_transfer(seconds)`, for a runner that keeps simulated time: the engine calls
    # it with the part of a restored snapshot's transfer from a lower tier (host, disk) that the
    # request's queue wait did not hide. A runner on real memory moves the bytes in `write_state`.
