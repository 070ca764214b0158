"""Mamba-2 SSD chunked scan (varlen) that emits states at given token offsets in the same launches.

Five kernels over *logical chunks* (the SSD matmul form: tensor cores on a GPU):

    1. chunk_cumsum   dt' = clamp(softplus(dt + dt_bias)), and its decay cumsum dA_cs per chunk
    2. bmm            CB = C . B^T per chunk and group (shared by H/G heads: 128x fewer dots at G=1)
    3. chunk_state    the state a chunk adds: sum_j exp(dA_last - dA_j) dt'_j x_j (outer) B_j
    4. state_passing  sequential over a sequence's chunks: state entering each chunk, final state,
                      and the captured states
    5. chunk_scan     y = exp(dA_i) C_i . state_in  +  sum_{j<=i} CB_ij exp(dA_i - dA_j) dt'_j x_j  +  D x

How a capture is made. The host builds a table of logical chunks (`build_chunk_table`, shared with
the CPU path): a chunk never spans a sequence boundary, chunks start every `chunk_size`
tokens from the sequence start, and a chunk is additionally *cut* at every capture offset. Stage 4
computes the state after every chunk anyway, so a capture at offset o is that state written out
once more: one (P, N) fp32 store per head, into `captured_states[k]`, in the same launch.

What it costs. A cut splits one chunk in two without moving the others, so K captures add at most
K chunks, and less in work: the two halves of a cut chunk run the same token tiles as the whole
one would, plus at most one partly masked tile each (stage-5 programs past a short chunk's end
exit at once). At 32K tokens and chunk 256 that bounds a capture at 1 of 128 chunks (0.8%),
plus one more chunk state through stage 4 and the H*P*N*4-byte capture itself (4 MB at H=128,
P=64, N=128). Two passes do the same arithmetic but pay a second launch sequence (5 launches,
a second host-built chunk table and its copy) and a host round trip between them.

Layouts: x (T, H, P), dt (T, H), B/C (T, G, N) may have any strides (the model passes views of
one projection). Internals: dt'/dA_cs (nc, H, L) fp32, CB (nc, G, L, L) fp32,
chunk states (nc, H, P, N) fp32, states entering each chunk (nc, H, P, N) in x's dtype (the
chunk states' own buffer when x is fp32). Entering states in bf16 halve the stage-4 store and
the stage-5 load of the largest intermediate: 268 MB instead of 537 MB each at T=32K, H=128,
P=64, N=128 (nc=128), for 268 MB more scratch beside the fp32 chunk states; stage 5 cast them to
bf16 before its dot already, so y is bit-identical. Captured and final states stay fp32.
Called alone, `ssd_scan` reads `cu_seqlens` on the host (one sync) to build the chunk table and
size the grid, and uploads the table (one blocking copy). A model step instead builds the table
once on the host from its own integers (`plan_ssd_scan`), uploads it with the step's other
metadata (`kernels.contracts.packed`) and passes the plan to every layer: no sync, no copy.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
import triton
import triton.language as tl

from kernels.checks import require
from kernels.contracts.packed import IntTables, Table
from kernels.contracts.ssd import NO_LIMIT, SSDScanOutput, check_ssd_scan_args
from kernels.contracts.varlen import build_chunk_table, check_capture_offsets, check_host_seqlens, check_state_pool
from kernels.program_grid import dot, unflatten2, unflatten3
from kernels.ssd_configs import device_capability, tile_config
from kernels.variants import KernelVariant, aligned_args

__all__ = ["ssd_scan", "SSDScanOutput", "DEFAULT_CHUNK_SIZE", "SSDScanPlan", "plan_ssd_scan"]

DEFAULT_CHUNK_SIZE = 256  # Bamba/Granite-4.0-H's mamba_chunk_size


# ---- program order: the tiles of one (chunk, head) are adjacent programs -----------------------
# Every chunk-parallel stage runs on a 1-D grid, tile fastest, then head (or group), then chunk.
# The stage-5 m-tiles of one (chunk, head) share its entering state (P x N: 32 KB fp32, 16 KB
# bf16) and x rows; all heads of a group share CB (L x L fp32: 256 KB) and C. With chunks fastest
# (the old 3-D grid) the L/BLOCK_M = 4 m-tiles of one (chunk, head) ran nc*H = 16K programs apart
# at T=32K (nc=128, H=128, P=64, N=128): ~50 waves of ~300 resident programs reading ~100 KB
# each, so the 50 MB L2 had turned over ~30 times and every m-tile re-read the state from HBM:
# 4 x 537 MB = 2.1 GB of fp32 states where 537 MB (268 MB in bf16) is needed. Adjacent, the 4
# run in one wave and the state comes from HBM once; CB is reused by the group's H/G x 4
# consecutive programs (512 at G=1). Stage 3's N/BLOCK_N = 2 tiles of a (chunk, head) share x
# (537 MB at T=32K: read once instead of twice), stage 2's NT^2 tiles of a (chunk, group) share
# C and B rows. A 1-D grid also lifts the 65535 limit of grid axes 1 and 2 off the chunk count.
# (`kernels.program_grid.unflatten2/3` split the flat program id in that order.)


@triton.jit
def _ssd_chunk_cumsum_kernel(
    # pointers
    dt, dt_bias, A, chunk_start, chunk_len, dt_out, dA_cs,
    # sizes
    H, dt_min, dt_max,
    # strides
    stride_dt_t, stride_dt_h,
    # meta
    CHUNK: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr,
):
    n_hb = tl.cdiv(H, BLOCK_H)
    i_hb, i_c = unflatten2(n_hb)
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o_l = tl.arange(0, CHUNK)
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    m_lh = (o_l[:, None] < n) & m_h[None, :]

    # int64 only in the scalar base; tile offsets stay int32 (a chunk spans < 2^31 bytes)
    p_dt = dt + bos * stride_dt_t + o_l[:, None] * stride_dt_t + o_h[None, :] * stride_dt_h
    b_dt = tl.load(p_dt, mask=m_lh, other=0.0).to(tl.float32)
    if HAS_BIAS:
        b_dt += tl.load(dt_bias + o_h, mask=m_h, other=0.0).to(tl.float32)[None, :]
    if SOFTPLUS:
        # log(1 + e^x) overflows its exp past ~88; past 20 it equals x in fp32 anyway
        b_dt = tl.where(b_dt <= 20.0, tl.log(1.0 + tl.exp(b_dt)), b_dt)
    if HAS_LIMIT:
        b_dt = tl.minimum(tl.maximum(b_dt, dt_min), dt_max)
    # padded rows: no input and decay 1, so the chunk's last cumsum entry is its total
    b_dt = tl.where(m_lh, b_dt, 0.0)
    b_A = tl.load(A + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_cs = tl.cumsum(b_dt * b_A[None, :], axis=0)

    o_out = o_h[None, :] * CHUNK + o_l[:, None]
    m_out = m_h[None, :] & (o_l[:, None] < CHUNK)
    tl.store(dt_out + i_c * H * CHUNK + o_out, b_dt, mask=m_out)
    tl.store(dA_cs + i_c * H * CHUNK + o_out, b_cs, mask=m_out)


@triton.jit
def _ssd_bmm_kernel(
    # pointers
    B, C, chunk_start, chunk_len, CB,
    # sizes
    G, N,
    # strides
    stride_b_t, stride_b_g, stride_b_n, stride_c_t, stride_c_g, stride_c_n,
    # meta
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """CB[c, g, i, j] = C_i . B_j for the lower-triangular (BLOCK_M x BLOCK_M) tiles of a chunk."""
    NT: tl.constexpr = CHUNK // BLOCK_M
    i_mn, i_g, i_c = unflatten3(NT * NT, G)
    i_m, i_n = i_mn // NT, i_mn % NT
    n = tl.load(chunk_len + i_c)
    if (i_n > i_m) | (i_m * BLOCK_M >= n):  # above the diagonal or past the chunk: never read
        return
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_M + tl.arange(0, BLOCK_M)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < n, o_n < n

    # int64 only in the scalar bases: 2-D int64 offsets cost 2 registers an element and spilled
    C_base = C + bos * stride_c_t + i_g * stride_c_g
    B_base = B + bos * stride_b_t + i_g * stride_b_g
    b_acc = tl.zeros([BLOCK_M, BLOCK_M], dtype=tl.float32)
    for k0 in range(0, N, BLOCK_K):
        m_k = (k0 + o_k) < N
        p_c = C_base + o_m[:, None] * stride_c_t + (k0 + o_k[None, :]) * stride_c_n
        p_b = B_base + o_n[None, :] * stride_b_t + (k0 + o_k[:, None]) * stride_b_n
        b_c = tl.load(p_c, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_b = tl.load(p_b, mask=m_k[:, None] & m_n[None, :], other=0.0)
        b_acc += dot(b_c, b_b, DOT_PRECISION)
    p_cb = CB + (i_c * G + i_g) * CHUNK * CHUNK + o_m[:, None] * CHUNK + o_n[None, :]
    tl.store(p_cb, b_acc)


@triton.jit
def _ssd_chunk_state_kernel(
    # pointers
    x, B, dt_out, dA_cs, chunk_start, chunk_len, chunk_states,
    # sizes
    H, P, N, HEADS_PER_GROUP,
    # strides
    stride_x_t, stride_x_h, stride_x_p, stride_b_t, stride_b_g, stride_b_n,
    # meta
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """chunk_states[c, h] = sum_j x_j^T (exp(dA_last - dA_j) dt'_j B_j): a (P x L) @ (L x N) product."""
    n_nt = tl.cdiv(N, BLOCK_N)
    i_pn, i_h, i_c = unflatten3(tl.cdiv(P, BLOCK_P) * n_nt, H)
    i_p, i_n = i_pn // n_nt, i_pn % n_nt
    i_g = i_h // HEADS_PER_GROUP
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_p, m_n = o_p < P, o_n < N
    p_cs = dA_cs + (i_c * H + i_h) * CHUNK
    p_dt = dt_out + (i_c * H + i_h) * CHUNK
    b_cs_last = tl.load(p_cs + CHUNK - 1)  # pads carry the total forward

    x_base = x + bos * stride_x_t + i_h * stride_x_h
    B_base = B + bos * stride_b_t + i_g * stride_b_g
    b_acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, n, BLOCK_K):
        o_t = k0 + o_k
        m_t = o_t < n
        p_x = x_base + o_t[None, :] * stride_x_t + o_p[:, None] * stride_x_p
        p_b = B_base + o_t[:, None] * stride_b_t + o_n[None, :] * stride_b_n
        b_x = tl.load(p_x, mask=m_p[:, None] & m_t[None, :], other=0.0)
        b_b = tl.load(p_b, mask=m_t[:, None] & m_n[None, :], other=0.0)
        b_scale = tl.exp(b_cs_last - tl.load(p_cs + o_t)) * tl.load(p_dt + o_t)  # pads: dt' = 0
        b_b = (b_b * b_scale[:, None]).to(b_x.dtype)
        b_acc += dot(b_x, b_b, DOT_PRECISION)
    p_st = chunk_states + (i_c * H + i_h) * P * N + o_p[:, None] * N + o_n[None, :]
    tl.store(p_st, b_acc, mask=m_p[:, None] & m_n[None, :])


@triton.jit
def _ssd_state_passing_kernel(
    # pointers
    chunk_states, dA_cs, seq_chunks, chunk_capture, initial_states, final_states, captured_states, state_slots,
    states_in,
    # sizes
    H, PN,
    # meta
    CHUNK: tl.constexpr, BLOCK: tl.constexpr, HAS_INIT: tl.constexpr, POOL: tl.constexpr,
):
    """Walks one sequence's chunks for one head and a BLOCK of its P*N state elements.

    Reads each chunk's own state (fp32), stores the state *entering* the chunk into states_in (what
    stage 5 needs, in x's dtype: stage 5 rounds it to that dtype for its dot anyway), and carries
    state = exp(dA_total) * state + chunk_state in fp32. With fp32 x, states_in is chunk_states
    itself (each element read, then overwritten, by this one program). A chunk cut at a capture
    offset has `chunk_capture >= 0`: the state after it is stored there as well (the capture).
    POOL: initial_states and final_states are one state pool, row `state_slots[s]` for sequence s
    (read first, written last by this same program: no other program touches those elements)."""
    i_b, i_h, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    o = i_b * BLOCK + tl.arange(0, BLOCK)
    m = o < PN
    i_row = i_s
    if POOL:
        i_row = tl.load(state_slots + i_s).to(tl.int64)
    if HAS_INIT:
        b_s = tl.load(initial_states + (i_row * H + i_h) * PN + o, mask=m, other=0.0)
    else:
        b_s = tl.zeros([BLOCK], dtype=tl.float32)
    c_lo = tl.load(seq_chunks + i_s)
    c_hi = tl.load(seq_chunks + i_s + 1)
    for i in range(0, c_hi - c_lo):
        c64 = (c_lo + i).to(tl.int64)
        b_new = tl.load(chunk_states + (c64 * H + i_h) * PN + o, mask=m, other=0.0)
        tl.store(states_in + (c64 * H + i_h) * PN + o, b_s.to(states_in.dtype.element_ty), mask=m)
        b_decay = tl.exp(tl.load(dA_cs + (c64 * H + i_h) * CHUNK + CHUNK - 1))
        b_s = b_decay * b_s + b_new
        i_k = tl.load(chunk_capture + c64).to(tl.int64)
        if i_k >= 0:
            tl.store(captured_states + (i_k * H + i_h) * PN + o, b_s, mask=m)
    tl.store(final_states + (i_row * H + i_h) * PN + o, b_s, mask=m)


@triton.jit
def _ssd_chunk_scan_kernel(
    # pointers
    x, C, D, CB, states_in, dt_out, dA_cs, chunk_start, chunk_len, y,
    # sizes
    H, P, N, G, HEADS_PER_GROUP,
    # strides
    stride_x_t, stride_x_h, stride_x_p, stride_c_t, stride_c_g, stride_c_n,
    # meta
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, HAS_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """y rows [i_m*BLOCK_M, +BLOCK_M) of one chunk and head, for a BLOCK_P slice of P."""
    n_pt = tl.cdiv(P, BLOCK_P)
    i_mp, i_h, i_c = unflatten3((CHUNK // BLOCK_M) * n_pt, H)
    i_m, i_p = i_mp // n_pt, i_mp % n_pt
    n = tl.load(chunk_len + i_c)
    if i_m * BLOCK_M >= n:  # a chunk shortened by a capture cut or a sequence end
        return
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    i_g = i_h // HEADS_PER_GROUP
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    o_n = tl.arange(0, BLOCK_N)
    m_m, m_p = o_m < n, o_p < P
    p_cs = dA_cs + (i_c * H + i_h) * CHUNK
    p_dt = dt_out + (i_c * H + i_h) * CHUNK
    b_cs_m = tl.load(p_cs + o_m)

    # from the state entering the chunk: (C_m @ state^T) * exp(dA_m)
    x_base = x + bos * stride_x_t + i_h * stride_x_h
    C_base = C + bos * stride_c_t + i_g * stride_c_g
    S_base = states_in + (i_c * H + i_h) * P * N
    CB_base = CB + (i_c * G + i_g) * CHUNK * CHUNK
    b_acc = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        m_n = (n0 + o_n) < N
        p_c = C_base + o_m[:, None] * stride_c_t + (n0 + o_n[None, :]) * stride_c_n
        p_s = S_base + o_p[None, :] * N + (n0 + o_n[:, None])
        b_c = tl.load(p_c, mask=m_m[:, None] & m_n[None, :], other=0.0)
        b_s = tl.load(p_s, mask=m_n[:, None] & m_p[None, :], other=0.0).to(b_c.dtype)
        b_acc += dot(b_c, b_s, DOT_PRECISION)
    b_acc *= tl.exp(b_cs_m)[:, None]

    # within the chunk, up to the diagonal block: (CB * decay * dt') @ x
    o_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, (i_m + 1) * BLOCK_M, BLOCK_K):
        o_t = k0 + o_k
        m_t = o_t < n
        p_cb = CB_base + o_m[:, None] * CHUNK + o_t[None, :]
        m_causal = (o_m[:, None] >= o_t[None, :]) & m_m[:, None] & m_t[None, :]
        b_cb = tl.load(p_cb, mask=m_causal, other=0.0)
        b_cs_k = tl.load(p_cs + o_t)
        b_dt_k = tl.load(p_dt + o_t)
        # exp of a masked (positive) difference would overflow: mask before exp
        b_decay = tl.exp(tl.where(m_causal, b_cs_m[:, None] - b_cs_k[None, :], -float("inf")))
        p_xk = x_base + o_t[:, None] * stride_x_t + o_p[None, :] * stride_x_p
        b_xk = tl.load(p_xk, mask=m_t[:, None] & m_p[None, :], other=0.0)
        b_w = (b_cb * b_decay * b_dt_k[None, :]).to(b_xk.dtype)
        b_acc += dot(b_w, b_xk, DOT_PRECISION)

    p_xm = x_base + o_m[:, None] * stride_x_t + o_p[None, :] * stride_x_p
    m_mp = m_m[:, None] & m_p[None, :]
    if HAS_D:
        b_xm = tl.load(p_xm, mask=m_mp, other=0.0).to(tl.float32)
        b_acc += tl.load(D + i_h).to(tl.float32) * b_xm
    p_y = y + (bos * H + i_h) * P + o_m[:, None] * (H * P) + o_p[None, :]
    tl.store(p_y, b_acc.to(y.dtype.element_ty), mask=m_mp)


# ---------------------------------------------------------------------------------------------
# tile configs: a per-device table (`kernels.ssd_configs`; the compile check builds its entries)
# ---------------------------------------------------------------------------------------------


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs are the test path: tf32 (10-bit mantissa) would miss the fp32 tolerance
    return "ieee" if dtype == torch.float32 else "tf32"


# ---------------------------------------------------------------------------------------------
# public function
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SSDScanPlan:
    """The host side of one scan's launches, built from Python ints: the chunk table and sizes.
    Its tables are views into a step's one uploaded buffer (`IntTables`)."""

    seqlens: list[int]
    offsets: list[list[int]]  # capture offsets per sequence (validated)
    chunk_size: int
    num_chunks: int
    num_captures: int
    chunk_start: Table
    chunk_len: Table
    chunk_capture: Table
    seq_chunks: Table


def _check_chunk_size(chunk_size) -> None:
    require(isinstance(chunk_size, int) and chunk_size >= 16 and (chunk_size & (chunk_size - 1)) == 0,
            "chunk_size", f"must be a power of 2 >= 16 (tl.dot tiles), got {chunk_size}")


def plan_ssd_scan(seqlens, capture_offsets, chunk_size: int, tables: IntTables) -> SSDScanPlan:
    """The chunk table of a scan over sequences of these host lengths, added to `tables` (uploaded
    later, once, with the rest of the step). Pass the plan as `ssd_scan(..., plan=)`."""
    seqlens = check_host_seqlens(seqlens)
    offsets = check_capture_offsets(capture_offsets, seqlens)
    _check_chunk_size(chunk_size)
    table = build_chunk_table(seqlens, offsets, chunk_size)
    return SSDScanPlan(
        seqlens, offsets, chunk_size, len(table.start), sum(len(o) for o in offsets),
        tables.add(table.start), tables.add(table.length), tables.add(table.capture), tables.add(table.seq_chunks))


def _empty(shape, dtype, device) -> torch.Tensor:
    """Every buffer of the launch (outputs and intermediates); tests swap in NaN-filled ones."""
    return torch.empty(shape, dtype=dtype, device=device)


def ssd_scan(
    x, dt, A, B, C, *, cu_seqlens, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    initial_states=None, capture_offsets=None, chunk_size: int = DEFAULT_CHUNK_SIZE, plan: SSDScanPlan | None = None,
    state_pool=None, state_slots=None,
) -> SSDScanOutput:
    """Varlen Mamba-2 SSD scan with in-launch state capture.

    x (T, H, P), dt (T, H), A (H,), B/C (T, G, N) with G | H, D/dt_bias (H,) or None,
    cu_seqlens (S+1,) int32, initial_states (S, H, P, N) fp32 or None (zeros),
    capture_offsets None or S lists of offsets (0 < o < len, strictly increasing).
    Returns SSDScanOutput(y (T, H, P) in x's dtype, final_states (S, H, P, N) fp32,
    captured_states (K, H, P, N) fp32: the state after tokens [0, o) of each listed offset).
    `chunk_size`: the internal chunk, a power of 2 >= 16. `plan`: from `plan_ssd_scan` for these
    lengths, offsets and chunk size (then cu_seqlens is not read and nothing is uploaded).
    `state_pool` (num_slots, H, P, N) fp32 contiguous with `state_slots` (S,) int32/int64: every
    sequence starts from `state_pool[state_slots[s]]` and its final state is written back there,
    in the launch (no gather or scatter around it; `initial_states` must then be None and the
    returned final_states is the pool itself). Slots are not read on the host: the caller checked
    them (distinct, in range), unless the debug switch is on.
    """
    if plan is None:
        seqlens, offsets, limit = check_ssd_scan_args(
            x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets)
        _check_chunk_size(chunk_size)
        tables = IntTables()
        plan = plan_ssd_scan(seqlens, offsets, chunk_size, tables)
        tables.upload(x.device)  # one host-to-device copy for the whole table
    else:
        seqlens, offsets, limit = check_ssd_scan_args(
            x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets, plan.seqlens)
        require(offsets == plan.offsets and chunk_size == plan.chunk_size, "plan",
                f"made for capture offsets {plan.offsets} and chunk {plan.chunk_size}, "
                f"called with {offsets} and {chunk_size}")
    if state_pool is not None:
        check_state_pool(state_pool, state_slots, (x.shape[1], x.shape[2], B.shape[2]), (torch.float32,), x.device,
                         len(seqlens), initial_states)
    else:
        require(state_slots is None, "state_slots", "given without state_pool")
    T, H, P = x.shape
    G, N = B.shape[1:]
    S = len(seqlens)
    dev = x.device
    out = _empty((T, H, P), x.dtype, dev)
    nc, K = plan.num_chunks, plan.num_captures
    final = _empty((S, H, P, N), torch.float32, dev) if state_pool is None else state_pool
    captured = _empty((K, H, P, N), torch.float32, dev)
    if nc == 0:  # every sequence empty: final = initial
        if state_pool is None:
            final.copy_(initial_states if initial_states is not None else torch.zeros_like(final))
        return SSDScanOutput(out, final, captured)
    chunk_start, chunk_len, chunk_capture = plan.chunk_start.t, plan.chunk_len.t, plan.chunk_capture.t
    seq_chunks = plan.seq_chunks.t

    L = chunk_size
    cfg = tile_config(L, H, P, N, x.dtype, device_capability(dev))
    prec = _dot_precision(x.dtype)
    dt_out = _empty((nc, H, L), torch.float32, dev)
    dA_cs = _empty((nc, H, L), torch.float32, dev)
    CB = _empty((nc, G, L, L), torch.float32, dev)  # tiles above the diagonal are never written nor read
    chunk_states = _empty((nc, H, P, N), torch.float32, dev)
    states_in = chunk_states if x.dtype == torch.float32 else _empty((nc, H, P, N), x.dtype, dev)
    has_limit = tuple(limit) != NO_LIMIT
    init = initial_states.contiguous() if initial_states is not None else None

    _ssd_chunk_cumsum_kernel[(nc * triton.cdiv(H, cfg["cumsum_block_h"]),)](
        dt, dt_bias, A, chunk_start, chunk_len, dt_out, dA_cs,
        H, limit[0], limit[1],
        dt.stride(0), dt.stride(1),
        CHUNK=L, BLOCK_H=cfg["cumsum_block_h"],
        HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus), HAS_LIMIT=has_limit, num_stages=cfg["stages"],
    )
    bm = cfg["bmm_block_m"]
    _ssd_bmm_kernel[(nc * G * (L // bm) ** 2,)](
        B, C, chunk_start, chunk_len, CB,
        G, N,
        *B.stride(), *C.stride(),
        CHUNK=L, BLOCK_M=bm, BLOCK_K=cfg["bmm_block_k"], DOT_PRECISION=prec, num_warps=cfg["bmm_warps"],
        num_stages=cfg["stages"],
    )
    bp, bn = cfg["state_block_p"], cfg["state_block_n"]
    _ssd_chunk_state_kernel[(nc * H * triton.cdiv(P, bp) * triton.cdiv(N, bn),)](
        x, B, dt_out, dA_cs, chunk_start, chunk_len, chunk_states,
        H, P, N, H // G,
        *x.stride(), *B.stride(),
        CHUNK=L, BLOCK_P=bp, BLOCK_N=bn, BLOCK_K=cfg["state_block_k"], DOT_PRECISION=prec,
        num_warps=cfg["state_warps"], num_stages=cfg["stages"],
    )
    blk = cfg["pass_block"]
    _ssd_state_passing_kernel[(triton.cdiv(P * N, blk), H, S)](
        chunk_states, dA_cs, seq_chunks, chunk_capture, state_pool if state_pool is not None else init, final,
        captured, state_slots, states_in, H, P * N,
        CHUNK=L, BLOCK=blk, HAS_INIT=init is not None or state_pool is not None, POOL=state_pool is not None,
        num_stages=cfg["stages"],
    )
    sm, sp = cfg["scan_block_m"], cfg["scan_block_p"]
    _ssd_chunk_scan_kernel[(nc * H * (L // sm) * triton.cdiv(P, sp),)](
        x, C, D, CB, states_in, dt_out, dA_cs, chunk_start, chunk_len, out,
        H, P, N, G, H // G,
        *x.stride(), *C.stride(),
        CHUNK=L, BLOCK_M=sm, BLOCK_P=sp, BLOCK_N=cfg["scan_block_n"], BLOCK_K=cfg["scan_block_k"],
        HAS_D=D is not None, DOT_PRECISION=prec, num_warps=cfg["scan_warps"], num_stages=cfg["scan_stages"],
    )
    return SSDScanOutput(out, final, captured)


# ---------------------------------------------------------------------------------------------
# compile check registration
# ---------------------------------------------------------------------------------------------

_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _signature(fn, types: dict[str, str], constexprs: dict) -> dict[str, str]:
    """Every argument of `fn`: constexprs as such, the rest from `types` (default i32)."""
    return {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}


COMPILE_TARGETS = ((9, 0), (8, 0))  # the capabilities whose table entries the compile check builds


def compile_variants() -> list[KernelVariant]:
    """The model's shapes: P=64, N in {64, 128}, chunk 256, fp32/bf16/fp16 inputs, each built for
    sm_90 and sm_80 with that device's entry of the tile table (`kernels.ssd_configs`, as the
    launches pick it); last-dim strides are 1 as the JIT specializes them, pointers and sizes
    16-divisible as it sees them at Bamba-9B's shapes."""
    variants = []
    seen = set()
    for capability, dtype, N in itertools.product(COMPILE_TARGETS, (torch.bfloat16, torch.float16, torch.float32),
                                                  (64, 128)):
        cc = capability[0] * 10 + capability[1]
        td = _TRITON_DTYPE[dtype]
        prec = _dot_precision(dtype)
        H, P, L = 128, 64, DEFAULT_CHUNK_SIZE
        cfg = tile_config(L, H, P, N, dtype, capability)
        specs = [
            ("chunk_cumsum", _ssd_chunk_cumsum_kernel,
             {"dt": f"*{td}", "dt_bias": "*fp32", "A": "*fp32", "chunk_start": "*i32", "chunk_len": "*i32",
              "dt_out": "*fp32", "dA_cs": "*fp32", "dt_min": "fp32", "dt_max": "fp32"},
             dict(stride_dt_h=1, CHUNK=L, BLOCK_H=cfg["cumsum_block_h"], HAS_BIAS=True, SOFTPLUS=True,
                  HAS_LIMIT=True), 4, cfg["stages"]),
            ("bmm", _ssd_bmm_kernel,
             {"B": f"*{td}", "C": f"*{td}", "chunk_start": "*i32", "chunk_len": "*i32", "CB": "*fp32"},
             dict(stride_b_n=1, stride_c_n=1, CHUNK=L, BLOCK_M=cfg["bmm_block_m"], BLOCK_K=cfg["bmm_block_k"],
                  DOT_PRECISION=prec), cfg["bmm_warps"], cfg["stages"]),
            ("chunk_state", _ssd_chunk_state_kernel,
             {"x": f"*{td}", "B": f"*{td}", "dt_out": "*fp32", "dA_cs": "*fp32", "chunk_start": "*i32",
              "chunk_len": "*i32", "chunk_states": "*fp32"},
             dict(stride_x_p=1, stride_b_n=1, CHUNK=L, BLOCK_P=cfg["state_block_p"],
                  BLOCK_N=cfg["state_block_n"], BLOCK_K=cfg["state_block_k"], DOT_PRECISION=prec),
             cfg["state_warps"], cfg["stages"]),
            ("state_passing", _ssd_state_passing_kernel,
             {"chunk_states": "*fp32", "dA_cs": "*fp32", "seq_chunks": "*i32", "chunk_capture": "*i32",
              "initial_states": "*fp32", "final_states": "*fp32", "captured_states": "*fp32",
              "state_slots": "*i32", "states_in": f"*{td}"},
             dict(CHUNK=L, BLOCK=cfg["pass_block"], HAS_INIT=True, POOL=True), 4, cfg["stages"]),
            ("chunk_scan", _ssd_chunk_scan_kernel,
             {"x": f"*{td}", "C": f"*{td}", "D": "*fp32", "CB": "*fp32", "states_in": f"*{td}", "dt_out": "*fp32",
              "dA_cs": "*fp32", "chunk_start": "*i32", "chunk_len": "*i32", "y": f"*{td}"},
             dict(stride_x_p=1, stride_c_n=1, CHUNK=L, BLOCK_M=cfg["scan_block_m"], BLOCK_P=cfg["scan_block_p"],
                  BLOCK_N=cfg["scan_block_n"], BLOCK_K=cfg["scan_block_k"], HAS_D=True, DOT_PRECISION=prec),
             cfg["scan_warps"], cfg["scan_stages"]),
        ]
        for stage, fn, types, consts, warps, stages in specs:
            key = (cc, stage, td, tuple(sorted(consts.items())), warps, stages)
            if key in seen:
                continue
            seen.add(key)
            name = f"ssm/ssd_scan/{stage}/{td}/L{L}"  # N is a runtime loop: one build serves 64 and 128
            sig = _signature(fn, types, consts)
            # stride_dt_t / stride_x_t etc.: projection views of Bamba-9B (16768, 8448 wide) are
            # multiples of 16; so are H=128, P=64, N=128 and P*N
            variants.append(KernelVariant(name, fn, sig, consts, num_warps=warps, num_stages=stages,
                                          divisible_by_16=aligned_args(fn, sig, consts), targets=(cc,)))
    return variants
