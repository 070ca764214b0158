"""Paged KV write, block-prefix copy and paged attention in PyTorch, as the model's `torch` backend
runs them on CPU.

Contract and layout: `kernels.contracts.paged_attention`; the oracles they are tested against:
`kernels.reference.paged_attention`. `paged_attention_cpu` is written for speed as well as
clarity: one gather per sequence, then torch's fused `scaled_dot_product_attention` (its CPU
flash kernel never materializes the scores; the timing against matmul + softmax is in
results/LOG.md, 2026-12-01); a prefill chunk over a cached prefix is two such calls without a
mask (the prefix, then the chunk's causal square) merged by their log-sum-exps. A decode row
skips the gather: its keys are read in place, a flash call per run of consecutive blocks
(`_decode_in_place`). It runs in fp32, except bf16
inputs on the `bf16_attention` "native" route (`kernels.torch_cpu.capability`: a CPU with
AVX512-BF16 or AMX), where the flash kernel takes them as they are and accumulates in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.checks import debug_checks
from kernels.torch_cpu.capability import cpu_routes
from kernels.contracts.paged_attention import (check_kv_block_copy_args, check_kv_cache_write_args,
                                               check_paged_attention_args)



def write_kv_cache_cpu(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_slots: bool = True,
) -> None:
    """Write token ``t``'s K/V (``(T, num_kv_heads, head_dim)``) into slot ``slot_mapping[t]``; -1 skips.
    `check_slots=False`: the slot range was checked on the host (as in `kernels.kv_cache_write`)."""
    check_kv_cache_write_args(key, value, key_cache, value_cache, slot_mapping, check_slots)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    num_kv_heads, head_dim = key_cache.shape[2:]
    key_cache.view(-1, num_kv_heads, head_dim)[slots] = key[keep]
    value_cache.view(-1, num_kv_heads, head_dim)[slots] = value[keep]


def copy_kv_block_prefix_cpu(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
    num_rows: torch.Tensor,
) -> None:
    """Rows ``0 .. num_rows[i] - 1`` of block ``src_block_ids[i]`` into block ``dst_block_ids[i]``, K and V,
    as one gather and one scatter of slots per cache. Index values are checked only under the debug
    switch (as in `kernels.kv_block_copy`)."""
    check_kv_block_copy_args(key_cache, value_cache, src_block_ids, dst_block_ids, num_rows, debug_checks())
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    rows = torch.arange(block_size, device=key_cache.device)
    keep = rows[None, :] < num_rows[:, None]  # (C, block_size): the rows each copy writes
    src = (src_block_ids.long()[:, None] * block_size + rows)[keep]
    dst = (dst_block_ids.long()[:, None] * block_size + rows)[keep]
    for cache in (key_cache, value_cache):
        slots = cache.view(-1, num_kv_heads, head_dim)
        slots[dst] = slots[src]  # the gather is a copy: done before the scatter writes


def paged_attention_cpu(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of packed varlen queries over their paged K/V, in fp32 (bf16 on the
    "native" `bf16_attention` route, fp32 accumulation).

    query ``(T, Hq, D)``, caches ``(num_blocks, block_size, Hkv, D)``, block_tables
    ``(S, max_blocks)`` int32, seq_lens ``(S,)`` int32, cu_seqlens_q ``(S + 1,)`` int32.
    Returns ``(T, Hq, D)`` in the query dtype (written into ``out`` when given).
    """
    meta = check_paged_attention_args(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out)
    num_tokens, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1:3]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else float(scale)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    native = query.dtype == torch.bfloat16 and cpu_routes().bf16_attention == "native"
    compute = query.dtype if native else torch.float32

    for s in range(meta.num_seqs):
        q_start, q_len, seq_len = meta.cu_seqlens_q[s], meta.q_lens[s], meta.seq_lens[s]
        if q_len == 0:
            continue
        context_len = seq_len - q_len
        # Gather this sequence's keys through its block table: (Hkv, seq_len, D) in `compute`. Whole
        # blocks, then the first seq_len rows: the same values as a gather of seq_len slots, with
        # block_size x fewer indices (a decode step at 16K context, granite-dense-cpu: the slot
        # gather was the step's largest op after the matmuls).
        blocks = block_tables[s, : -(-seq_len // block_size)].long()
        runs = _block_runs(blocks) if q_len == 1 and compute == key_cache.dtype and query.device.type == "cpu" else None
        if runs is not None:
            o = _decode_in_place(query[q_start : q_start + 1].transpose(0, 1), key_cache, value_cache, runs, seq_len,
                                 scale)
            out[q_start : q_start + 1] = o.transpose(0, 1).to(out.dtype)
            continue
        k = key_cache[blocks].view(-1, num_kv_heads, head_dim)[:seq_len].to(compute).transpose(0, 1)
        v = value_cache[blocks].view(-1, num_kv_heads, head_dim)[:seq_len].to(compute).transpose(0, 1)

        q = query[q_start : q_start + q_len].to(compute).transpose(0, 1)  # (Hq, q_len, D)
        if context_len == 0 or q_len == 1:
            # No cached context: SDPA's own causal mask holds for every row (the fused kernel skips
            # the blocks above the diagonal and holds no scores or mask); one row sees every key.
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=q_len > 1, scale=scale,
                                               enable_gqa=group > 1)[0]
        else:
            o = _attend_after_prefix(q, k, v, context_len, scale, group)
        out[q_start : q_start + q_len] = o.transpose(0, 1).to(out.dtype)
    return out


MAX_RUNS = 4  # runs of consecutive block ids a decode row reads in place (a flash call each); more: one gather


def _block_runs(blocks: torch.Tensor) -> list[tuple[int, int]] | None:
    """(first block id, block count) of each run of consecutive ids in `blocks` (1-D, CPU), or None
    past `MAX_RUNS` runs. A sequence's blocks are mostly allocated in order (a 16K prompt's 1,024
    blocks from a fresh pool are one run; a warm repeat's are the cold request's run plus its
    copy-on-write block), so its keys are a few slices of the cache, not a gather."""
    starts = [0]
    if blocks.numel() > 1:
        cuts = torch.nonzero(blocks[1:] != blocks[:-1] + 1).flatten()
        if cuts.numel() >= MAX_RUNS:
            return None
        starts += (cuts + 1).tolist()
    firsts = blocks[starts].tolist()
    return [(f, end - start) for f, start, end in zip(firsts, starts, starts[1:] + [blocks.numel()])]


def _decode_in_place(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     runs: list[tuple[int, int]], seq_len: int, scale: float) -> torch.Tensor:
    """One query row over its sequence's keys read where they lie: a flash call per run of
    consecutive blocks (a view of the cache, no copy), merged by their log-sum-exps in fp32. The
    query heads of one key head are that call's rows (one row sees every key, so no mask is lost):
    GQA without repeating K/V. A decode step at 16K context, granite-dense-cpu (4 query heads on
    1 key head, D 64), fp32, one thread: 1.4 ms against 5.5-6.6 ms for the gather and SDPA with
    enable_gqa (bf16, native route: 1.2 against 3.6 ms). q (Hq, 1, D) in the cache dtype; returns (Hq, 1, D)."""
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    num_q_heads = q.shape[0]
    rows_q = q.reshape(num_kv_heads, num_q_heads // num_kv_heads, head_dim)[None]  # heads h = kv * group + g
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    outs, lses, left = [], [], seq_len
    for first, count in runs:
        rows = min(count * block_size, left)
        left -= rows
        k = key_cache[first : first + count].view(-1, num_kv_heads, head_dim)[:rows].transpose(0, 1)
        v = value_cache[first : first + count].view(-1, num_kv_heads, head_dim)[:rows].transpose(0, 1)
        o, lse = flash(rows_q, k[None], v[None], 0.0, False, scale=scale)
        outs.append(o)
        lses.append(lse)
    if len(outs) == 1:
        o = outs[0]
    else:
        lse = torch.stack(lses)
        w = torch.exp(lse - lse.amax(dim=0))[..., None]
        o = (torch.stack(outs).float() * w).sum(dim=0) / w.sum(dim=0)
    return o[0].reshape(num_q_heads, 1, head_dim).to(q.dtype)


def _attend_after_prefix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_len: int, scale: float,
                         group: int) -> torch.Tensor:
    """A chunk of q_len queries after `context_len` cached keys, row i seeing keys <= context_len + i:
    every row sees the whole prefix (no mask) and the chunk's own keys causally (SDPA's top-left
    mask on the q_len x q_len square), two fused flash calls without a mask, merged by their
    log-sum-exps in fp32. A bottom-right mask over all keys cost 1.3x as much (16K prompt, second
    8192-token chunk, one layer of granite-dense-cpu: 1.62 s against 1.24 s CPU, fp32, one thread;
    outputs within 5e-8 of each other): the flash kernel reads a materialized mask and cannot
    skip its masked blocks. q (Hq, q_len, D); k, v (Hkv, context_len + q_len, D)."""
    if group > 1:  # the flash op takes as many key heads as query heads (SDPA's enable_gqa repeats them too)
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o_prefix, lse_prefix = flash(q[None], k[None, :, :context_len], v[None, :, :context_len], 0.0, False, scale=scale)
    o_chunk, lse_chunk = flash(q[None], k[None, :, context_len:], v[None, :, context_len:], 0.0, True, scale=scale)
    top = torch.maximum(lse_prefix, lse_chunk)
    w_prefix, w_chunk = torch.exp(lse_prefix - top)[..., None], torch.exp(lse_chunk - top)[..., None]
    o = (o_prefix.float() * w_prefix + o_chunk.float() * w_chunk) / (w_prefix + w_chunk)
    return o[0].to(q.dtype)
