"""The engine's runner over the hybrid model: `SequenceChunk` rows in, one batched forward, logits out.

It pairs the model with its inference memory (`ModelCache`: paged KV per attention layer,
SSM/conv state pools per Mamba layer) and exposes a slot's state for snapshots.
`Engine.for_model` allocates that cache from the scheduler's block pool and batch slots.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.checks import require
from kernels.contracts import packed
from kernels.contracts.paged_attention import check_kv_block_copy_values
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

    @torch.inference_mode()
    def copy_kv_blocks(self, copies: Sequence[tuple[int, int, int]]) -> None:
        """Copy-on-write of partly matched prefix blocks, before the tick's forward: for each
        ``(src_block_id, dst_block_id, num_rows)``, token rows ``0 .. num_rows - 1`` of block src
        into block dst, K and V of every attention layer; dst's other rows are left as they are.

        The values are checked here on host ints (ids in the cache, ``0 <= num_rows <= block_size``,
        no dst also a src or written twice), then uploaded with one host-to-device copy and applied
        by the backend's `kv_block_copy`, one launch per attention layer. An empty list is a no-op.
        """
        if not copies:
            return
        for i, c in enumerate(copies):
            require(len(c) == 3 and all(isinstance(v, int) for v in c), "copies",
                    f"[{i}] must be (src_block_id, dst_block_id, num_rows) ints, got {c!r}")
        src, dst, rows = (list(col) for col in zip(*copies))
        check_kv_block_copy_values(src, dst, rows, self.cache.num_blocks, self.cache.block_size)
        table = packed.to_device(torch.tensor([src, dst, rows], dtype=torch.int32), self.cache.device)
        for layer in self.model.config.attn_layer_indices:
            self.model.ops.kv_block_copy(self.cache.key_cache[layer], self.cache.value_cache[layer],
                                         table[0], table[1], table[2])

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
