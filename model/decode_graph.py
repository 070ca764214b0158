"""A decode step of fixed shape: batch-size buckets, static inputs, CUDA graphs on a GPU.

A decode step at small batch is launch- and host-bound (about 2 launches a Mamba layer and 2-3 an
attention layer, 29 + 3 layers at Bamba-9B), so on CUDA each bucket's step is captured once into a
CUDA graph and replayed. What makes it capturable:

* buckets: a batch of n rows runs in the smallest bucket B >= n; the B - n pad rows have slot -1,
  slot_mapping -1 and seq_len 0, so they read and write no state (the decode kernels skip slot -1,
  attention writes 0 for a row with no key);
* static inputs: one int32 buffer per bucket (ids, positions, slots, KV slots, lengths, block
  tables), refilled by one copy a step; the graph reads it at fixed addresses;
* fixed launches: the attention plan of a bucket (`plan_decode_bucket`) fixes the grid and the
  split-K count from the bucket size and the longest context the block tables hold; no host read
  anywhere in the step (`HybridLM.forward_decode_rows`); the split-K workspace (bucket x heads x
  splits x (head_dim + 2) fp32) is allocated with the bucket's plan, before the capture, so every
  replay and every attention layer uses the same addresses and the step allocates nothing.

On the CPU (and with `use_graphs=False`) the same static step runs eagerly: the tests compare it
with `forward_batch`. The first use of a bucket on CUDA runs it once with only pad rows (it
compiles the kernels and touches no state), then captures it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kernels.checks import require
from model.attention import PagedAttentionInputs
from model.batch import SequenceChunk, validate_rows
from model.cache import ModelCache

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
_ALIGN = 4  # int32 elements: each section of the static buffer starts 16-byte aligned


def _round(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Bucket:
    """One bucket's static buffer, its views, its attention plan and (on CUDA) its graph."""

    def __init__(self, size: int, max_blocks: int, device: torch.device, plan):
        self.size, self.max_blocks = size, max_blocks
        B = size
        lengths = {"token_ids": B, "positions": B, "slots": B, "slot_mapping": B, "seq_lens": B, "cu_seqlens_q": B + 1,
                   "block_tables": B * max_blocks}
        self.offsets, total = {}, 0
        for name, n in lengths.items():
            self.offsets[name] = (total, n)
            total += _round(n)
        self.host = torch.zeros(total, dtype=torch.int32, pin_memory=device.type == "cuda")
        self.buffer = torch.zeros(total, dtype=torch.int32, device=device)
        v = {name: self.buffer[o:o + n] for name, (o, n) in self.offsets.items()}
        self.token_ids, self.positions, self.slots = v["token_ids"], v["positions"], v["slots"]
        self.attention = PagedAttentionInputs(
            slot_mapping=v["slot_mapping"], block_tables=v["block_tables"].view(B, max_blocks),
            seq_lens=v["seq_lens"], cu_seqlens_q=v["cu_seqlens_q"], plan=plan)
        self.graph = None
        self.logits: torch.Tensor | None = None
        self._copied = None  # CUDA event: the last host-to-device copy of `host` finished

    def fill(self, rows: Sequence[SequenceChunk], block_size: int) -> None:
        """The host copy of the inputs: real rows first, pad rows after; then one copy to the device."""
        B, M = self.size, self.max_blocks
        ids, pos, slots, kv_slots, lens, tables = [0] * B, [0] * B, [-1] * B, [-1] * B, [0] * B, [0] * (B * M)
        for r, row in enumerate(rows):
            p = row.start_pos
            ids[r], pos[r], slots[r], lens[r] = int(row.token_ids[0]), p, row.state_slot, p + 1
            table = list(row.block_table)[:M]
            tables[r * M:r * M + len(table)] = table
            kv_slots[r] = -1 if p < row.kv_cached_len else table[p // block_size] * block_size + p % block_size
        values = {"token_ids": ids, "positions": pos, "slots": slots, "slot_mapping": kv_slots, "seq_lens": lens,
                  "cu_seqlens_q": list(range(B + 1)), "block_tables": tables}
        if self._copied is not None:
            self._copied.synchronize()  # the pinned buffer may still be in flight from the last step
        for name, vals in values.items():
            o, n = self.offsets[name]
            self.host[o:o + n] = torch.as_tensor(vals, dtype=torch.int32)
        self.buffer.copy_(self.host, non_blocking=True)
        if self.buffer.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()


class DecodeGraphs:
    """Runs decode-only batches through fixed-shape bucket steps (CUDA graphs on CUDA).

    `max_blocks`: block-table columns of every bucket (the longest context is max_blocks *
    cache.block_size). `use_graphs`: capture and replay (default: on CUDA), else run eagerly."""

    def __init__(self, model, cache: ModelCache, max_blocks: int, buckets: Sequence[int] = BUCKETS,
                 use_graphs: bool | None = None):
        require(model.ops.plan_decode_bucket is not None, "backend",
                f"fixed-shape decode needs pad-slot kernels (the triton backend), got {model.backend}")
        require(isinstance(max_blocks, int) and max_blocks >= 1, "max_blocks", f"must be an int >= 1, got {max_blocks}")
        require(len(buckets) > 0 and list(buckets) == sorted(set(buckets)) and buckets[0] >= 1, "buckets",
                f"must be increasing sizes >= 1, got {buckets}")
        self.model, self.cache, self.max_blocks = model, cache, max_blocks
        self.buckets = tuple(buckets)
        self.use_graphs = cache.device.type == "cuda" if use_graphs is None else bool(use_graphs)
        require(not self.use_graphs or cache.device.type == "cuda", "use_graphs", "CUDA graphs need a CUDA cache")
        self._built: dict[int, _Bucket] = {}

    def bucket_for(self, n: int) -> int:
        require(1 <= n <= self.buckets[-1], "rows", f"1 .. {self.buckets[-1]} decode rows, got {n}")
        return next(b for b in self.buckets if b >= n)

    def _bucket(self, size: int) -> _Bucket:
        if size not in self._built:
            cfg, m = self.model.config, self.model
            plan = m.ops.plan_decode_bucket(
                size, num_q_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                head_dim=cfg.head_dim, block_size=self.cache.block_size, max_blocks=self.max_blocks, dtype=m.dtype,
                device=m.device, scale=cfg.softmax_scale) if cfg.attn_layer_indices else None
            self._built[size] = _Bucket(size, self.max_blocks, self.cache.device, plan)
        return self._built[size]

    def _step(self, b: _Bucket) -> torch.Tensor:
        return self.model.forward_decode_rows(b.token_ids, b.positions, b.slots, b.attention, self.cache)

    def _capture(self, b: _Bucket) -> None:
        b.fill([], self.cache.block_size)  # only pad rows: compiles every kernel, touches no state
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._step(b)
        torch.cuda.current_stream().wait_stream(stream)
        b.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(b.graph):  # recorded, not run
            b.logits = self._step(b)

    @torch.inference_mode()
    def forward(self, rows: Sequence[SequenceChunk]) -> list[torch.Tensor]:
        """Decode rows (one token each, start_pos >= 1) -> per row its (vocab,) logits; each row's
        state slot and KV advance by one token, as in `forward_batch`."""
        rows = list(rows)
        validate_rows(rows, self.cache, self.model.config.vocab_size)
        limit = self.max_blocks * self.cache.block_size
        for r, row in enumerate(rows):
            require(row.num_tokens == 1 and row.start_pos >= 1, "token_ids",
                    f"row {r}: a decode row has one token after a prefix, got {row.num_tokens} at {row.start_pos}")
            require(row.end_pos <= limit, "start_pos", f"row {r}: {row.end_pos} tokens exceed the buckets' {limit}")
        b = self._bucket(self.bucket_for(len(rows)))
        if self.use_graphs and b.graph is None:
            self._capture(b)
        b.fill(rows, self.cache.block_size)
        if self.use_graphs:
            b.graph.replay()
        else:
            b.logits = self._step(b)
        return list(b.logits[:len(rows)].clone().unbind(0))
