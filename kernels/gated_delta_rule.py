"""Chunked gated delta rule forward (varlen, Qwen3-Next's Gated DeltaNet) emitting states at given
token offsets in the same launches.

Four kernels over *logical chunks* (the WY/UT form of the delta rule, as in flash-linear-attention's
`chunk_gated_delta_rule`: within a chunk the per-token rank-1 updates become matmuls):

    0. qk_prep    qn = scale * l2norm(q), kn = l2norm(k): contiguous (T, HK, K) copies in q's dtype
                  (the norm needs a whole key row; after it every kernel tiles K freely)
    1. chunk_wy   g_cs = cumsum(g) per chunk; A_ij = beta_i (k_i . k_j) exp(g_cs_i - g_cs_j) for i > j;
                  T = (I + A)^-1 by forward substitution; w = T (beta k exp(g_cs)), u = T (beta v)
    2. state      sequential over a sequence's chunks, per (value head, BLOCK_V columns of the state):
                  v_new = u - w S;  S = exp(g_cs_last) S + (k exp(g_cs_last - g_cs))^T v_new;
                  stores the state entering each chunk, v_new (over u), the captures and the final state
    3. output     o = (q exp(g_cs)) S_in + [(q k^T) exp(g_cs_i - g_cs_j)]_{i>=j} v_new

Math and argument contract: `kernels.contracts.gated_delta`. The 16-bit dots round qn/kn, T, w,
u, v_new and the entering states to q's dtype (as FLA's kernels do), accumulating in fp32.

How a capture is made: exactly as in `kernels.ssd_scan`. The host's chunk table
(`build_chunk_table`) starts chunks every `chunk_size` tokens from each sequence's start and cuts
a chunk at every capture offset; the WY form holds for any chunk length (the pads are masked:
beta = k = 0, g = 0), and stage 2 has the state after every chunk in registers anyway, so a
capture at offset o is one more (K, BLOCK_V) fp32 store into `captured_states[c]` in the same
launch. C captures add at most C chunks: at 32K tokens and chunk 64, 1 of 512 chunks each, plus
the capture's HV*K*V*4 bytes (2 MB at Qwen3-Next's HV=32, K=V=128).

Layouts: q/k (T, HK, K), v (T, HV, V), g/beta (T, HV), any strides (the model passes views of one
projection). Internals: qn/kn (T, HK, K); g_cs (nc, HV, L) fp32; w (nc, HV, L, K), u/v_new
(nc, HV, L, V) and the entering states (nc, HV, K, V) in q's dtype (fp32 on the fp32 test path).
Captured and final states are fp32. Called alone, the launcher reads `cu_seqlens` on the host
(one sync) to build the chunk table; a model step passes a plan (`plan_gated_delta_rule`) instead.
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from kernels.checks import require
from kernels.contracts.gated_delta import L2NORM_EPS, GatedDeltaOutput, check_gated_delta_args
from kernels.contracts.packed import IntTables
from kernels.contracts.varlen import check_state_pool
from kernels.program_grid import dot, unflatten2, unflatten3
from kernels.ssd_scan import SSDScanPlan, plan_ssd_scan
from kernels.variants import KernelVariant, aligned_args

_EPS = tl.constexpr(L2NORM_EPS)


__all__ = ["gated_delta_rule", "GatedDeltaOutput", "DEFAULT_CHUNK_SIZE", "default_chunk_size", "plan_gated_delta_rule"]

DEFAULT_CHUNK_SIZE = 64  # FLA's and HF's chunk (torch_chunk_gated_delta_rule), for 16-bit inputs
# fp32 inputs (the test path: FMA dots, which keep a whole reduction row a thread): at chunk 64 the
# state kernel spilled 552-624 B on sm_90 (Triton 3.9) and 304-328 B on both targets (3.6) with
# every tile, warp, stage and 3xTF32 setting tried; at 32: 0 (142-184 registers).
FP32_CHUNK_SIZE = 32
MAX_HEAD_DIM = 256  # K and V: Qwen3-Next's are 128

# The plan is the SSD scan's: the same chunk table (chunk starts, lengths, capture slots, per-sequence
# chunk ranges) over the same lengths and offsets.
GatedDeltaPlan = SSDScanPlan


def default_chunk_size(dtype: torch.dtype) -> int:
    """The internal chunk a launch without `chunk_size` (or a caller planning one) uses for inputs of `dtype`."""
    return FP32_CHUNK_SIZE if dtype == torch.float32 else DEFAULT_CHUNK_SIZE


def plan_gated_delta_rule(seqlens, capture_offsets, chunk_size: int, tables: IntTables) -> GatedDeltaPlan:
    """The chunk table of a scan over these host lengths, added to `tables` (uploaded later, once,
    with the rest of the step). Pass it as `gated_delta_rule(..., plan=)`."""
    return plan_ssd_scan(seqlens, capture_offsets, chunk_size, tables)


@triton.jit
def _gdn_qk_prep_kernel(
    # pointers
    q, k, q_out, k_out,
    # sizes
    T, HK, K, scale,
    # strides
    stride_q_t, stride_q_h, stride_q_d, stride_k_t, stride_k_h, stride_k_d,
    # meta
    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, L2NORM: tl.constexpr,
):
    """q_out = scale * l2norm(q), k_out = l2norm(k), contiguous (T, HK, K) in q's dtype: every later
    kernel then tiles K freely (the norm needs a whole row) and reads unit strides."""
    i_h, i_tb = unflatten2(HK)
    o_t = i_tb * BLOCK_T + tl.arange(0, BLOCK_T)
    o_k = tl.arange(0, BLOCK_K)
    m = (o_t[:, None] < T) & (o_k[None, :] < K)
    o_out = (o_t[:, None] * HK + i_h) * K + o_k[None, :]
    b_q = tl.load(q + o_t[:, None] * stride_q_t + i_h * stride_q_h + o_k[None, :] * stride_q_d, mask=m,
                  other=0.0).to(tl.float32)
    b_k = tl.load(k + o_t[:, None] * stride_k_t + i_h * stride_k_h + o_k[None, :] * stride_k_d, mask=m,
                  other=0.0).to(tl.float32)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=1) + _EPS)[:, None]
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + _EPS)[:, None]
    tl.store(q_out + o_out, (b_q * scale).to(q_out.dtype.element_ty), mask=m)
    tl.store(k_out + o_out, b_k.to(k_out.dtype.element_ty), mask=m)


@triton.jit
def _load_chunk_rows(base, k0, n, HK, K, CHUNK: tl.constexpr, BLOCK_K: tl.constexpr):
    """Columns [k0, k0 + BLOCK_K) of a chunk's n rows of a contiguous (T, HK, K) buffer (pads 0)."""
    o_t = tl.arange(0, CHUNK)
    o_k = k0 + tl.arange(0, BLOCK_K)
    m = (o_t[:, None] < n) & (o_k[None, :] < K)
    return tl.load(base + o_t[:, None] * (HK * K) + o_k[None, :], mask=m, other=0.0)


@triton.jit
def _gdn_chunk_wy_kernel(
    # pointers
    kn, v, g, beta, chunk_start, chunk_len, g_cs, w, u,
    # sizes
    HK, HV, K, V, HEADS_PER_KEY,
    # strides
    stride_v_t, stride_v_h, stride_v_d, stride_g_t, stride_g_h, stride_beta_t, stride_beta_h,
    # meta
    CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """g_cs, w and u of one (chunk, value head); every row of w and u is written (pads: 0)."""
    i_h, i_c = unflatten2(HV)
    i_kh = i_h // HEADS_PER_KEY
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o_t = tl.arange(0, CHUNK)
    m_t = o_t < n
    m_rows = o_t[:, None] < CHUNK
    b_g = tl.load(g + bos * stride_g_t + o_t * stride_g_t + i_h * stride_g_h, mask=m_t, other=0.0).to(tl.float32)
    b_gcs = tl.cumsum(b_g, axis=0)  # pads add 0: the last entry is the chunk's total
    tl.store(g_cs + (i_c * HV + i_h) * CHUNK + o_t, b_gcs)
    b_beta = tl.load(beta + bos * stride_beta_t + o_t * stride_beta_t + i_h * stride_beta_h,
                     mask=m_t, other=0.0).to(tl.float32)
    dt = kn.dtype.element_ty
    k_base = kn + (bos * HK + i_kh) * K

    b_A = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b_k = _load_chunk_rows(k_base, k0, n, HK, K, CHUNK, BLOCK_K)
        b_A += dot((b_k * b_beta[:, None]).to(dt), tl.trans(b_k), DOT_PRECISION)
    strict = o_t[:, None] > o_t[None, :]
    # g <= 0, so the kept differences are <= 0; masking before exp keeps the others from overflowing
    b_A = b_A * tl.exp(tl.where(strict, b_gcs[:, None] - b_gcs[None, :], -float("inf")))

    # T = (I + A)^-1, A strictly lower: row i of T's strict part is -A_i - sum_{j<i} A_ij T_j.
    # b_T starts as -A; at step i its rows < i are final and row i still holds -A_i (rows 0, 1: -A).
    b_T = -b_A
    for i in range(2, n):
        is_i = o_t[:, None] == i
        b_row = tl.sum(tl.where(is_i, b_T, 0.0), axis=0)
        b_row += tl.sum(b_row[:, None] * b_T, axis=0)
        b_T = tl.where(is_i, b_row[None, :], b_T)
    b_T = (b_T + tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)).to(dt)

    b_wscale = b_beta * tl.exp(b_gcs)
    o_k = tl.arange(0, BLOCK_K)
    w_base = w + (i_c * HV + i_h) * CHUNK * K
    for k0 in range(0, K, BLOCK_K):
        b_k = _load_chunk_rows(k_base, k0, n, HK, K, CHUNK, BLOCK_K)
        b_w = dot(b_T, (b_k * b_wscale[:, None]).to(dt), DOT_PRECISION)
        tl.store(w_base + o_t[:, None] * K + (k0 + o_k[None, :]), b_w.to(w.dtype.element_ty),
                 mask=m_rows & ((k0 + o_k[None, :]) < K))

    o_v = tl.arange(0, BLOCK_V)
    v_base = v + bos * stride_v_t + i_h * stride_v_h
    u_base = u + (i_c * HV + i_h) * CHUNK * V
    for v0 in range(0, V, BLOCK_V):
        m_v = (v0 + o_v) < V
        p_v = v_base + o_t[:, None] * stride_v_t + (v0 + o_v[None, :]) * stride_v_d
        b_v = tl.load(p_v, mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_u = dot(b_T, (b_v * b_beta[:, None]).to(dt), DOT_PRECISION)
        tl.store(u_base + o_t[:, None] * V + (v0 + o_v[None, :]), b_u.to(u.dtype.element_ty),
                 mask=m_rows & m_v[None, :])  # every row: pads hold 0


@triton.jit
def _state_slice(states, offset, k0, o_ks, o_v, K, V, BLOCK_KS: tl.constexpr, BLOCK_V: tl.constexpr,
                 HAS: tl.constexpr):
    """Rows [k0, k0 + BLOCK_KS) of BLOCK_V columns of the (K, V) state at `states + offset`, as
    fp32 (zeros if not HAS: then `states` is None)."""
    if HAS:
        m = ((k0 + o_ks[:, None]) < K) & (o_v[None, :] < V)
        return tl.load(states + offset + (k0 + o_ks[:, None]) * V + o_v[None, :], mask=m, other=0.0).to(tl.float32)
    else:
        return tl.zeros([BLOCK_KS, BLOCK_V], dtype=tl.float32)


@triton.jit
def _store_slice(base, b, k0, o_ks, o_v, K, V):
    m = ((k0 + o_ks[:, None]) < K) & (o_v[None, :] < V)
    tl.store(base + (k0 + o_ks[:, None]) * V + o_v[None, :], b.to(base.dtype.element_ty), mask=m)


@triton.jit
def _w_times_slice(w_base, b_h, k0, o_t, o_ks, K, DOT_PRECISION: tl.constexpr):
    """w[:, k0:k0+BLOCK_KS] @ S[k0:k0+BLOCK_KS]: one slice's share of w S."""
    m = (o_t[:, None] >= 0) & ((k0 + o_ks[None, :]) < K)
    b_w = tl.load(w_base + o_t[:, None] * K + (k0 + o_ks[None, :]), mask=m, other=0.0)
    return dot(b_w, b_h.to(b_w.dtype), DOT_PRECISION)


@triton.jit
def _update_slice(b_h, k_base, k0, n, HK, K, b_kdecay, b_chunk_decay, b_vn, CHUNK: tl.constexpr,
                  BLOCK_KS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """S[k0:k0+BLOCK_KS] after the chunk: exp(g_last) S + (k exp(g_last - g_cs))^T v_new (pads: k = 0)."""
    b_k = _load_chunk_rows(k_base, k0, n, HK, K, CHUNK, BLOCK_KS)
    b_kd = (b_k * b_kdecay[:, None]).to(b_k.dtype)
    return b_h * b_chunk_decay + dot(tl.trans(b_kd), b_vn, DOT_PRECISION)


@triton.jit
def _gdn_state_kernel(
    # pointers
    kn, w, u, g_cs, chunk_start, chunk_len, seq_chunks, chunk_capture, initial_states, final_states,
    captured_states, state_slots, states_in,
    # sizes
    HK, HV, K, V, HEADS_PER_KEY,
    # meta
    CHUNK: tl.constexpr, BLOCK_KS: tl.constexpr, NK: tl.constexpr, BLOCK_V: tl.constexpr,
    HAS_INIT: tl.constexpr, POOL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Walks one sequence's chunks for one value head and BLOCK_V columns of its (K, V) state.

    v_new = u - w S sums over the whole K, so the program holds all K rows of its columns, as
    NK <= 4 register slices of BLOCK_KS rows (b_h0 .. b_h3; one (K, BLOCK_V) tile spilled: the dot
    operand layouts of a 128-long reduction). Stores the state entering each chunk (stage 3 reads
    it), v_new over u (each element read, then overwritten, by this one program), and after a chunk
    cut at a capture offset the state once more into `captured_states`. POOL: initial and final
    states are one pool, row `state_slots[s]` (read first, written last by this same program)."""
    i_v, i_h, i_s = tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)
    i_kh = i_h // HEADS_PER_KEY
    o_t = tl.arange(0, CHUNK)
    o_ks = tl.arange(0, BLOCK_KS)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_tv = (o_t[:, None] < CHUNK) & (o_v[None, :] < V)
    i_row = i_s
    if POOL:
        i_row = tl.load(state_slots + i_s).to(tl.int64)
    init_at = (i_row * HV + i_h) * K * V
    b_h0 = _state_slice(initial_states, init_at, 0, o_ks, o_v, K, V, BLOCK_KS, BLOCK_V, HAS_INIT)
    if NK > 1:
        b_h1 = _state_slice(initial_states, init_at, BLOCK_KS, o_ks, o_v, K, V, BLOCK_KS, BLOCK_V, HAS_INIT)
    if NK > 2:
        b_h2 = _state_slice(initial_states, init_at, 2 * BLOCK_KS, o_ks, o_v, K, V, BLOCK_KS, BLOCK_V, HAS_INIT)
    if NK > 3:
        b_h3 = _state_slice(initial_states, init_at, 3 * BLOCK_KS, o_ks, o_v, K, V, BLOCK_KS, BLOCK_V, HAS_INIT)
    dt = kn.dtype.element_ty
    c_lo = tl.load(seq_chunks + i_s)
    c_hi = tl.load(seq_chunks + i_s + 1)
    for i in range(0, c_hi - c_lo):
        c64 = (c_lo + i).to(tl.int64)
        ch = c64 * HV + i_h
        s_base = states_in + ch * K * V
        w_base = w + ch * CHUNK * K
        p_u = u + ch * CHUNK * V + o_t[:, None] * V + o_v[None, :]
        b_vn = tl.load(p_u, mask=m_tv, other=0.0).to(tl.float32)
        _store_slice(s_base, b_h0, 0, o_ks, o_v, K, V)
        b_vn -= _w_times_slice(w_base, b_h0, 0, o_t, o_ks, K, DOT_PRECISION)
        if NK > 1:
            _store_slice(s_base, b_h1, BLOCK_KS, o_ks, o_v, K, V)
            b_vn -= _w_times_slice(w_base, b_h1, BLOCK_KS, o_t, o_ks, K, DOT_PRECISION)
        if NK > 2:
            _store_slice(s_base, b_h2, 2 * BLOCK_KS, o_ks, o_v, K, V)
            b_vn -= _w_times_slice(w_base, b_h2, 2 * BLOCK_KS, o_t, o_ks, K, DOT_PRECISION)
        if NK > 3:
            _store_slice(s_base, b_h3, 3 * BLOCK_KS, o_ks, o_v, K, V)
            b_vn -= _w_times_slice(w_base, b_h3, 3 * BLOCK_KS, o_t, o_ks, K, DOT_PRECISION)
        b_vn = b_vn.to(dt)
        tl.store(p_u, b_vn.to(u.dtype.element_ty), mask=m_tv)

        bos = tl.load(chunk_start + c64).to(tl.int64)
        n = tl.load(chunk_len + c64)
        b_glast = tl.load(g_cs + ch * CHUNK + CHUNK - 1)
        b_kdecay = tl.exp(b_glast - tl.load(g_cs + ch * CHUNK + o_t))
        b_cdecay = tl.exp(b_glast)
        k_base = kn + (bos * HK + i_kh) * K
        b_h0 = _update_slice(b_h0, k_base, 0, n, HK, K, b_kdecay, b_cdecay, b_vn, CHUNK, BLOCK_KS, DOT_PRECISION)
        if NK > 1:
            b_h1 = _update_slice(b_h1, k_base, BLOCK_KS, n, HK, K, b_kdecay, b_cdecay, b_vn, CHUNK, BLOCK_KS,
                                 DOT_PRECISION)
        if NK > 2:
            b_h2 = _update_slice(b_h2, k_base, 2 * BLOCK_KS, n, HK, K, b_kdecay, b_cdecay, b_vn, CHUNK, BLOCK_KS,
                                 DOT_PRECISION)
        if NK > 3:
            b_h3 = _update_slice(b_h3, k_base, 3 * BLOCK_KS, n, HK, K, b_kdecay, b_cdecay, b_vn, CHUNK, BLOCK_KS,
                                 DOT_PRECISION)
        i_cap = tl.load(chunk_capture + c64).to(tl.int64)
        if i_cap >= 0:
            cap_base = captured_states + (i_cap * HV + i_h) * K * V
            _store_slice(cap_base, b_h0, 0, o_ks, o_v, K, V)
            if NK > 1:
                _store_slice(cap_base, b_h1, BLOCK_KS, o_ks, o_v, K, V)
            if NK > 2:
                _store_slice(cap_base, b_h2, 2 * BLOCK_KS, o_ks, o_v, K, V)
            if NK > 3:
                _store_slice(cap_base, b_h3, 3 * BLOCK_KS, o_ks, o_v, K, V)
    final_base = final_states + (i_row * HV + i_h) * K * V
    _store_slice(final_base, b_h0, 0, o_ks, o_v, K, V)
    if NK > 1:
        _store_slice(final_base, b_h1, BLOCK_KS, o_ks, o_v, K, V)
    if NK > 2:
        _store_slice(final_base, b_h2, 2 * BLOCK_KS, o_ks, o_v, K, V)
    if NK > 3:
        _store_slice(final_base, b_h3, 3 * BLOCK_KS, o_ks, o_v, K, V)


@triton.jit
def _gdn_output_kernel(
    # pointers
    qn, kn, u, states_in, g_cs, chunk_start, chunk_len, o,
    # sizes
    HK, HV, K, V, HEADS_PER_KEY,
    # meta
    CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """o rows of one chunk and value head, for BLOCK_V of its V columns (u holds v_new by now)."""
    n_vt = tl.cdiv(V, BLOCK_V)
    i_v, i_h, i_c = unflatten3(n_vt, HV)
    i_kh = i_h // HEADS_PER_KEY
    bos = tl.load(chunk_start + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    ch = i_c * HV + i_h
    o_t = tl.arange(0, CHUNK)
    o_k = tl.arange(0, BLOCK_K)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_t, m_v = o_t < n, o_v < V
    dt = qn.dtype.element_ty
    b_gcs = tl.load(g_cs + ch * CHUNK + o_t)
    b_qscale = tl.exp(b_gcs)

    q_base = qn + (bos * HK + i_kh) * K
    k_base = kn + (bos * HK + i_kh) * K
    s_base = states_in + ch * K * V
    b_o = tl.zeros([CHUNK, BLOCK_V], dtype=tl.float32)
    b_qk = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b_q = _load_chunk_rows(q_base, k0, n, HK, K, CHUNK, BLOCK_K)
        b_k = _load_chunk_rows(k_base, k0, n, HK, K, CHUNK, BLOCK_K)
        m_kv = ((k0 + o_k[:, None]) < K) & m_v[None, :]
        b_s = tl.load(s_base + (k0 + o_k[:, None]) * V + o_v[None, :], mask=m_kv, other=0.0)
        b_o += dot((b_q * b_qscale[:, None]).to(dt), b_s.to(dt), DOT_PRECISION)
        b_qk += dot(b_q, tl.trans(b_k), DOT_PRECISION)
    causal = o_t[:, None] >= o_t[None, :]
    b_qk = b_qk * tl.exp(tl.where(causal, b_gcs[:, None] - b_gcs[None, :], -float("inf")))
    b_vn = tl.load(u + ch * CHUNK * V + o_t[:, None] * V + o_v[None, :], mask=(o_t[:, None] < CHUNK) & m_v[None, :],
                   other=0.0)
    b_o += dot(b_qk.to(dt), b_vn.to(dt), DOT_PRECISION)
    p_o = o + (bos * HV + i_h) * V + o_t[:, None] * (HV * V) + o_v[None, :]
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_t[:, None] & m_v[None, :])


# ---------------------------------------------------------------------------------------------
# tiles and public function
# ---------------------------------------------------------------------------------------------


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 inputs are the test path: tf32 (10-bit mantissa) would miss the fp32 tolerance
    return "ieee" if dtype == torch.float32 else "tf32"


# Tiles per input dtype: caps, clamped to K and V (tl.dot needs >= 16 a side). Chosen from
# compile-check builds (registers, spills) at K = V = 128 and the default chunks; not timed (no GPU
# at hand). 16-bit, registers chunk_wy / state / output, Triton 3.9: sm_90 127 / 192 / 152-164,
# sm_80 156 / 254 / 255, 0 spills (3.6 within 10). A first version that normalised q/k inside every
# kernel (whole fp32 key rows live) and held the state as one (K, BLOCK_V) tile spilled 168-500 B
# in state and output; the K slices alone took state 255 -> 192 registers on sm_90. fp32: "ieee"
# FMA dots with 16-wide K steps (at 32: 200-300 B of spills in chunk_wy), chunk 32.
_TILES = {
    "16bit": dict(prep_block_t=16, k_step=64, wy_block_v=64, state_k_slice=64, state_block_v=32, out_block_v=64,
                  warps=4, stages=2),
    "fp32": dict(prep_block_t=16, k_step=16, wy_block_v=16, state_k_slice=32, state_block_v=16, out_block_v=32,
                 warps=8, stages=2),
}


def _tiles(K: int, V: int, dtype: torch.dtype) -> dict:
    """The launch's tiles: the state kernel holds the whole K as nk <= 4 slices of state_k_slice
    rows, the other kernels step through K in k_step columns."""
    cap = _TILES["fp32" if dtype == torch.float32 else "16bit"]
    block_k = max(16, triton.next_power_of_2(K))
    v_pow2 = max(16, triton.next_power_of_2(V))
    k_slice = max(min(cap["state_k_slice"], block_k), block_k // 4)
    return dict(cap, block_k=block_k, k_step=min(cap["k_step"], block_k), wy_block_v=min(cap["wy_block_v"], v_pow2),
                state_k_slice=k_slice, state_nk=block_k // k_slice, state_block_v=min(cap["state_block_v"], v_pow2),
                out_block_v=min(cap["out_block_v"], v_pow2))


def _empty(shape, dtype, device) -> torch.Tensor:
    """Every buffer of the launch (outputs and intermediates); tests swap in NaN-filled ones."""
    return torch.empty(shape, dtype=dtype, device=device)


def gated_delta_rule(
    q, k, v, g, beta, *, cu_seqlens, initial_states=None, capture_offsets=None, scale=None, use_qk_l2norm=True,
    chunk_size: int | None = None, plan: GatedDeltaPlan | None = None, state_pool=None, state_slots=None,
) -> GatedDeltaOutput:
    """Varlen chunked gated delta rule with in-launch state capture.

    q/k (T, HK, K), v (T, HV, V) with HK | HV, g (T, HV) log decay (<= 0), beta (T, HV),
    cu_seqlens (S+1,) int32, initial_states (S, HV, K, V) fp32 or None (zeros),
    capture_offsets None or S lists of offsets (0 < o < len, strictly increasing), scale None (K^-0.5).
    Returns GatedDeltaOutput(o (T, HV, V) in v's dtype, final_states (S, HV, K, V) fp32,
    captured_states (C, HV, K, V) fp32: the state after tokens [0, o) of each listed offset).
    `chunk_size`: the internal chunk, a power of 2 >= 16; None: the plan's, else
    `default_chunk_size(q.dtype)` (64; fp32: 32, what the compile check builds).
    `plan`: from `plan_gated_delta_rule` for these lengths, offsets and chunk size (then
    cu_seqlens is not read and nothing is uploaded).
    `state_pool` (num_slots, HV, K, V) fp32 contiguous with `state_slots` (S,): sequence s starts from
    `state_pool[state_slots[s]]` and its final state is written back there in the launch
    (`initial_states` must be None; the returned final_states is the pool).
    """
    seqlens, offsets, scale = check_gated_delta_args(q, k, v, g, beta, cu_seqlens, initial_states, capture_offsets,
                                                     scale, plan.seqlens if plan is not None else None)
    if chunk_size is None:
        chunk_size = plan.chunk_size if plan is not None else default_chunk_size(q.dtype)
    require(isinstance(chunk_size, int) and chunk_size >= 16 and (chunk_size & (chunk_size - 1)) == 0,
            "chunk_size", f"must be a power of 2 >= 16 (tl.dot tiles), got {chunk_size}")
    require(q.shape[2] <= MAX_HEAD_DIM and v.shape[2] <= MAX_HEAD_DIM, "q",
            f"head dims up to {MAX_HEAD_DIM} (the state kernel's 4 register slices), "
            f"got K={q.shape[2]}, V={v.shape[2]}")
    if plan is None:
        tables = IntTables()
        plan = plan_gated_delta_rule(seqlens, offsets, chunk_size, tables)
        tables.upload(q.device)  # one host-to-device copy for the whole table
    else:
        require(offsets == plan.offsets and chunk_size == plan.chunk_size, "plan",
                f"made for capture offsets {plan.offsets} and chunk {plan.chunk_size}, "
                f"called with {offsets} and {chunk_size}")
    T, HK, K = q.shape
    HV, V = v.shape[1:]
    S = len(seqlens)
    dev = q.device
    if state_pool is not None:
        check_state_pool(state_pool, state_slots, (HV, K, V), (torch.float32,), dev, S, initial_states)
    else:
        require(state_slots is None, "state_slots", "given without state_pool")
    out = _empty((T, HV, V), v.dtype, dev)
    nc, C = plan.num_chunks, plan.num_captures
    final = _empty((S, HV, K, V), torch.float32, dev) if state_pool is None else state_pool
    captured = _empty((C, HV, K, V), torch.float32, dev)
    if nc == 0:  # every sequence empty: final = initial
        if state_pool is None:
            final.copy_(initial_states if initial_states is not None else torch.zeros_like(final))
        return GatedDeltaOutput(out, final, captured)

    L = chunk_size
    cfg = _tiles(K, V, q.dtype)
    prec = _dot_precision(q.dtype)
    qn = _empty((T, HK, K), q.dtype, dev)  # scale * l2norm(q), contiguous
    kn = _empty((T, HK, K), q.dtype, dev)
    g_cs = _empty((nc, HV, L), torch.float32, dev)
    w = _empty((nc, HV, L, K), q.dtype, dev)
    u = _empty((nc, HV, L, V), q.dtype, dev)  # v_new after stage 2
    states_in = _empty((nc, HV, K, V), q.dtype, dev)
    init = initial_states.contiguous() if initial_states is not None else None
    rep = HV // HK
    chunk_start, chunk_len = plan.chunk_start.t, plan.chunk_len.t
    warps, stages, kstep = cfg["warps"], cfg["stages"], cfg["k_step"]

    bt = cfg["prep_block_t"]
    _gdn_qk_prep_kernel[(triton.cdiv(T, bt) * HK,)](
        q, k, qn, kn, T, HK, K, scale, *q.stride(), *k.stride(),
        BLOCK_T=bt, BLOCK_K=cfg["block_k"], L2NORM=bool(use_qk_l2norm), num_warps=warps, num_stages=stages,
    )
    _gdn_chunk_wy_kernel[(nc * HV,)](
        kn, v, g, beta, chunk_start, chunk_len, g_cs, w, u,
        HK, HV, K, V, rep,
        *v.stride(), *g.stride(), *beta.stride(),
        CHUNK=L, BLOCK_K=kstep, BLOCK_V=cfg["wy_block_v"], DOT_PRECISION=prec, num_warps=warps, num_stages=stages,
    )
    bv = cfg["state_block_v"]
    _gdn_state_kernel[(triton.cdiv(V, bv), HV, S)](
        kn, w, u, g_cs, chunk_start, chunk_len, plan.seq_chunks.t, plan.chunk_capture.t,
        state_pool if state_pool is not None else init, final, captured, state_slots, states_in,
        HK, HV, K, V, rep,
        CHUNK=L, BLOCK_KS=cfg["state_k_slice"], NK=cfg["state_nk"], BLOCK_V=bv,
        HAS_INIT=init is not None or state_pool is not None, POOL=state_pool is not None, DOT_PRECISION=prec,
        num_warps=warps, num_stages=stages,
    )
    bo = cfg["out_block_v"]
    _gdn_output_kernel[(nc * HV * triton.cdiv(V, bo),)](
        qn, kn, u, states_in, g_cs, chunk_start, chunk_len, out,
        HK, HV, K, V, rep,
        CHUNK=L, BLOCK_K=kstep, BLOCK_V=bo, DOT_PRECISION=prec, num_warps=warps, num_stages=stages,
    )
    return GatedDeltaOutput(out, final, captured)


# ---------------------------------------------------------------------------------------------
# compile check registration
# ---------------------------------------------------------------------------------------------

_TRITON_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
COMPILE_TARGETS = ((9, 0), (8, 0))


def _signature(fn, types: dict[str, str], constexprs: dict) -> dict[str, str]:
    return {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}


def _aligned(fn, sig, consts) -> tuple[str, ...]:
    """`aligned_args` plus the head counts and dims, multiples of 16 at Qwen3-Next's shapes as the JIT
    sees them (K = V = 128, HK = 16, HV = 32)."""
    sizes = tuple(a for a in ("HK", "HV", "K", "V") if a in fn.arg_names)
    return aligned_args(fn, sig, consts) + sizes


def compile_variants() -> list[KernelVariant]:
    """Qwen3-Next's shapes: K = V = 128, the default chunk (64; fp32: 32), fp32/bf16/fp16 inputs,
    g and beta fp32 (the model computes them in fp32), each built for sm_90 and sm_80; last-dim
    strides 1 as the JIT specializes them, pointers and sizes 16-divisible (HV = 32, HK = 16)."""
    variants = []
    K = V = 128
    for capability, dtype in itertools.product(COMPILE_TARGETS, (torch.bfloat16, torch.float16, torch.float32)):
        cc = capability[0] * 10 + capability[1]
        L = default_chunk_size(dtype)
        td = _TRITON_DTYPE[dtype]
        prec = _dot_precision(dtype)
        cfg = _tiles(K, V, dtype)
        specs = [
            ("qk_prep", _gdn_qk_prep_kernel, {"q": f"*{td}", "k": f"*{td}", "q_out": f"*{td}", "k_out": f"*{td}",
                                              "scale": "fp32"},
             dict(stride_q_d=1, stride_k_d=1, BLOCK_T=cfg["prep_block_t"], BLOCK_K=cfg["block_k"], L2NORM=True)),
            ("chunk_wy", _gdn_chunk_wy_kernel,
             {"kn": f"*{td}", "v": f"*{td}", "g": "*fp32", "beta": "*fp32", "chunk_start": "*i32",
              "chunk_len": "*i32", "g_cs": "*fp32", "w": f"*{td}", "u": f"*{td}"},
             dict(stride_v_d=1, CHUNK=L, BLOCK_K=cfg["k_step"], BLOCK_V=cfg["wy_block_v"], DOT_PRECISION=prec)),
            ("state", _gdn_state_kernel,
             {"kn": f"*{td}", "w": f"*{td}", "u": f"*{td}", "g_cs": "*fp32", "chunk_start": "*i32",
              "chunk_len": "*i32", "seq_chunks": "*i32", "chunk_capture": "*i32", "initial_states": "*fp32",
              "final_states": "*fp32", "captured_states": "*fp32", "state_slots": "*i32", "states_in": f"*{td}"},
             dict(CHUNK=L, BLOCK_KS=cfg["state_k_slice"], NK=cfg["state_nk"], BLOCK_V=cfg["state_block_v"],
                  HAS_INIT=True, POOL=True,
                  DOT_PRECISION=prec)),
            ("output", _gdn_output_kernel,
             {"qn": f"*{td}", "kn": f"*{td}", "u": f"*{td}", "states_in": f"*{td}", "g_cs": "*fp32",
              "chunk_start": "*i32", "chunk_len": "*i32", "o": f"*{td}"},
             dict(CHUNK=L, BLOCK_K=cfg["k_step"], BLOCK_V=cfg["out_block_v"], DOT_PRECISION=prec)),
        ]
        for stage, fn, types, consts in specs:
            sig = _signature(fn, types, consts)
            variants.append(KernelVariant(
                f"gated_delta/{stage}/{td}/L{L}/k{K}v{V}", fn, sig, consts, num_warps=cfg["warps"],
                num_stages=cfg["stages"], divisible_by_16=_aligned(fn, sig, consts), targets=(cc,)))
    return variants
