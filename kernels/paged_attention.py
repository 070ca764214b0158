"""Paged attention for a varlen batch: prefill chunks over a cached prefix, and decode, in one call.

Layout: ``key_cache``/``value_cache`` ``(num_blocks, block_size, num_kv_heads, head_dim)``; see
`kernels.contracts.paged_attention` for the full contract and `kernels.reference.paged_attention`
for the fp32 oracle.

Calls: `paged_attention(...)` checks its arguments and launches. The same call in two steps,
`plan(...)` (the checks, one host sync, and the `LaunchConfig`) then `launch(plan, ...)`, lets a
caller time the launch alone or read the config it will run (the benchmark does both).

Design: one attention kernel, two tile configurations, and a split-K merge kernel.

* A program owns one *q tile* of one sequence and one KV head: ``BLOCK_Q`` query tokens times the
  ``GROUP = num_q_heads // num_kv_heads`` query heads that read that KV head, packed into the
  ``BLOCK_M = BLOCK_Q * GROUP`` rows of the MMA (GQA packing, as vLLM's unified kernel does). Each
  K/V tile is read once per group instead of once per query head: 4x fewer bytes at 32/8 heads.
* Tiles of all sequences share grid axis 0. Sequence ``s`` owns tile ids
  ``cu_seqlens_q[s] // BLOCK_Q + s ..`` (tokens and sequences counted from the launch's first) (at least ``cdiv(q_len, BLOCK_Q)`` of them, disjoint across
  sequences), so a program finds its sequence by binary search over ``cu_seqlens_q`` and the grid
  is ``T // BLOCK_Q + S``: no host-built tile map, decodes and chunks in one launch.
* The KV loop reads keys through the block table per token (``block_tables[s, pos // block_size]``),
  so any block size works with any ``BLOCK_N``: a 256-token page is four 64-key tiles, a 16-token
  page a quarter of one (the model's tests run pages of 4). Keys up to the tile's first query
  position need no causal mask; that loop runs unmasked and a second loop masks the diagonal and
  the ragged end.
* Split-K (flash-decoding): with ``SPLIT`` the program handles only its slice of the keys
  (``BLOCK_N``-aligned, so a split boundary may fall mid-page) and writes an unnormalized partial
  (acc, running max, running sum) to fp32 workspace; `paged_attention_merge_kernel` combines them.

Why one kernel and not two. Decode and prefill differ in shape, not in algorithm, so they differ
here only in constexprs picked by `choose_config`:

* decode (every sequence's queries fit one 16-row tile: q_len <= 4 at 32/8 heads): BLOCK_M = 16,
  the MMA minimum; 12 of 16 rows idle at q_len 1, but a 16-row tile does 16 FLOP per K/V byte
  read, a tenth of the H200's ~165 FLOP/B ridge, so the padding costs no time: decode stays
  bandwidth-bound. Split-K lifts the
  program count: batch 1 x 8 KV heads is 8 programs on 132 SMs (6%); 32 splits make 256.
* prefill (a chunk in the batch): BLOCK_M = 128 rows (32 tokens x 4 heads) x BLOCK_N = 64 keys,
  8 warps: 128 FLOP per KV byte.

Decode rows in a mixed batch (issue 11). In the prefill launch a decode row is one program per KV
head over its whole context: a 32K-token row at 8 KV heads is 8 programs of 32768 keys on 132 SMs.
Programs run in reverse tile order and the model packs decode rows last, so such a row starts in
the first wave and is free beside a long chunk (8192 fresh queries: 256 q tiles x 8 heads = 2048
programs, 64K keys an SM; 191K over an 8K prefix). Beside a short chunk (512 fresh queries: 264
keys an SM) it would set the batch's time alone, so
`choose_launches` moves the trailing decode rows into a launch of their own, with the decode tile
and split-K (the same row: 32 splits, 256 programs of 1024 keys, then the merge), when they would
split on their own and the longest has more keys than the chunk's tiles visit per SM. Both
launches come from the plan (host integers, once a step); the decode rows' launch sees views of
the batch's tensors that start at its first sequence and token. The cost is two launches more and
the decode rows' K/V read after the chunk instead of beside it (at 32K x 8 heads of 128 in bf16,
128 MiB: ~30 us at 4.8 TB/s). GPU timings are pending (no GPU yet; the mixed configs of
`experiments/bench/paged_attention.py` time both plans).

Split-K workspaces (fp32 partial acc, max, sum: T x Hq x splits x (D + 2)) belong to the plan:
`plan_from_host` allocates one a step, `plan_decode_bucket` one a bucket (the addresses a CUDA
graph records); `launch` takes one passed in and allocates only when there is none.

A second decode kernel would duplicate the softmax and the paging for no algorithmic difference;
the per-config register and shared-memory numbers are in the compile-check table
(`python -m kernels.compile_check --filter paged_attention`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import torch
import triton
import triton.language as tl

from kernels.checks import debug_checks, require
from kernels.contracts.paged_attention import (
    PagedAttentionMeta, check_paged_attention_args, check_paged_attention_shapes, host_paged_attention_meta,
)
from kernels.variants import KernelVariant

# A finite "minus infinity" for the running max: a row that sees no key in a split keeps it,
# and exp2(m_old - m_new) stays 0 or 1 instead of NaN from (-inf) - (-inf).
_NEG_BIG = tl.constexpr(-1.0e30)
_LOG2E = 1.4426950408889634

_MAX_GROUP = 64  # query heads per KV head; BLOCK_M >= GROUP, and 64 rows is the largest decode tile
_MAX_SPLITS = 64
# A split runs >= 8 tiles of 64 keys, so its prologue (sequence search, Q load) is amortized and its
# fp32 partial (2 KiB a KV head at d128, written and merged) is <1% of its 256 KiB of K/V.
_MIN_SPLIT_KEYS = 512
_SM_COUNT_FALLBACK = 132  # H100/H200; used only where no CUDA device can be asked (interpreter)


@triton.jit
def _attend_kv_tile(
    b_q, acc, m_i, l_i,
    key_cache, value_cache, p_bt,
    start_n, kv_hi, q_pos, o_d, m_d, i_kvh, scale_log2,
    stride_c_blk, stride_c_tok, stride_c_h,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr, WIDEN_DOT: tl.constexpr,
):
    """One BLOCK_N-key step of the online softmax; MASKED adds the causal and ragged-end masks."""
    o_n = start_n + tl.arange(0, BLOCK_N)
    if MASKED:
        m_n = o_n < kv_hi
        b_blk = tl.load(p_bt + o_n // PAGE_SIZE, mask=m_n, other=0).to(tl.int64)
        m_kt = m_d[:, None] & m_n[None, :]
        m_v = m_n[:, None] & m_d[None, :]
    else:
        b_blk = tl.load(p_bt + o_n // PAGE_SIZE).to(tl.int64)
        m_kt = m_d[:, None]
        m_v = m_d[None, :]
    o_kv = b_blk * stride_c_blk + (o_n % PAGE_SIZE).to(tl.int64) * stride_c_tok + i_kvh * stride_c_h
    p_kt = key_cache + o_kv[None, :] + o_d[:, None]  # K^T tile (HEAD_DIM_PAD, BLOCK_N)
    p_v = value_cache + o_kv[:, None] + o_d[None, :]
    if EVEN_D and not MASKED:
        b_kt = tl.load(p_kt)
    else:
        # Masked lanes read 0, never a stale (maybe NaN) slot: 0 * NaN would poison the row.
        b_kt = tl.load(p_kt, mask=m_kt, other=0.0)
    if WIDEN_DOT:
        b_kt = b_kt.to(tl.float32)
    b_s = tl.dot(b_q, b_kt, input_precision=DOT_PRECISION) * scale_log2
    if MASKED:
        b_s = tl.where(m_n[None, :] & (o_n[None, :] <= q_pos[:, None]), b_s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(b_s, 1))
    alpha = tl.exp2(m_i - m_new)
    b_p = tl.exp2(b_s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(b_p, 1)
    if EVEN_D and not MASKED:
        b_v = tl.load(p_v)
    else:
        b_v = tl.load(p_v, mask=m_v, other=0.0)
    b_p = b_p.to(b_v.dtype)  # P is rounded to the input dtype for the MMA, as in FlashAttention
    if WIDEN_DOT:
        b_p = b_p.to(tl.float32)
        b_v = b_v.to(tl.float32)
    acc = acc * alpha[:, None]
    acc = tl.dot(b_p, b_v, acc, input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit
def paged_attention_kernel(
    # pointers
    query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out, ws_acc, ws_m, ws_l,
    # sizes
    num_seqs, num_q_heads, num_splits, scale_log2,
    # strides (elements)
    stride_q_t, stride_q_h, stride_o_t, stride_o_h, stride_bt_s,
    stride_c_blk, stride_c_tok, stride_c_h,
    # meta
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WIDEN_DOT: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    # Programs run in reverse tile order: the last sequences first. The model packs decode rows
    # after the prefill chunks, so in a mixed batch they start in the first wave and overlap the
    # chunk's tiles instead of trailing them (see "Decode rows in a mixed batch" above).
    i_tile = tl.num_programs(0) - 1 - tl.program_id(0)
    i_kvh = tl.program_id(1).to(tl.int64)
    i_split = tl.program_id(2)

    # The launch's rows may be a slice of the batch (the decode rows of a mixed batch): query, out,
    # the workspace and the tile ids count from its first token, q_base (0 for a whole batch).
    q_base = tl.load(cu_seqlens_q)
    # Sequence of this tile: the last s with (cu_seqlens_q[s] - q_base) // BLOCK_Q + s <= i_tile.
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if (tl.load(cu_seqlens_q + mid) - q_base) // BLOCK_Q + mid <= i_tile:
            lo = mid + 1
        else:
            hi = mid
    i_seq = lo - 1
    q_begin = tl.load(cu_seqlens_q + i_seq) - q_base
    q_len = tl.load(cu_seqlens_q + i_seq + 1) - q_base - q_begin
    n_qtiles = tl.cdiv(q_len, BLOCK_Q)
    i_local = i_tile - (q_begin // BLOCK_Q + i_seq)
    if i_local >= n_qtiles:
        return
    i_qt = i_local  # reversed order: the last q tile (it sees the most keys) launches first
    context_len = tl.load(seq_lens + i_seq) - q_len

    # Rows: query token i_qt * BLOCK_Q + m // GROUP, query head i_kvh * GROUP + m % GROUP.
    o_m = tl.arange(0, BLOCK_M)
    o_qi = i_qt * BLOCK_Q + o_m // GROUP
    m_row = (o_m < BLOCK_Q * GROUP) & (o_qi < q_len)
    o_tok = (q_begin + o_qi).to(tl.int64)
    o_head = i_kvh * GROUP + o_m % GROUP
    o_d = tl.arange(0, HEAD_DIM_PAD)
    m_d = o_d < HEAD_DIM
    m_qd = m_row[:, None] & m_d[None, :]
    p_q = query + o_tok[:, None] * stride_q_t + o_head[:, None] * stride_q_h + o_d[None, :]
    b_q = tl.load(p_q, mask=m_qd, other=0.0)
    if WIDEN_DOT:
        b_q = b_q.to(tl.float32)
    q_pos = context_len + o_qi

    q_first = context_len + i_qt * BLOCK_Q  # keys <= q_first are visible to every row
    kv_hi = context_len + tl.minimum(i_qt * BLOCK_Q + BLOCK_Q, q_len)  # no row sees key kv_hi
    kv_lo = 0
    if SPLIT:
        split_len = tl.cdiv(tl.cdiv(kv_hi, num_splits), BLOCK_N) * BLOCK_N
        kv_lo = i_split * split_len
        kv_hi = tl.minimum(kv_hi, kv_lo + split_len)
    kv_mid = kv_lo + tl.maximum(tl.minimum(kv_hi, q_first + 1) - kv_lo, 0) // BLOCK_N * BLOCK_N

    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    p_bt = block_tables + i_seq.to(tl.int64) * stride_bt_s
    for start_n in range(kv_lo, kv_mid, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            b_q, acc, m_i, l_i, key_cache, value_cache, p_bt, start_n, kv_hi, q_pos, o_d, m_d, i_kvh, scale_log2,
            stride_c_blk, stride_c_tok, stride_c_h, PAGE_SIZE, BLOCK_N, EVEN_D, False, DOT_PRECISION, WIDEN_DOT,
        )
    for start_n in range(kv_mid, kv_hi, BLOCK_N):
        acc, m_i, l_i = _attend_kv_tile(
            b_q, acc, m_i, l_i, key_cache, value_cache, p_bt, start_n, kv_hi, q_pos, o_d, m_d, i_kvh, scale_log2,
            stride_c_blk, stride_c_tok, stride_c_h, PAGE_SIZE, BLOCK_N, EVEN_D, True, DOT_PRECISION, WIDEN_DOT,
        )

    if SPLIT:
        # Workspace (T, num_q_heads, num_splits[, HEAD_DIM]) fp32; an empty split writes l = 0.
        o_ws = (o_tok * num_q_heads + o_head) * num_splits + i_split
        tl.store(ws_m + o_ws, m_i, mask=m_row)
        tl.store(ws_l + o_ws, l_i, mask=m_row)
        tl.store(ws_acc + o_ws[:, None] * HEAD_DIM + o_d[None, :], acc, mask=m_qd)
    else:
        # l_i >= 1 on every real row (key 0 is visible to all); a pad row (seq_len 0) saw no key: 0
        b_o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        p_o = out + o_tok[:, None] * stride_o_t + o_head[:, None] * stride_o_h + o_d[None, :]
        tl.store(p_o, b_o.to(out.dtype.element_ty), mask=m_qd)


@triton.jit
def paged_attention_merge_kernel(
    # pointers
    ws_acc, ws_m, ws_l, out,
    # sizes
    num_q_heads, num_splits,
    # strides (elements)
    stride_o_t, stride_o_h,
    # meta
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """out[t, h] = sum_j 2^(m_j - M) acc_j / sum_j 2^(m_j - M) l_j over the splits j."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1).to(tl.int64)
    o_j = tl.arange(0, SPLITS_PAD)
    m_j = o_j < num_splits
    o_d = tl.arange(0, HEAD_DIM_PAD)
    m_d = o_d < HEAD_DIM
    o_ws = (i_t * num_q_heads + i_h) * num_splits + o_j
    b_m = tl.load(ws_m + o_ws, mask=m_j, other=float("-inf"))
    b_l = tl.load(ws_l + o_ws, mask=m_j, other=0.0)
    b_w = tl.exp2(b_m - tl.max(b_m, 0))  # empty splits hold m = -1e30: weight 0
    b_acc = tl.load(ws_acc + o_ws[:, None] * HEAD_DIM + o_d[None, :], mask=m_j[:, None] & m_d[None, :], other=0.0)
    b_den = tl.sum(b_l * b_w, 0)
    b_o = tl.sum(b_acc * b_w[:, None], 0) / tl.where(b_den > 0.0, b_den, 1.0)  # a pad row saw no key: 0
    tl.store(out + i_t * stride_o_t + i_h * stride_o_h + o_d, b_o.to(out.dtype.element_ty), mask=m_d)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """Tiles, warps, pipeline stages and split-K count of one attention launch (`choose_config`)."""

    block_m: int  # MMA rows: BLOCK_Q query tokens x GROUP query heads
    block_n: int  # keys a KV step
    num_warps: int
    num_stages: int
    num_splits: int  # 1: no split-K, no merge kernel

    def describe(self) -> str:
        """A short label, e.g. "m16n64w4s32" (rows, keys, warps, splits)."""
        return f"m{self.block_m}n{self.block_n}w{self.num_warps}s{self.num_splits}"


def is_decode(max_q_len: int, group: int) -> bool:
    """Every sequence's queries fit the 16-row decode tile (q_len <= 4 at GROUP 4, 1 at GROUP 16)."""
    return max_q_len * group <= max(16, triton.next_power_of_2(group))


def choose_config(
    dtype: torch.dtype, head_dim: int, group: int, *, decode: bool, num_seqs: int, num_kv_heads: int,
    max_seq_len: int, sm_count: int, num_splits: int | None,
) -> LaunchConfig:
    """Tile sizes by a fixed rule (no autotuning: the compile check builds exactly these).

    Register and shared-memory numbers below are from `python -m kernels.compile_check`.
    """
    head_dim_pad = _head_dim_pad(head_dim)
    if dtype == torch.float32:
        # tf32x3 holds every MMA operand twice (big and small halves): a 64 x 128 fp32 Q tile alone
        # is 128 registers a thread, and 64x32 / 32x32 tiles spill or sit at 255. 16 x 32 compiles
        # to ~190. fp32 is the accuracy path, not the fast one. d <= 64 at 2 stages spills 4 B (sm_90)
        # and 20 B (sm_80) in the split variant under Triton 3.6, the GPU machine's version, so 1.
        cfg = dict(block_m=16, block_n=32, num_warps=4, num_stages=1 if head_dim_pad <= 64 else 2)
    elif decode:
        # 16 rows (the MMA minimum) x 64 keys, 4 warps: ~150 registers at d128 (sm_90, Triton 3.6 and 3.9); 3 stages of K+V
        # tiles (39 KiB) keep loads in flight. d64 at 3 stages spills 32 B on sm_80, so 2.
        cfg = dict(block_m=16, block_n=64 if head_dim_pad <= 128 else 32, num_warps=4,
                   num_stages=3 if head_dim_pad == 128 else 2)
    else:
        # 128 rows (32 tokens x 4 heads) x 64 keys, 8 warps: ~180 registers, 96 KiB smem on sm_90
        # at d128; d256 halves the rows and keys to stay there.
        cfg = dict(block_m=128, block_n=64, num_warps=8, num_stages=2)
        if head_dim_pad > 128:
            cfg.update(block_m=64, block_n=32)
    cfg["block_m"] = max(cfg["block_m"], triton.next_power_of_2(group))
    if num_splits is None:
        num_splits = 1
        if decode:
            programs = num_seqs * num_kv_heads
            want = triton.cdiv(2 * sm_count, programs)  # two waves of programs over the SMs
            cap = max(1, max_seq_len // _MIN_SPLIT_KEYS)
            num_splits = 1 << (min(want, cap, _MAX_SPLITS).bit_length() - 1)  # power of two, rounded down
    return LaunchConfig(num_splits=num_splits, **cfg)


def _head_dim_pad(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _SM_COUNT_FALLBACK


def _check_layout(query, key_cache, block_tables, out, num_splits) -> None:
    """Limits of this kernel beyond `check_paged_attention_args`."""
    if query.device.type != "cuda" and not _interpreted():
        raise ValueError(f"paged_attention needs CUDA tensors (or TRITON_INTERPRET=1), got device {query.device}")
    # Any block_size works (keys are gathered per token); head_dim is padded to a power of two >= 16
    # (the MMA's minimum K) and 256 is the largest with a spill-free tile.
    num_kv_heads, head_dim = key_cache.shape[2:]
    if not 1 <= head_dim <= 256:
        raise ValueError(f"head_dim must be in 1..256, got {head_dim}")
    group = query.shape[1] // num_kv_heads
    if group > _MAX_GROUP:
        raise ValueError(f"num_q_heads // num_kv_heads must be in 1..{_MAX_GROUP}, got {group}")
    if query.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
        raise ValueError("query and out need unit stride along head_dim")
    if block_tables.stride(-1) != 1:
        raise ValueError("block_tables needs unit stride along its columns")
    if num_splits is not None and not 1 <= num_splits <= _MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{_MAX_SPLITS} or None, got {num_splits}")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs must not be rounded to tf32 (10 mantissa bits would miss the 5e-4 fp32 tolerance).
    # tf32x3 (three tf32 MMAs on the split operands) is fp32-accurate and keeps the tensor cores;
    # "ieee" falls back to FMA dots that need K=128 operands in registers and spill 3 KiB.
    # The flag is ignored for fp16/bf16 operands.
    return "tf32x3" if dtype == torch.float32 else "tf32"


@dataclasses.dataclass(frozen=True)
class DecodePart:
    """The decode rows of a mixed batch, split off into their own split-K launch (`choose_launches`):
    sequences ``first_seq ..`` (the model packs decode rows last), query tokens ``first_token ..``."""

    first_seq: int
    first_token: int
    config: LaunchConfig


@dataclasses.dataclass(frozen=True)
class SplitWorkspace:
    """The fp32 partials of one split-K launch: acc ``(rows, Hq, S, D)``, running max and sum
    ``(rows, Hq, S)``; views into one allocation (`allocate_split_workspace`). ``rows`` may exceed
    the launch's query tokens; the other sizes must match it exactly (they are strides)."""

    acc: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor


def allocate_split_workspace(rows: int, num_q_heads: int, num_splits: int, head_dim: int,
                             device: torch.device | str) -> SplitWorkspace:
    """One fp32 buffer of ``rows * Hq * S * (D + 2)`` elements: 512 KiB at batch 1 x 32 heads x 32
    splits x d128. The launcher's fallback when no workspace is passed (eager calls)."""
    n = rows * num_q_heads * num_splits
    buf = torch.empty(n * (head_dim + 2), dtype=torch.float32, device=device)
    return SplitWorkspace(acc=buf[:n * head_dim].view(rows, num_q_heads, num_splits, head_dim),
                          m=buf[n * head_dim:n * (head_dim + 1)].view(rows, num_q_heads, num_splits),
                          l=buf[n * (head_dim + 1):].view(rows, num_q_heads, num_splits))


@dataclasses.dataclass(frozen=True)
class PagedAttentionPlan:
    """A checked call: its host facts, its scale, and the launches it needs (config None: no query
    tokens). `config` launches sequences ``0 .. decode_part.first_seq`` (all without a decode part);
    `decode_part` the decode rows of a mixed batch with split-K."""

    meta: PagedAttentionMeta
    scale: float
    config: LaunchConfig | None
    # A decode bucket (`plan_decode_bucket`): one query a row, `meta.seq_lens` an upper bound, and
    # rows with seq_len 0 are pad rows (output 0); the device tensors change between replays.
    pad_rows: bool = False
    decode_part: DecodePart | None = None
    # The split-K launch's workspace, allocated with the plan (a step's plan or a bucket's: the
    # addresses a CUDA graph records); None: `launch` allocates one a call.
    workspace: SplitWorkspace | None = dataclasses.field(default=None, compare=False, repr=False)

    def split_launch(self) -> tuple[LaunchConfig, int] | None:
        """The one launch of this plan that splits K (config, its query tokens), or None."""
        if self.decode_part is not None:
            return self.decode_part.config, self.meta.cu_seqlens_q[-1] - self.decode_part.first_token
        if self.config is not None and self.config.num_splits > 1:
            return self.config, self.meta.cu_seqlens_q[-1]
        return None

    def describe(self) -> str:
        """The launches, e.g. "m128n64w8s1" or "m128n64w8s1+m16n64w4s32" (a decode part)."""
        if self.config is None:
            return "none"
        return self.config.describe() + (f"+{self.decode_part.config.describe()}" if self.decode_part else "")


def _prefill_keys_per_sm(meta: PagedAttentionMeta, num_seqs: int, block_q: int, num_kv_heads: int,
                         sm_count: int) -> float:
    """Keys the q tiles of sequences ``0 .. num_seqs`` visit over all KV heads, per SM: the prefill
    launch's time in key steps, if its programs spread evenly."""
    keys = 0
    for q, n in zip(meta.q_lens[:num_seqs], meta.seq_lens[:num_seqs]):
        tiles = -(-q // block_q)  # tile i sees ctx + min((i + 1) * block_q, q) keys
        keys += tiles * (n - q) + block_q * tiles * (tiles - 1) // 2 + (q if tiles else 0)
    return keys * num_kv_heads / sm_count


def choose_launches(
    meta: PagedAttentionMeta, dtype: torch.dtype, head_dim: int, group: int, *, num_kv_heads: int, sm_count: int,
    num_splits: int | None,
) -> tuple[LaunchConfig | None, DecodePart | None]:
    """The config of the batch's launch and, for a mixed batch, the decode rows' own launch.

    A mixed batch (a chunk beside decode rows) runs the prefill config, in which a decode row is one
    program per KV head over its whole context: at 32K tokens and 8 KV heads, 8 programs of 32768
    keys each. When its decode rows would split on their own (`choose_config`: few rows, >= 1024
    keys) and the longest of them has more keys than the chunk's tiles visit per SM, they leave
    that launch for a decode-config launch with split-K (the same 32K row: 32 splits, 256 programs
    of 1024 keys) and its merge: two launches more, both planned here on the host. Keys compare
    directly: a decode key (512 B of K+V at d128 bf16 on one SM, ~14 ns at a 1/132 share of 4.8
    TB/s) costs about a prefill tile's key (64 KFLOP for 128 rows, ~9-17 ns at 50-100% of an SM's
    7.5 TFLOP/s). Beside a long chunk (8192 fresh queries: 64K keys an SM) the row rides the
    chunk's first wave (programs run in reverse tile order, decode rows packed last) and is free;
    beside a short one (512 fresh queries: 264 keys an SM) it alone would set the time. A 32K row
    leaves beside fresh chunks below ~5.8K tokens.
    Only the trailing run of decode rows leaves (the model packs them last). `num_splits` given:
    one launch with that split count, as before.
    """
    if not meta.cu_seqlens_q[-1]:
        return None, None
    decode = is_decode(meta.max_q_len, group)
    config = choose_config(dtype, head_dim, group, decode=decode, num_seqs=meta.num_seqs, num_kv_heads=num_kv_heads,
                           max_seq_len=meta.max_seq_len, sm_count=sm_count, num_splits=num_splits)
    if decode or num_splits is not None:
        return config, None
    first = meta.num_seqs
    while first > 0 and is_decode(meta.q_lens[first - 1], group):
        first -= 1
    first_token = meta.cu_seqlens_q[first]
    if first_token == meta.cu_seqlens_q[-1]:
        return config, None  # no decode row at the end (or only q_len-0 rows there)
    longest = max(meta.seq_lens[first:])
    part = choose_config(dtype, head_dim, group, decode=True, num_seqs=meta.num_seqs - first,
                         num_kv_heads=num_kv_heads, max_seq_len=longest, sm_count=sm_count, num_splits=None)
    if part.num_splits == 1 or longest <= _prefill_keys_per_sm(meta, first, config.block_m // group, num_kv_heads,
                                                               sm_count):
        return config, None
    return config, DecodePart(first, first_token, part)


def plan(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> PagedAttentionPlan:
    """Every check of `paged_attention` (one host sync) and the launches it would make, without
    launching (no workspace: `launch` allocates it). Arguments as in `paged_attention`; raises
    `ValueError` on a bad one."""
    meta = check_paged_attention_args(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out)
    _check_layout(query, key_cache, block_tables, out, num_splits)
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    num_q_heads, head_dim = query.shape[1:]
    num_kv_heads = key_cache.shape[2]
    config, part = choose_launches(meta, query.dtype, head_dim, num_q_heads // num_kv_heads, num_kv_heads=num_kv_heads,
                                   sm_count=_sm_count(query.device), num_splits=num_splits)
    return PagedAttentionPlan(meta, scale, config, decode_part=part)


_plan_from_tensors = plan  # `paged_attention`'s keyword `plan` shadows the function there


def plan_from_host(
    q_lens, seq_lens, *, num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, max_blocks: int,
    dtype: torch.dtype, device: torch.device | str, scale: float | None = None, num_splits: int | None = None,
) -> PagedAttentionPlan:
    """The plan of a call from the step's host integers (query and total lengths per sequence):
    no device read. Every attention layer of a model step shares it (`paged_attention(plan=)`),
    and its split-K workspace, allocated here once a step."""
    meta = host_paged_attention_meta(q_lens, seq_lens, block_size, max_blocks)
    if num_kv_heads < 1 or num_q_heads % num_kv_heads or not 1 <= num_q_heads // num_kv_heads <= _MAX_GROUP:
        raise ValueError(f"num_q_heads // num_kv_heads must be an integer in 1..{_MAX_GROUP}, "
                         f"got {num_q_heads} / {num_kv_heads}")
    if num_splits is not None and not 1 <= num_splits <= _MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{_MAX_SPLITS} or None, got {num_splits}")
    scale = head_dim ** -0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    device = torch.device(device)
    config, part = choose_launches(meta, dtype, head_dim, num_q_heads // num_kv_heads, num_kv_heads=num_kv_heads,
                                   sm_count=_sm_count(device), num_splits=num_splits)
    plan = PagedAttentionPlan(meta, scale, config, decode_part=part)
    split = plan.split_launch()
    if split is None:
        return plan
    split_config, rows = split
    return dataclasses.replace(plan, workspace=allocate_split_workspace(rows, num_q_heads, split_config.num_splits,
                                                                        head_dim, device))


def plan_decode_bucket(
    batch: int, *, num_q_heads: int, num_kv_heads: int, head_dim: int, block_size: int, max_blocks: int,
    dtype: torch.dtype, device: torch.device | str, scale: float | None = None, num_splits: int | None = None,
) -> PagedAttentionPlan:
    """A fixed plan for `batch` decode rows (one query each) of up to `max_blocks * block_size`
    tokens, for a CUDA graph replayed with other lengths: the grid, the split count and the split-K
    workspace (allocated here: batch x Hq x splits x D fp32) depend only on the bucket (the split
    heuristic sees the longest context the block tables can hold). Rows with seq_len 0 are pad
    rows and write 0."""
    max_len = max_blocks * block_size
    base = plan_from_host([1] * batch, [max_len] * batch, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                          head_dim=head_dim, block_size=block_size, max_blocks=max_blocks, dtype=dtype,
                          device=device, scale=scale, num_splits=num_splits)
    return dataclasses.replace(base, pad_rows=True)


def _check_against_plan(checked: PagedAttentionPlan, query, key_cache, value_cache, block_tables, seq_lens,
                        cu_seqlens_q, scale, out) -> None:
    """The checks a host-planned call makes without reading device data; the debug switch adds the
    full device-reading check and compares its facts with the plan's."""
    check_paged_attention_shapes(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out)
    _check_layout(query, key_cache, block_tables, out, checked.config.num_splits if checked.config else None)
    meta = checked.meta
    require(seq_lens.shape[0] == meta.num_seqs and query.shape[0] == meta.cu_seqlens_q[-1], "plan",
            f"made for {meta.num_seqs} sequences and {meta.cu_seqlens_q[-1]} query tokens, called with "
            f"{seq_lens.shape[0]} and {query.shape[0]}")
    want_scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    require(want_scale == checked.scale, "plan", f"made for scale {checked.scale}, called with {want_scale}")
    if debug_checks() and checked.pad_rows:
        cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
        require(cu == list(range(meta.num_seqs + 1)), "cu_seqlens_q", f"a decode bucket has one query a row, got {cu}")
        require(all(0 <= n <= meta.max_seq_len for n in lens), "seq_lens",
                f"must lie in 0 .. {meta.max_seq_len} (0: a pad row), got {lens}")
    elif debug_checks():
        device_meta = check_paged_attention_args(query, key_cache, value_cache, block_tables, seq_lens,
                                                 cu_seqlens_q, out)
        require(device_meta == meta, "plan", f"does not match the tensors: {meta} vs {device_meta}")


def _check_workspace(ws: SplitWorkspace, rows: int, num_q_heads: int, num_splits: int, head_dim: int,
                     device: torch.device) -> None:
    """A workspace passed in must hold this launch: its head, split and dim sizes are strides."""
    want = f"(>= {rows}, {num_q_heads}, {num_splits}, {head_dim}) fp32 on {device}"
    ok = (ws.acc.dim() == 4 and ws.acc.shape[0] >= rows and tuple(ws.acc.shape[1:]) == (num_q_heads, num_splits, head_dim)
          and ws.m.shape == ws.acc.shape[:3] and ws.l.shape == ws.acc.shape[:3])
    require(ok, "workspace", f"acc must be {want} with m, l of its first 3 dims, got {tuple(ws.acc.shape)}, "
            f"{tuple(ws.m.shape)}, {tuple(ws.l.shape)}")
    for name, t in (("acc", ws.acc), ("m", ws.m), ("l", ws.l)):
        require(t.dtype == torch.float32 and t.device == device and t.is_contiguous(), "workspace",
                f"{name} must be contiguous fp32 on {device}, got {t.dtype} on {t.device}")


def _launch_rows(cfg: LaunchConfig, scale: float, seqs: slice, tokens: slice, query, key_cache, value_cache,
                 block_tables, seq_lens, cu_seqlens_q, out, workspace: SplitWorkspace | None) -> None:
    """The attention launch (and its merge, with split-K) over sequences `seqs`, whose query tokens
    are `tokens`: views of the batch's tensors, no copy and no host read."""
    num_q_heads, head_dim = query.shape[1:]
    block_size, num_kv_heads = key_cache.shape[1:3]
    group = num_q_heads // num_kv_heads
    num_seqs, num_tokens = seqs.stop - seqs.start, tokens.stop - tokens.start
    if seqs != slice(0, seq_lens.shape[0]):
        query, out = query[tokens], out[tokens]
        block_tables, seq_lens, cu_seqlens_q = block_tables[seqs], seq_lens[seqs], cu_seqlens_q[seqs.start:seqs.stop + 1]
    split = cfg.num_splits > 1
    head_dim_pad = _head_dim_pad(head_dim)
    if split:
        if workspace is None:
            workspace = allocate_split_workspace(num_tokens, num_q_heads, cfg.num_splits, head_dim, query.device)
        ws_acc, ws_m, ws_l = workspace.acc, workspace.m, workspace.l
    else:
        ws_m = ws_l = ws_acc = out  # unused: SPLIT=False never touches them
    block_q = cfg.block_m // group
    grid = (num_tokens // block_q + num_seqs, num_kv_heads, cfg.num_splits)
    paged_attention_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out, ws_acc, ws_m, ws_l,
        num_seqs, num_q_heads, cfg.num_splits, scale * _LOG2E,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, PAGE_SIZE=block_size,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SPLIT=split, DOT_PRECISION=_dot_precision(query.dtype),
        WIDEN_DOT=_interpreted() and query.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split:
        paged_attention_merge_kernel[(num_tokens, num_q_heads)](
            ws_acc, ws_m, ws_l, out,
            num_q_heads, cfg.num_splits,
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, SPLITS_PAD=triton.next_power_of_2(cfg.num_splits),
            num_warps=4,
        )


def launch(
    plan: PagedAttentionPlan, query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q,
    out: torch.Tensor, workspace: SplitWorkspace | None = None,
) -> torch.Tensor:
    """Run a `plan` made for these same tensors, checking nothing again but the workspace's shape;
    writes and returns `out` (``(T, Hq, D)``, query dtype). The split-K launch uses `workspace`,
    else the plan's, else one allocated here."""
    cfg, meta = plan.config, plan.meta
    if cfg is None:
        return out
    workspace = workspace if workspace is not None else plan.workspace
    split = plan.split_launch()
    if workspace is not None and split is not None:  # checked before the first launch writes `out`
        _check_workspace(workspace, split[1], query.shape[1], split[0].num_splits, query.shape[2], query.device)
    part = plan.decode_part
    end = meta.num_seqs if part is None else part.first_seq
    args = (query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out)
    _launch_rows(cfg, plan.scale, slice(0, end), slice(0, meta.cu_seqlens_q[end]), *args,
                 workspace=workspace if part is None else None)
    if part is not None:
        _launch_rows(part.config, plan.scale, slice(part.first_seq, meta.num_seqs),
                     slice(part.first_token, meta.cu_seqlens_q[-1]), *args, workspace=workspace)
    return out


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    plan: PagedAttentionPlan | None = None,
    workspace: SplitWorkspace | None = None,
) -> torch.Tensor:
    """Causal attention of packed varlen queries over their paged K/V (decode and prefill chunks).

    query ``(T, Hq, D)``; key_cache, value_cache ``(num_blocks, block_size, Hkv, D)`` contiguous, same
    dtype (fp32/fp16/bf16), ``Hq % Hkv == 0``; block_tables ``(S, max_blocks)`` int32; seq_lens
    ``(S,)`` int32 (cached prefix + new tokens, all already in the cache); cu_seqlens_q ``(S + 1,)``
    int32. Query ``i`` of sequence ``s`` sits at position ``seq_lens[s] - q_len[s] + i`` and sees keys
    ``<=`` it. ``scale`` defaults to ``D ** -0.5``. ``num_splits`` forces the split-K count
    (default: a heuristic that splits long decodes only). Returns ``(T, Hq, D)`` in the query dtype,
    written into ``out`` when given. Raises `ValueError` before launching on a bad argument.
    ``plan``: from `plan_from_host` for these lengths (then no tensor data is read on the host, and
    ``num_splits`` is the plan's). ``workspace``: the split-K partials (`allocate_split_workspace`
    for the plan's `split_launch`; default the plan's, else allocated per call).
    """
    if plan is None:
        checked = _plan_from_tensors(query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q,
                                     scale=scale, out=out, num_splits=num_splits)
    else:
        checked = plan
        _check_against_plan(checked, query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, scale, out)
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    return launch(checked, query, key_cache, value_cache, block_tables, seq_lens, cu_seqlens_q, out, workspace)


# What the model launches (the presets in model/families/): bamba-9b 32/8 heads of 128 (GROUP 4), small
# 4/1 heads of 64, tiny 4/2 heads of 16 (GROUP 2); plus head_dim 80 (not a power of two, masked to
# 128) and 256. bf16 / fp16 / fp32, pages of 16 and 256, prefill and decode tiles, split-K + merge.
_COMPILE_CASES = (
    # (mode, dtype, head_dim, block_size, group)
    ("prefill", "bf16", 128, 16, 4), ("decode", "bf16", 128, 16, 4), ("split", "bf16", 128, 16, 4),
    ("prefill", "bf16", 128, 256, 4), ("split", "bf16", 128, 256, 4),
    ("prefill", "fp16", 128, 16, 4), ("split", "fp16", 128, 16, 4),
    ("prefill", "fp32", 128, 16, 4), ("split", "fp32", 128, 16, 4),
    ("prefill", "bf16", 64, 16, 4), ("split", "bf16", 64, 16, 4),
    ("prefill", "fp32", 64, 16, 4), ("split", "fp32", 64, 16, 4),
    ("prefill", "bf16", 80, 16, 4), ("split", "bf16", 80, 16, 4),
    ("prefill", "fp32", 16, 16, 2), ("split", "fp32", 16, 16, 2),
    ("prefill", "bf16", 256, 16, 4), ("split", "bf16", 256, 16, 4),
)
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def compile_variants():
    """Every attention and merge specialization the model launches (see `_COMPILE_CASES`)."""
    variants = []
    merges = set()
    for mode, dtype, head_dim, block_size, group in _COMPILE_CASES:
        tt = f"*{dtype}"
        decode = mode != "prefill"
        cfg = choose_config(
            _TORCH_DTYPES[dtype], head_dim, group, decode=decode, num_seqs=1, num_kv_heads=8,
            max_seq_len=32768, sm_count=_SM_COUNT_FALLBACK, num_splits=None if decode else 1,
        )
        split = mode == "split"
        if not split:
            cfg = dataclasses.replace(cfg, num_splits=1)
        ws = "*fp32" if split else tt
        variants.append(KernelVariant(
            name=f"paged_attention/{mode}/{dtype}/d{head_dim}/g{group}/bs{block_size}/m{cfg.block_m}n{cfg.block_n}",
            fn=paged_attention_kernel,
            signature={
                "query": tt, "key_cache": tt, "value_cache": tt, "block_tables": "*i32", "seq_lens": "*i32",
                "cu_seqlens_q": "*i32", "out": tt, "ws_acc": ws, "ws_m": ws, "ws_l": ws,
                "num_seqs": "i32", "num_q_heads": "i32", "num_splits": "i32", "scale_log2": "fp32",
                "stride_q_t": "i32", "stride_q_h": "i32", "stride_o_t": "i32", "stride_o_h": "i32",
                "stride_bt_s": "i32", "stride_c_blk": "i32", "stride_c_tok": "i32", "stride_c_h": "i32",
                "GROUP": "constexpr", "HEAD_DIM": "constexpr", "HEAD_DIM_PAD": "constexpr", "PAGE_SIZE": "constexpr",
                "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "SPLIT": "constexpr", "DOT_PRECISION": "constexpr",
                "WIDEN_DOT": "constexpr",
            },
            constexprs={
                "GROUP": group, "HEAD_DIM": head_dim, "HEAD_DIM_PAD": _head_dim_pad(head_dim),
                "PAGE_SIZE": block_size, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "SPLIT": split,
                "DOT_PRECISION": _dot_precision(_TORCH_DTYPES[dtype]), "WIDEN_DOT": False,
            },
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            # torch allocations are 16-byte aligned and every stride here is a multiple of head_dim
            # (16 / 64 / 80 / 128 / 256), which the JIT specializes on at run time too.
            divisible_by_16=("query", "key_cache", "value_cache", "block_tables", "out", "ws_acc",
                             "stride_q_t", "stride_q_h", "stride_o_t", "stride_o_h",
                             "stride_c_blk", "stride_c_tok", "stride_c_h"),
        ))
        if split:
            merges.add((dtype, head_dim, triton.next_power_of_2(cfg.num_splits)))
    for dtype, head_dim, splits_pad in sorted(merges):
        if (dtype, head_dim) not in (("bf16", 128), ("bf16", 80), ("fp32", 128), ("fp32", 16)):
            continue  # the merge differs by dtype only in its store; these cover the head_dim shapes
        variants.append(KernelVariant(
            name=f"paged_attention_merge/{dtype}/d{head_dim}/splits{splits_pad}",
            fn=paged_attention_merge_kernel,
            signature={
                "ws_acc": "*fp32", "ws_m": "*fp32", "ws_l": "*fp32", "out": f"*{dtype}",
                "num_q_heads": "i32", "num_splits": "i32", "stride_o_t": "i32", "stride_o_h": "i32",
                "HEAD_DIM": "constexpr", "HEAD_DIM_PAD": "constexpr", "SPLITS_PAD": "constexpr",
            },
            constexprs={"HEAD_DIM": head_dim, "HEAD_DIM_PAD": _head_dim_pad(head_dim), "SPLITS_PAD": splits_pad},
            num_warps=4,
            divisible_by_16=("ws_acc", "out", "stride_o_t", "stride_o_h"),
        ))
    return variants
