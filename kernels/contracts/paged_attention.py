"""The paged KV cache layout, the KV write, the block-prefix copy and paged attention: arguments
and host facts.

Layout (shared by `kernels.kv_cache_write`, `kernels.kv_block_copy`, `kernels.paged_attention`,
the oracles in `kernels.reference.paged_attention` and the CPU paths in
`kernels.torch_cpu.paged_attention`):

* ``key_cache``, ``value_cache``: ``(num_blocks, block_size, num_kv_heads, head_dim)``. Token
  ``p`` of sequence ``s`` lives in block ``block_tables[s, p // block_size]`` at offset
  ``p % block_size``; its *slot* is ``block_id * block_size + offset``.
* Queries are packed varlen: ``query`` is ``(T, num_q_heads, head_dim)`` and sequence ``s`` owns
  rows ``cu_seqlens_q[s] : cu_seqlens_q[s + 1]``. Its ``q_len`` new tokens are the *last* ``q_len``
  of its ``seq_lens[s]`` tokens (their K/V already in the cache), so query ``i`` sits at absolute
  position ``seq_lens[s] - q_len + i`` and sees keys ``0 ..= that position``.
* GQA: query head ``h`` reads KV head ``h // (num_q_heads // num_kv_heads)``.

The checks below define what is a valid input; the Triton launchers call them first and then add
their own layout limits, so every implementation rejects the same things. Their messages predate
`kernels.checks.require` and name the argument inside the sentence (tests match them); the block
copy's checks, newer, use `require`.
"""

from __future__ import annotations

import dataclasses

import torch

from kernels.checks import require
from kernels.contracts.tensors import FLOAT_DTYPES, INDEX_DTYPES


@dataclasses.dataclass(frozen=True)
class PagedAttentionMeta:
    """Host-side facts about a validated call (read once, with one device-to-host copy)."""

    num_seqs: int
    q_lens: list[int]
    seq_lens: list[int]
    cu_seqlens_q: list[int]
    max_q_len: int
    max_seq_len: int


def check_same_device(**tensors: torch.Tensor) -> None:
    """All the named tensors sit on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, dev in devices.items():
        if dev != first:
            raise ValueError(f"{name} is on {dev} but {first_name} is on {first}: all inputs must share one device")


def check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor, dtype: torch.dtype) -> None:
    """The K and V caches: one 4-d contiguous shape, both in the input `dtype`."""
    if key_cache.dim() != 4:
        raise ValueError(
            f"key_cache must be (num_blocks, block_size, num_kv_heads, head_dim), got shape {tuple(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache shape {tuple(value_cache.shape)} != key_cache shape {tuple(key_cache.shape)}")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype != dtype:
            raise ValueError(f"{name} dtype {t.dtype} must equal the input dtype {dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (num_blocks, block_size, num_kv_heads, head_dim)")


def check_kv_cache_write_args(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    read_slots: bool = True,
) -> None:
    """Raise `ValueError` unless the arguments of `write_kv_cache` are valid. The slot range is read
    on the host (one sync) only with `read_slots`."""
    check_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping)
    if key.dtype not in FLOAT_DTYPES:
        raise ValueError(f"key dtype {key.dtype} not supported: use one of {FLOAT_DTYPES}")
    if key.dim() != 3:
        raise ValueError(f"key must be (T, num_kv_heads, head_dim), got shape {tuple(key.shape)}")
    if value.shape != key.shape or value.dtype != key.dtype:
        raise ValueError(
            f"value {tuple(value.shape)} {value.dtype} must match key {tuple(key.shape)} {key.dtype}"
        )
    check_cache(key_cache, value_cache, key.dtype)
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    if key.shape[1:] != (num_kv_heads, head_dim):
        raise ValueError(
            f"key is (T, {key.shape[1]}, {key.shape[2]}) but the cache holds {num_kv_heads} KV heads of dim {head_dim}"
        )
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(f"slot_mapping must be ({key.shape[0]},), got shape {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in INDEX_DTYPES:
        raise ValueError(f"slot_mapping dtype {slot_mapping.dtype} must be int32 or int64")
    if read_slots and slot_mapping.numel():
        lo, hi = (int(x) for x in torch.stack([slot_mapping.min(), slot_mapping.max()]).tolist())
        num_slots = num_blocks * block_size
        if lo < -1 or hi >= num_slots:
            raise ValueError(f"slot_mapping values must lie in -1..{num_slots - 1} (-1 = skip), got {lo}..{hi}")


def check_paged_attention_shapes(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    out: torch.Tensor | None = None,
) -> None:
    """The checks of `check_paged_attention_args` that read no tensor data: devices, dtypes, shapes."""
    tensors = dict(query=query, key_cache=key_cache, value_cache=value_cache, block_tables=block_tables,
                   seq_lens=seq_lens, cu_seqlens_q=cu_seqlens_q)
    if out is not None:
        tensors["out"] = out
    check_same_device(**tensors)
    if query.dtype not in FLOAT_DTYPES:
        raise ValueError(f"query dtype {query.dtype} not supported: use one of {FLOAT_DTYPES}")
    if query.dim() != 3:
        raise ValueError(f"query must be (T, num_q_heads, head_dim), got shape {tuple(query.shape)}")
    check_cache(key_cache, value_cache, query.dtype)
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    num_tokens, num_q_heads, q_head_dim = query.shape
    if q_head_dim != head_dim:
        raise ValueError(f"query head_dim {q_head_dim} != cache head_dim {head_dim}")
    if num_kv_heads < 1 or num_q_heads < num_kv_heads or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
        )
    if out is not None and (out.shape != query.shape or out.dtype != query.dtype):
        raise ValueError(f"out must be {tuple(query.shape)} {query.dtype}, got {tuple(out.shape)} {out.dtype}")
    index_args = (("block_tables", block_tables, 2), ("seq_lens", seq_lens, 1), ("cu_seqlens_q", cu_seqlens_q, 1))
    for name, t, dims in index_args:
        if t.dtype != torch.int32:
            raise ValueError(f"{name} dtype {t.dtype} must be int32")
        if t.dim() != dims:
            raise ValueError(f"{name} must have {dims} dims, got shape {tuple(t.shape)}")
    num_seqs = seq_lens.shape[0]
    if cu_seqlens_q.shape[0] != num_seqs + 1:
        raise ValueError(f"cu_seqlens_q must be (num_seqs + 1,) = ({num_seqs + 1},), got {tuple(cu_seqlens_q.shape)}")
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must have num_seqs = {num_seqs} rows, got {block_tables.shape[0]}")


def check_paged_attention_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    out: torch.Tensor | None = None,
) -> PagedAttentionMeta:
    """Raise `ValueError` unless the arguments of `paged_attention` are valid; return host facts.

    Reads `seq_lens`, `cu_seqlens_q` and a flag for bad block ids on the host: one device-to-host copy.
    """
    check_paged_attention_shapes(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out)
    num_blocks, block_size = key_cache.shape[:2]
    num_tokens = query.shape[0]
    num_seqs = seq_lens.shape[0]

    # Only the blocks a sequence uses must hold valid ids; the rest of a row is never read.
    cols = torch.arange(block_tables.shape[1], device=seq_lens.device)
    used = cols[None, :] < (seq_lens[:, None].long() + block_size - 1) // block_size
    bad_id = (used & ((block_tables < 0) | (block_tables >= num_blocks))).any().to(torch.int32)
    host = torch.cat([seq_lens, cu_seqlens_q, bad_id[None]]).tolist()  # the one device-to-host copy
    lens, cu, bad_id = host[:num_seqs], host[num_seqs:-1], host[-1]
    if cu[0] != 0 or cu[-1] != num_tokens:
        raise ValueError(f"cu_seqlens_q must run from 0 to T = {num_tokens}, got {cu[0]}..{cu[-1]}")
    q_lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
    for s, (q_len, seq_len) in enumerate(zip(q_lens, lens)):
        if q_len < 0:
            raise ValueError(f"cu_seqlens_q must be non-decreasing; sequence {s} has q_len {q_len}")
        if not q_len <= seq_len:
            raise ValueError(f"seq_lens[{s}] = {seq_len} must be >= its q_len = {q_len}")
    max_seq_len = max(lens, default=0)
    need_blocks = -(-max_seq_len // block_size)
    if need_blocks > block_tables.shape[1]:
        s = lens.index(max_seq_len)
        raise ValueError(
            f"block_tables has {block_tables.shape[1]} columns but seq_lens[{s}] = {max_seq_len} needs "
            f"{need_blocks} blocks of {block_size}"
        )
    if bad_id:
        raise ValueError(f"block_tables holds a block id outside 0..{num_blocks - 1} in a column its sequence uses")
    return PagedAttentionMeta(num_seqs, q_lens, lens, cu, max(q_lens, default=0), max_seq_len)


def host_paged_attention_meta(q_lens, seq_lens, block_size: int, max_blocks: int) -> PagedAttentionMeta:
    """The host facts of a call built from the step's Python ints (no device read), with the checks
    `check_paged_attention_args` makes on the device tensors' values."""
    q_lens, lens = [int(q) for q in q_lens], [int(n) for n in seq_lens]
    if len(q_lens) != len(lens) or not lens:
        raise ValueError(f"q_lens and seq_lens must be non-empty and equally long, got {len(q_lens)} and {len(lens)}")
    for s, (q_len, seq_len) in enumerate(zip(q_lens, lens)):
        if q_len < 0:
            raise ValueError(f"cu_seqlens_q must be non-decreasing; sequence {s} has q_len {q_len}")
        if not q_len <= seq_len:
            raise ValueError(f"seq_lens[{s}] = {seq_len} must be >= its q_len = {q_len}")
    max_seq_len = max(lens)
    if -(-max_seq_len // block_size) > max_blocks:
        raise ValueError(f"block_tables has {max_blocks} columns but a sequence of {max_seq_len} needs "
                         f"{-(-max_seq_len // block_size)} blocks of {block_size}")
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)
    return PagedAttentionMeta(len(lens), q_lens, lens, cu, max(q_lens), max_seq_len)


def check_kv_block_copy_values(src_block_ids, dst_block_ids, num_rows, num_blocks: int, block_size: int) -> None:
    """The value rules of `copy_kv_block_prefix`, on host ints (sequences of equal length C):
    ids in 0..num_blocks-1, 0 <= num_rows[i] <= block_size, and no block both read and written or
    written twice (dst ids distinct and disjoint from every src): the copies then run in any order,
    so the kernel's programs need no ordering. Several copies may read one src."""
    srcs = set(src_block_ids)
    seen: set[int] = set()
    for i, (s, d, n) in enumerate(zip(src_block_ids, dst_block_ids, num_rows)):
        require(0 <= s < num_blocks, "src_block_ids", f"[{i}] = {s} must lie in 0..{num_blocks - 1}")
        require(0 <= d < num_blocks, "dst_block_ids", f"[{i}] = {d} must lie in 0..{num_blocks - 1}")
        require(0 <= n <= block_size, "num_rows", f"[{i}] = {n} must lie in 0..block_size = {block_size}")
        require(d != s, "dst_block_ids", f"[{i}] = {d} equals src_block_ids[{i}]: a block cannot copy into itself")
        require(d not in srcs, "dst_block_ids", f"[{i}] = {d} is also a src block: it would be read while written")
        require(d not in seen, "dst_block_ids", f"[{i}] = {d} is written by two copies")
        seen.add(d)


def check_kv_block_copy_args(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    src_block_ids: torch.Tensor,
    dst_block_ids: torch.Tensor,
    num_rows: torch.Tensor,
    read_values: bool = True,
) -> None:
    """Raise `ValueError` unless the arguments of `copy_kv_block_prefix` are valid. The index values
    (`check_kv_block_copy_values`) are read on the host (one device-to-host copy) only with `read_values`."""
    index = dict(src_block_ids=src_block_ids, dst_block_ids=dst_block_ids, num_rows=num_rows)
    for name, t in index.items():
        require(isinstance(t, torch.Tensor), name, f"expected a torch.Tensor, got {type(t).__name__}")
    check_same_device(key_cache=key_cache, value_cache=value_cache, **index)
    if key_cache.dtype not in FLOAT_DTYPES:
        raise ValueError(f"key_cache dtype {key_cache.dtype} not supported: use one of {FLOAT_DTYPES}")
    check_cache(key_cache, value_cache, key_cache.dtype)
    num_copies = src_block_ids.shape[0] if src_block_ids.dim() == 1 else -1
    for name, t in index.items():
        require(t.dim() == 1 and t.shape[0] == num_copies, name,
                f"must be 1-D of the length of src_block_ids, got shape {tuple(t.shape)}"
                f" (src_block_ids {tuple(src_block_ids.shape)})")
        require(t.dtype in INDEX_DTYPES, name, f"dtype {t.dtype} must be int32 or int64")
    if read_values and num_copies:
        src, dst, rows = torch.stack([src_block_ids.long(), dst_block_ids.long(), num_rows.long()]).tolist()
        check_kv_block_copy_values(src, dst, rows, key_cache.shape[0], key_cache.shape[1])
