"""Paged KV write, block-prefix copy and paged attention oracles: a token-by-token write, a
copy-by-copy loop, attention one head at a time.

Plain fp32 PyTorch: the executable spec the Triton kernels and the CPU paths
(`kernels.torch_cpu.paged_attention`) are tested against. Layout and argument contract:
`kernels.contracts.paged_attention`.
"""

from __future__ import annotations

import torch

from kernels.contracts.paged_attention import (check_kv_block_copy_args, check_kv_cache_write_args,
                                               check_paged_attention_args)


def write_kv_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Token ``t``'s K/V (``(T, num_kv_heads, head_dim)``) go to block ``slot // block_size``, row
    ``slot % block_size`` of the caches, ``slot = slot_mapping[t]``; -1 skips the token."""
    check_kv_cache_write_args(key, value, key_cache, value_cache, slot_mapping)
    block_size = key_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            key_cache[slot // block_size, slot % block_size] = key[t]
            value_cache[slot // block_size, slot % block_size] = value[t]


def copy_kv_block_prefix_ref(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
    num_rows: torch.Tensor,
) -> None:
    """For each copy ``i``: rows ``0 .. num_rows[i] - 1`` of block ``src_block_ids[i]`` into the same
    rows of block ``dst_block_ids[i]``, in K and V; the destination's other rows are left alone."""
    check_kv_block_copy_args(key_cache, value_cache, src_block_ids, dst_block_ids, num_rows)
    for src, dst, n in zip(src_block_ids.tolist(), dst_block_ids.tolist(), num_rows.tolist()):
        key_cache[dst, :n] = key_cache[src, :n]
        value_cache[dst, :n] = value_cache[src, :n]


def paged_attention_ref(
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
    """Causal attention of packed varlen queries over their paged K/V, in fp32.

    For each sequence: gather its keys and values through its block table, then for each query
    head h (reading KV head h // (Hq // Hkv)): softmax(q K^T * scale, keys past each query's
    position masked) V. query ``(T, Hq, D)``, caches ``(num_blocks, block_size, Hkv, D)``,
    block_tables ``(S, max_blocks)`` int32, seq_lens ``(S,)`` int32, cu_seqlens_q ``(S + 1,)``
    int32. Returns ``(T, Hq, D)`` in the query dtype (written into ``out`` when given).
    One head's scores are (q_len, seq_len) fp32: 1.3 GB for 8192 queries over 40K keys.
    """
    meta = check_paged_attention_args(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out)
    num_q_heads, head_dim = query.shape[1:]
    block_size, num_kv_heads = key_cache.shape[1:3]
    group = num_q_heads // num_kv_heads
    scale = head_dim**-0.5 if scale is None else float(scale)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    for s in range(meta.num_seqs):
        q_start, q_len, seq_len = meta.cu_seqlens_q[s], meta.q_lens[s], meta.seq_lens[s]
        if q_len == 0:
            continue
        pos = torch.arange(seq_len, device=query.device)
        blocks = block_tables[s, pos // block_size].long()
        k = key_cache[blocks, pos % block_size].float()  # (seq_len, Hkv, D)
        v = value_cache[blocks, pos % block_size].float()
        q_pos = seq_len - q_len + torch.arange(q_len, device=query.device)
        future = pos[None, :] > q_pos[:, None]  # (q_len, seq_len)
        rows = slice(q_start, q_start + q_len)
        for h in range(num_q_heads):
            scores = (query[rows, h].float() @ k[:, h // group].T) * scale
            probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
            out[rows, h] = (probs @ v[:, h // group]).to(out.dtype)
    return out
