"""The engine's runner over the hybrid model: engine rows in, one batched forward, logits out.

It owns the model's inference memory (`ModelCache`: paged KV per attention layer, SSM/conv
state pools per Mamba layer), sized from the scheduler's block pool and batch slots, and
exposes slot state for snapshots.
"""

from __future__ import annotations

from typing import Sequence

import torch

from model.batch import SequenceChunk
from model.cache import SSMState
from model.engine.runner import RunnerOutput, RunRow
from model.hybrid import HybridLM


class ModelRunner:
    def __init__(self, model: HybridLM, num_blocks: int, block_size: int, num_slots: int):
        self.model = model
        self.cache = model.allocate_cache(num_blocks, block_size, num_slots)
        self.tokens_run = 0

    @torch.inference_mode()
    def forward(self, rows: Sequence[RunRow]) -> RunnerOutput:
        device = self.model.device
        chunks = [
            SequenceChunk(
                token_ids=torch.tensor(r.token_ids, dtype=torch.long, device=device),
                start_pos=r.start_pos,
                block_table=r.block_table,
                state_slot=r.state_slot,
                kv_cached_len=r.kv_cached_len,
                capture_offsets=tuple(r.capture_offsets),
            )
            for r in rows
        ]
        out = self.model.forward_batch(chunks, self.cache)
        self.tokens_run += sum(len(r.token_ids) for r in rows)
        captured = out.captured if out.captured else [[] for _ in rows]
        return RunnerOutput(logits=out.logits, captured=captured)

    def read_state(self, slot: int) -> SSMState:
        return self.cache.read_state(slot)

    def write_state(self, slot: int, state: SSMState) -> None:
        self.cache.write_state(slot, state)

    @property
    def snapshot_nbytes(self) -> int:
        return self.cache.state_bytes_per_slot
