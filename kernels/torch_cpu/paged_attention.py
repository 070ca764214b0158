"""Paged KV write, block-prefix copy and paged attention in PyTorch, as the model's `torch` backend
runs them on CPU.

Contract and layout: `kernels.contracts.paged_attention`; the oracles they are tested against:
`kernels.reference.paged_attention`. `paged_attention_cpu` is written for speed as well as
clarity: one gather per sequence, then torch's fused `scaled_dot_product_attention` (its CPU
flash kernel never materializes the scores; the timing against matmul + softmax is in
results/LOG.md, 2026-12-01); a prefill chunk over a cached prefix is two such calls without a
mask (the prefix, then the chunk's causal square) merged by their log-sum-exps. It runs in fp32, except bf16
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
