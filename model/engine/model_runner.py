"""The engine's runner over the hybrid model: `SequenceChunk` rows in, one batched forward, logits out.

It pairs the model with its inference memory (`ModelCache`: paged KV per attention layer,
SSM/conv state pools per Mamba layer) and exposes a slot's state for snapshots.
`Engine.for_model` allocates that cache from the scheduler's block pool and batch slots.
"""

from __future__ import annotations

from typing import Sequence

import torch

from model.batch import BatchOutput, SequenceChunk
from model.cache import ModelCache, SSMState
from model.hybrid import HybridLM


class ModelRunner:
    """The hybrid model over one `ModelCache` (allocate it with `model.allocate_cache`)."""

    def __init__(self, model: HybridLM, cache: ModelCache):
        self.model = model
        self.cache = cache
        self.tokens_run = 0

    @torch.inference_mode()
    def forward(self, rows: Sequence[SequenceChunk]) -> BatchOutput:
        """`model.forward_batch` over the cache; see `SequenceChunk` for the row contract."""
        out = self.model.forward_batch(list(rows), self.cache)
        self.tokens_run += sum(r.num_tokens for r in rows)
        return out

    def read_state(self, slot: int) -> SSMState:
        """A detached copy of the slot's state: the snapshot to save."""
        return self.cache.read_state(slot)

    def write_state(self, slot: int, state: SSMState) -> None:
        """Restore a snapshot into the slot."""
        self.cache.write_state(slot, state)

    @property
    def snapshot_nbytes(self) -> int:
        """Bytes of one snapshot of this model."""
        return self.cache.state_bytes_per_slot
