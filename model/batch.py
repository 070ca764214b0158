"""The engine-facing batch contract: `SequenceChunk` rows in, `BatchOutput` out, and the packing between.

A forward batch mixes rows at different stages: prefill chunks (n > 1 new tokens, maybe
resuming from a restored SSM state, maybe asking for in-chunk state captures) and decode rows
(n == 1). `pack_rows` turns the rows into the flat tensors the kernels take: tokens packed
prefill rows first, then decode rows, so a Mamba layer slices its two halves instead of
gathering them; attention sees all rows in one varlen paged call.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kernels.checks import require
from kernels.contracts.packed import IntTables
from model.attention import PagedAttentionInputs
from model.cache import ModelCache, SSMState


@dataclass
class SequenceChunk:
    """One row of a forward batch."""

    token_ids: torch.Tensor  # (n,) int64: the new tokens of this row
    start_pos: int  # tokens of this sequence already computed: its KV/SSM state cover [0, start_pos)
    block_table: list[int]  # KV block ids covering at least start_pos + n tokens
    state_slot: int  # row of the SSM/conv state pools
    kv_cached_len: int = 0  # KV of positions < kv_cached_len already sits in (shared) blocks: not rewritten
    capture_offsets: tuple[int, ...] = ()  # 0 < o < n: capture every Mamba layer's state after token o - 1
    all_logits: bool = False  # logits for every token (tests), else only for the last one

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def end_pos(self) -> int:
        return self.start_pos + self.num_tokens


@dataclass
class BatchOutput:
    """What a forward returns, row by row: the logits, and the states captured at each row's capture offsets."""

    logits: list[torch.Tensor]  # per row: (vocab,) for its last token, or (n, vocab) when all_logits
    captured: list[list[SSMState]] = field(default_factory=list)  # per row, in capture_offsets order


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _all_ints(values: list) -> bool:
    """Every value an int and none a bool (`_is_int` of each), by the set of their types."""
    return all(issubclass(t, int) and t is not bool for t in set(map(type, values)))


def validate_rows(rows: list[SequenceChunk], cache: ModelCache, vocab_size: int) -> None:
    """ValueError naming the field of the first bad row; nothing is computed for an invalid batch."""
    require(isinstance(rows, (list, tuple)) and len(rows) > 0, "rows", "expected a non-empty list of SequenceChunk")
    seen_slots: dict[int, int] = {}
    for r, row in enumerate(rows):
        ids = row.token_ids
        require(isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.dtype in (torch.int64, torch.int32),
                "token_ids", f"row {r}: expected a 1-D int64 tensor, got {getattr(ids, 'shape', type(ids))}")
        n = ids.numel()
        require(n >= 1, "token_ids", f"row {r}: a row needs at least one token")
        require(_is_int(row.start_pos) and row.start_pos >= 0, "start_pos",
                f"row {r}: must be an int >= 0, got {row.start_pos!r}")
        require(_is_int(row.state_slot) and 0 <= row.state_slot < cache.num_state_slots, "state_slot",
                f"row {r}: must be an int in 0 .. {cache.num_state_slots - 1}, got {row.state_slot!r}")
        require(row.state_slot not in seen_slots, "state_slot",
                f"row {r}: slot {row.state_slot} is also used by row {seen_slots.get(row.state_slot)}")
        seen_slots[row.state_slot] = r
        require(_is_int(row.kv_cached_len) and row.kv_cached_len >= 0, "kv_cached_len",
                f"row {r}: must be an int >= 0, got {row.kv_cached_len!r}")
        need = -(-(row.start_pos + n) // cache.block_size)
        table = list(row.block_table)
        require(len(table) >= need, "block_table",
                f"row {r}: {len(table)} blocks cannot hold start_pos + n = {row.start_pos + n} tokens "
                f"(block_size {cache.block_size} needs {need})")
        used = table[:need]  # one pass over the types, then min/max in C: 1,025 blocks at 16K context
        ok = _all_ints(used) and (not used or (min(used) >= 0 and max(used) < cache.num_blocks))
        require(ok, "block_table", f"row {r}: block ids must be ints in 0 .. {cache.num_blocks - 1}, got "
                f"{table[:need] if not ok else '...'}")  # a long table is formatted only when it is wrong
        offs = tuple(row.capture_offsets)
        require(all(_is_int(o) and 0 < o < n for o in offs), "capture_offsets",
                f"row {r}: offsets must be ints with 0 < o < n = {n}, got {offs}")
        require(all(a < b for a, b in zip(offs, offs[1:])), "capture_offsets",
                f"row {r}: offsets must be strictly increasing, got {offs}")
        require(isinstance(row.all_logits, bool), "all_logits", f"row {r}: must be a bool, got {row.all_logits!r}")
    # id range: one min/max over the whole batch (one host sync, not one per row)
    lo, hi = torch.cat([r.token_ids.reshape(-1).to(rows[0].token_ids.device) for r in rows]).aminmax()
    bad = None
    if int(lo) < 0 or int(hi) >= vocab_size:
        bad = next(i for i, row in enumerate(rows)
                   if int(row.token_ids.min()) < 0 or int(row.token_ids.max()) >= vocab_size)
    require(bad is None, "token_ids", f"row {bad}: ids must lie in 0 .. {vocab_size - 1}")


@dataclass(frozen=True)
class StepPlanners:
    """The backend's per-step kernel plans, as callables over host integers; a None entry: the op
    reads its tensors itself (the torch backend, where they live on the host anyway)."""

    ssd_scan: Callable[[list[int], list[list[int]], IntTables], Any] | None = None  # (seqlens, offsets, tables)
    causal_conv1d: Callable[[list[int], list[list[int]], IntTables], Any] | None = None
    gated_delta_rule: Callable[[list[int], list[list[int]], IntTables], Any] | None = None
    paged_attention: Callable[[list[int], list[int], int], Any] | None = None  # (q_lens, seq_lens, max_blocks)


@dataclass
class PackedBatch:
    """Rows flattened for the kernels; internal row i is caller row `order[i]`.

    The step's metadata: built once on the host from the rows' Python integers, every index
    tensor a view into one int32 buffer uploaded with one copy (`kernels.contracts.packed`), and
    the kernels' plans (chunk tables, split counts) shared by every layer."""

    order: list[int]
    rows: list[SequenceChunk]  # in internal order
    token_ids: torch.Tensor  # (T,) int32
    positions: torch.Tensor  # (T,) int32 absolute positions (RoPE)
    num_prefill_rows: int
    num_prefill_tokens: int
    prefill_seqlens: list[int]  # host lengths of the prefill rows
    prefill_cu_seqlens: torch.Tensor  # (Sp+1,) int32
    prefill_slots: torch.Tensor  # (Sp,) int32
    prefill_all_fresh: bool  # every prefill row starts at position 0: no initial state to gather
    capture_offsets: list[list[int]] | None  # per prefill row, None when no row captures
    decode_slots: torch.Tensor  # (Sd,) int32
    attention: PagedAttentionInputs
    logit_index: torch.Tensor  # (R,) int32 packed token index of every token whose logits are returned
    logit_counts: list[int]  # per internal row
    ssd_plan: Any = None  # the backend's plans (None: the op plans itself)
    conv_plan: Any = None
    delta_plan: Any = None  # the gated delta rule's chunk table (DeltaNet layers)
    buffer: torch.Tensor | None = None  # the one uploaded int32 buffer


def _host_positions_and_slots(ordered: list[SequenceChunk], block_size: int, max_blocks: int):
    """Per row, its positions and KV slots (-1 where its KV is already cached) as host int32 tensors,
    and the block tables as one (rows, `max_blocks`) host int32 tensor (unused columns 0: never read)."""
    positions, slot_mapping = [], []
    tables = torch.zeros((len(ordered), max_blocks), dtype=torch.int32)
    for i, r in enumerate(ordered):
        pos = torch.arange(r.start_pos, r.end_pos, dtype=torch.int32)
        # array -> frombuffer: a fifth of torch.as_tensor(list)'s time for a 1,025-block table (16K context)
        host_table = torch.frombuffer(array("i", r.block_table[:max_blocks]), dtype=torch.int32)  # host, no upload
        slots = host_table[pos // block_size] * block_size + pos % block_size
        slot_mapping.append(torch.where(pos < r.kv_cached_len, -1, slots))
        positions.append(pos)
        tables[i, : host_table.numel()] = host_table
    return positions, slot_mapping, tables


def _logit_rows(ordered: list[SequenceChunk], cu: list[int]) -> tuple[list[int], list[int]]:
    """The packed token indices whose logits are kept (each row's last, or all with all_logits), and
    how many per row."""
    logit_index, counts = [], []
    for r, start in zip(ordered, cu):
        count = r.num_tokens if r.all_logits else 1
        logit_index.extend(range(start + r.num_tokens - count, start + r.num_tokens))
        counts.append(count)
    return logit_index, counts


def _kernel_plans(planners: StepPlanners, lens: list[int], num_prefill: int, captures, ordered, max_blocks: int,
                  t: "IntTables"):
    """The backend's per-step plans (SSD scan, conv, gated delta rule, attention) over host integers;
    None where the backend has none or the model no layer that takes it (`HybridLM._step_planners`)."""
    ssd_plan = conv_plan = delta_plan = attn_plan = None
    if num_prefill:
        offsets = captures if any(captures) else None
        if planners.ssd_scan is not None:
            ssd_plan = planners.ssd_scan(lens[:num_prefill], offsets, t)
        if planners.causal_conv1d is not None:
            conv_plan = planners.causal_conv1d(lens[:num_prefill], offsets, t)
        if planners.gated_delta_rule is not None:
            delta_plan = planners.gated_delta_rule(lens[:num_prefill], offsets, t)
    if planners.paged_attention is not None:
        attn_plan = planners.paged_attention(lens, [r.end_pos for r in ordered], max_blocks)
    return ssd_plan, conv_plan, delta_plan, attn_plan


def pack_rows(rows: list[SequenceChunk], block_size: int, device: torch.device,
              planners: StepPlanners | None = None) -> PackedBatch:
    planners = planners or StepPlanners()
    order = [i for i, r in enumerate(rows) if r.num_tokens > 1] + [i for i, r in enumerate(rows) if r.num_tokens == 1]
    ordered = [rows[i] for i in order]
    num_prefill = sum(r.num_tokens > 1 for r in ordered)
    lens = [r.num_tokens for r in ordered]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    max_blocks = max(-(-r.end_pos // block_size) for r in ordered)
    require(len(ordered) * max_blocks < 2**31 and max(max(r.block_table[:max_blocks], default=0) for r in ordered)
            * block_size + block_size <= 2**31, "block_table", "slots must fit int32")
    # Host work only: positions and slots with host tensor ops, the rest from Python ints.
    positions, slot_mapping, tables = _host_positions_and_slots(ordered, block_size, max_blocks)
    logit_index, counts = _logit_rows(ordered, cu)
    prefill = ordered[:num_prefill]
    captures = [list(r.capture_offsets) for r in prefill]
    t = IntTables()
    prefill_cu, prefill_slots = t.add(cu[:num_prefill + 1]), t.add([r.state_slot for r in prefill])
    decode_slots = t.add([r.state_slot for r in ordered[num_prefill:]])
    block_tables = t.add_host_tensor(tables)
    seq_lens, cu_q, logit_idx = t.add([r.end_pos for r in ordered]), t.add(cu), t.add(logit_index)
    ssd_plan, conv_plan, delta_plan, attn_plan = _kernel_plans(planners, lens, num_prefill, captures, ordered,
                                                               max_blocks, t)
    token_ids = t.add_host_tensor(torch.cat([r.token_ids.reshape(-1) for r in ordered]))
    pos_t = t.add_host_tensor(torch.cat(positions))
    slot_t = t.add_host_tensor(torch.cat(slot_mapping))
    buffer = t.upload(device)  # the step's one host-to-device copy
    return PackedBatch(
        order=order, rows=ordered, token_ids=token_ids.t, positions=pos_t.t, num_prefill_rows=num_prefill,
        num_prefill_tokens=cu[num_prefill], prefill_seqlens=lens[:num_prefill], prefill_cu_seqlens=prefill_cu.t,
        prefill_slots=prefill_slots.t, prefill_all_fresh=all(r.start_pos == 0 for r in prefill),
        capture_offsets=captures if any(captures) else None, decode_slots=decode_slots.t,
        attention=PagedAttentionInputs(slot_mapping=slot_t.t, block_tables=block_tables.t, seq_lens=seq_lens.t,
                                       cu_seqlens_q=cu_q.t, plan=attn_plan),
        logit_index=logit_idx.t, logit_counts=counts, ssd_plan=ssd_plan, conv_plan=conv_plan,
        delta_plan=delta_plan, buffer=buffer,
    )
