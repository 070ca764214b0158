"""Mamba-2 SSD references: a token-by-token oracle, a chunked PyTorch scan, and a decode step.

Math (Mamba-2 as in HF transformers' Bamba/Mamba2 mixer), per head h in group g = h // (H // G):

    dt'_t    = clamp(softplus(dt_t + dt_bias_h))           (softplus and clamp optional)
    state_t  = exp(dt'_t * A_h) * state_{t-1} + dt'_t * x_t (outer) B_t      state: (P, N), fp32
    y_t      = state_t . C_t + D_h * x_t

Sequences are packed along tokens with `cu_seqlens` (S+1,). `capture_offsets[s]` lists token
offsets o (0 < o < len_s, strictly increasing) at which the state after tokens [0, o) of
sequence s is returned; captures are packed sequence by sequence, offsets ascending.

* `ssd_scan_sequential` is the oracle: a Python loop over tokens, fp32, nothing clever.
* `ssd_scan_chunked` is the CPU work horse (the model's `torch` backend): the SSD matmul form
  over *logical chunks* that never span a sequence boundary and start every `chunk_size` tokens
  from their sequence's start. Chunks are processed in groups sized so that the
  (chunks, H, L, L) decay tensor stays near 16M elements (64 MB), which bounds memory for any T.
  A capture at offset o is made from the state entering the chunk that holds token o-1: with r
  tokens of that chunk consumed, state_o = exp(dA_cs[r-1]) state_in + sum_{j<r}
  exp(dA_cs[r-1] - dA_cs[j]) dt'_j x_j (outer) B_j, one (N x r) @ (r x H*P) product, at most a
  chunk-state's work and no L x L term (on a chunk boundary it is the state after the chunk,
  free). Captures do not change the chunking, so y and the final states are bit-identical with
  and without them. (A padded CPU chunk costs its full L x L work even when a cut leaves it
  with a few tokens: cutting measured +18% at T=1024, H=32; this measured +1.5%, best of 15.)
* `ssd_decode_step_ref`: one token per sequence, states updated in place through `slot_idx`.

The shared argument checks (`check_ssd_scan_args`) and logical-chunk table (`build_chunk_table`)
live here so the Triton driver validates exactly what the references do.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NO_LIMIT = (0.0, float("inf"))


class SSDScanOutput(NamedTuple):
    y: torch.Tensor  # (T, H, P), x's dtype
    final_states: torch.Tensor  # (S, H, P, N) fp32
    captured_states: torch.Tensor  # (K, H, P, N) fp32, packed by sequence then offset


# ---------------------------------------------------------------------------------------------
# argument checks shared with the Triton kernels
# ---------------------------------------------------------------------------------------------


def _fail(name: str, what: str) -> None:
    raise ValueError(f"{name}: {what}")


def _check_tensor(name, t, shape, dtypes=FLOAT_DTYPES, device=None):
    if not isinstance(t, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(want is not None and got != want for got, want in zip(t.shape, shape)):
        want = tuple("*" if s is None else s for s in shape)
        _fail(name, f"expected shape {want}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        _fail(name, f"dtype must be one of {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        _fail(name, f"must be on {device}, got {t.device}")


def check_seqlens(cu_seqlens, total_tokens: int, device) -> list[int]:
    """Validates `cu_seqlens` (S+1,) int32/int64, 0 .. T, non-decreasing; returns the lengths."""
    _check_tensor("cu_seqlens", cu_seqlens, (None,), (torch.int32, torch.int64), device)
    if cu_seqlens.numel() < 2:
        _fail("cu_seqlens", "needs at least 2 entries (S+1 with S >= 1)")
    cu = cu_seqlens.tolist()  # one host sync: the chunk table is built on the host anyway
    if cu[0] != 0 or cu[-1] != total_tokens:
        _fail("cu_seqlens", f"must start at 0 and end at T={total_tokens}, got {cu[0]} .. {cu[-1]}")
    lens = [b - a for a, b in zip(cu[:-1], cu[1:])]
    if min(lens) < 0:
        _fail("cu_seqlens", "must be non-decreasing")
    return lens


def check_capture_offsets(capture_offsets, seqlens: Sequence[int]) -> list[list[int]]:
    """Validates offsets: S lists of ints, strictly increasing, each 0 < o < len."""
    if capture_offsets is None:
        return [[] for _ in seqlens]
    if not isinstance(capture_offsets, (list, tuple)) or len(capture_offsets) != len(seqlens):
        _fail("capture_offsets", f"expected a list of S={len(seqlens)} lists of ints")
    out = []
    for s, (offs, n) in enumerate(zip(capture_offsets, seqlens)):
        if not isinstance(offs, (list, tuple)):
            _fail("capture_offsets", f"entry {s} must be a list of ints, got {type(offs).__name__}")
        offs = list(offs)
        for o in offs:
            if isinstance(o, bool) or not isinstance(o, int):
                _fail("capture_offsets", f"sequence {s}: offsets must be ints, got {o!r}")
            if not 0 < o < n:
                _fail("capture_offsets", f"sequence {s}: offset {o} outside the allowed range 0 < o < len={n}")
        if any(b <= a for a, b in zip(offs[:-1], offs[1:])):
            _fail("capture_offsets", f"sequence {s}: offsets must be strictly increasing, got {offs}")
        out.append(offs)
    return out


def check_dt_limit(dt_limit) -> tuple[float, float]:
    try:
        lo, hi = float(dt_limit[0]), float(dt_limit[1])
    except (TypeError, IndexError, ValueError):
        _fail("dt_limit", f"expected a pair (lo, hi), got {dt_limit!r}")
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        _fail("dt_limit", f"expected lo <= hi, got {dt_limit!r}")
    return lo, hi


def _check_mixer_inputs(x, dt, A, B, C):
    """x (L, H, P), dt (L, H), A (H,), B/C (L, G, N) with G dividing H; returns L, H, P, G, N."""
    _check_tensor("x", x, (None, None, None))
    L, H, P = x.shape
    dev = x.device
    _check_tensor("dt", dt, (L, H), device=dev)
    _check_tensor("A", A, (H,), device=dev)
    _check_tensor("B", B, (L, None, None), (x.dtype,), dev)
    G, N = B.shape[1], B.shape[2]
    _check_tensor("C", C, (L, G, N), (x.dtype,), dev)
    if G < 1 or H % G != 0:
        _fail("B", f"group count G={G} must divide the head count H={H}")
    return L, H, P, G, N


def check_ssd_scan_args(x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets):
    """All checks of `ssd_scan`; returns (seqlens, offsets, (lo, hi))."""
    T, H, P, G, N = _check_mixer_inputs(x, dt, A, B, C)
    dev = x.device
    if D is not None:
        _check_tensor("D", D, (H,), device=dev)
    if dt_bias is not None:
        _check_tensor("dt_bias", dt_bias, (H,), device=dev)
    limit = check_dt_limit(dt_limit)
    seqlens = check_seqlens(cu_seqlens, T, dev)
    S = len(seqlens)
    if initial_states is not None:
        _check_tensor("initial_states", initial_states, (S, H, P, N), (torch.float32,), dev)
    offsets = check_capture_offsets(capture_offsets, seqlens)
    return seqlens, offsets, limit


def process_dt(dt, dt_bias, dt_softplus: bool, limit: tuple[float, float]) -> torch.Tensor:
    """dt' in fp32: bias, softplus, then the clamp (skipped at the default (0, inf), like mamba_ssm)."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if limit != NO_LIMIT:
        dt = dt.clamp(limit[0], limit[1])
    return dt


# ---------------------------------------------------------------------------------------------
# logical chunks
# ---------------------------------------------------------------------------------------------


class ChunkTable(NamedTuple):
    """Logical chunks: each lies inside one sequence and holds at most `chunk_size` tokens."""

    start: list[int]  # global token index of the chunk's first token
    length: list[int]  # 1 .. chunk_size
    seq: list[int]  # sequence index
    capture: list[int]  # capture slot filled with the state after this chunk, or -1
    seq_chunks: list[int]  # (S+1,) first chunk of each sequence; a sequence of length 0 has none


def build_chunk_table(seqlens: Sequence[int], offsets: Sequence[Sequence[int]], chunk_size: int) -> ChunkTable:
    """Chunk ends: every `chunk_size` tokens from each sequence's start, every capture offset,
    and the sequence end. A capture splits one chunk in two, so the chunks after it keep their
    places; K captures add at most K chunks."""
    start, length, seq, capture, seq_chunks = [], [], [], [], [0]
    tok, k = 0, 0
    for s, n in enumerate(seqlens):
        cuts = sorted(set(range(chunk_size, n, chunk_size)) | set(offsets[s]) | {n}) if n > 0 else []
        cap_at = {o: k + i for i, o in enumerate(offsets[s])}
        k += len(offsets[s])
        lo = 0
        for hi in cuts:
            start.append(tok + lo)
            length.append(hi - lo)
            seq.append(s)
            capture.append(cap_at.get(hi, -1))
            lo = hi
        tok += n
        seq_chunks.append(len(start))
    return ChunkTable(start, length, seq, capture, seq_chunks)


# ---------------------------------------------------------------------------------------------
# the oracle
# ---------------------------------------------------------------------------------------------


def ssd_scan_sequential(
    x, dt, A, B, C, *, cu_seqlens, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    initial_states=None, capture_offsets=None,
) -> SSDScanOutput:
    """Token-by-token fp32 recurrence. x (T,H,P), dt (T,H), A (H,), B/C (T,G,N) -> SSDScanOutput."""
    seqlens, offsets, limit = check_ssd_scan_args(
        x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets)
    T, H, P = x.shape
    G, N = B.shape[1:]
    S = len(seqlens)
    dtp = process_dt(dt, dt_bias, dt_softplus, limit)  # (T, H)
    A32 = A.float()
    D32 = D.float() if D is not None else torch.zeros(H, device=x.device)
    heads_per_group = H // G
    Bh = B.float().repeat_interleave(heads_per_group, dim=1)  # (T, H, N)
    Ch = C.float().repeat_interleave(heads_per_group, dim=1)
    xf = x.float()

    y = torch.empty(T, H, P, dtype=torch.float32, device=x.device)
    final = torch.empty(S, H, P, N, dtype=torch.float32, device=x.device)
    captured = []
    tok = 0
    for s, n in enumerate(seqlens):
        state = initial_states[s].clone() if initial_states is not None else x.new_zeros(H, P, N, dtype=torch.float32)
        wanted = set(offsets[s])
        for i in range(n):
            if i in wanted:
                captured.append(state.clone())  # the state after tokens [0, i)
            t = tok + i
            decay = torch.exp(dtp[t] * A32)  # (H,)
            state = decay[:, None, None] * state + (dtp[t][:, None] * xf[t])[:, :, None] * Bh[t][:, None, :]
            y[t] = torch.einsum("hpn,hn->hp", state, Ch[t]) + D32[:, None] * xf[t]
        final[s] = state
        tok += n
    cap = torch.stack(captured) if captured else x.new_zeros(0, H, P, N, dtype=torch.float32)
    return SSDScanOutput(y.to(x.dtype), final, cap)


# ---------------------------------------------------------------------------------------------
# chunked (matmul) form for CPUs
# ---------------------------------------------------------------------------------------------

_GROUP_ELEMS = 1 << 24  # (chunks, H, L, L) fp32 decay tensor per group: 64 MB


def ssd_scan_chunked(
    x, dt, A, B, C, *, cu_seqlens, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    initial_states=None, capture_offsets=None, chunk_size: int = 128,
) -> SSDScanOutput:
    """The SSD matmul form over logical chunks, fp32 inside; same signature/outputs as `ssd_scan`.

    Default chunk 128: the intra-chunk (L x L) work grows with L, the per-chunk state work with
    T/L; on 2 CPU cores 64, 128 and 256 were within noise of each other (2.0-2.5 s for a
    32772-token prefill at H=32, P=64, N=128), and 128 keeps a capture's extra chunk at half
    the cost of 256. Memory is bounded by the chunk groups (about 64 MB each), not by T.
    """
    seqlens, offsets, limit = check_ssd_scan_args(
        x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets)
    if chunk_size < 1:
        _fail("chunk_size", f"must be >= 1, got {chunk_size}")
    T, H, P = x.shape
    G, N = B.shape[1:]
    S = len(seqlens)
    Hg = H // G
    L = chunk_size
    dev = x.device
    table = build_chunk_table(seqlens, [[] for _ in seqlens], L)  # no cuts: captures never move chunks
    nc = len(table.start)
    K = sum(len(o) for o in offsets)
    # capture k at offset o: the chunk holding token o-1 and the r tokens of it consumed by then
    at_end: dict[int, list[int]] = {}  # chunk -> captures equal to the state after it
    partial: dict[int, list[tuple[int, int]]] = {}  # chunk -> (r, k) with r < chunk length
    k = 0
    for s, offs in enumerate(offsets):
        for o in offs:
            c = table.seq_chunks[s] + (o - 1) // L
            r = o - (c - table.seq_chunks[s]) * L
            (at_end.setdefault(c, []).append(k) if r == table.length[c]
             else partial.setdefault(c, []).append((r, k)))
            k += 1

    y = torch.empty(T, H, P, dtype=x.dtype, device=dev)
    final = torch.empty(S, H, P, N, dtype=torch.float32, device=dev)
    captured = torch.empty(K, H, P, N, dtype=torch.float32, device=dev)
    A32 = A.float()
    D32 = D.float() if D is not None else None
    bias32 = dt_bias.float() if dt_bias is not None else None
    for s in range(S):  # sequences without chunks (length 0) end where they start
        if table.seq_chunks[s] == table.seq_chunks[s + 1]:
            final[s] = initial_states[s] if initial_states is not None else 0.0
    if nc == 0:
        return SSDScanOutput(y, final, captured)

    starts = torch.tensor(table.start, device=dev)
    lens = torch.tensor(table.length, device=dev)
    ar = torch.arange(L, device=dev)
    causal = ar[:, None] >= ar[None, :]
    per_group = max(1, _GROUP_ELEMS // (H * L * L))

    # Inside, a state is kept as (G, N, Hg*P): B^T @ x gives it without a transpose, and C @ it
    # gives y in token-major order. Converted to (H, P, N) only where it leaves (final, captures).
    def to_np(st):  # (H, P, N) -> (G, N, Hg*P)
        return st.reshape(G, Hg, P, N).permute(0, 3, 1, 2).reshape(G, N, Hg * P)

    def to_hpn(st):  # (G, N, Hg*P) -> (H, P, N)
        return st.reshape(G, N, Hg, P).permute(0, 2, 3, 1).reshape(H, P, N)

    state = None
    for c0 in range(0, nc, per_group):
        c1 = min(nc, c0 + per_group)
        nb = c1 - c0
        valid = ar[None, :] < lens[c0:c1, None]  # (nb, L)
        idx = (starts[c0:c1, None] + ar[None, :]).clamp(max=T - 1)  # pad rows read a real row, dt' = 0
        xg = x[idx].float()  # (nb, L, H, P)
        Bg = B[idx].float()  # (nb, L, G, N)
        Cg = C[idx].float().permute(0, 2, 1, 3)  # (nb, G, L, N)
        dtg = process_dt(dt[idx], bias32, dt_softplus, limit).mul_(valid[..., None])  # (nb, L, H); pads: decay 1, no input
        dA = torch.cumsum(dtg * A32, dim=1)  # (nb, L, H)

        # chunk states: sum_j exp(dA_last - dA_j) dt_j B_j (outer) x_j, one bmm per group of heads
        w = torch.exp(dA[:, -1:] - dA).mul_(dtg)  # (nb, L, H)
        xw = (xg * w[..., None]).reshape(nb, L, G, Hg * P).transpose(1, 2)  # (nb, G, L, Hg*P)
        chunk_states = torch.matmul(Bg.permute(0, 2, 3, 1), xw)  # (nb, G, N, Hg*P)

        # inter-chunk recurrence: sequential over chunks, elementwise on one state
        decay_chunk = torch.exp(dA[:, -1]).reshape(nb, G, 1, Hg, 1)
        entering = torch.empty(nb, G, N, Hg * P, dtype=torch.float32, device=dev)
        for i in range(nb):
            c = c0 + i
            s = table.seq[c]
            if c == table.seq_chunks[s]:  # first chunk of a sequence
                state = (to_np(initial_states[s]).clone() if initial_states is not None
                         else torch.zeros(G, N, Hg * P, dtype=torch.float32, device=dev))
            entering[i] = state
            state = (state.view(G, N, Hg, P) * decay_chunk[i]).view(G, N, Hg * P).add_(chunk_states[i])
            for k in at_end.get(c, ()):
                captured[k] = to_hpn(state)
            if c == table.seq_chunks[s + 1] - 1:
                final[s] = to_hpn(state)
            for r, k in partial.get(c, ()):
                # partial-chunk state from the state entering the chunk: the chunk-state product
                # over its first r tokens, at most one chunk state's work (no L x L term)
                w_r = torch.exp(dA[i, r - 1] - dA[i, :r]) * dtg[i, :r]  # (r, H)
                xw_r = (xg[i, :r] * w_r[..., None]).reshape(r, G, Hg * P).transpose(0, 1)  # (G, r, Hg*P)
                st = torch.matmul(Bg[i, :r].permute(1, 2, 0), xw_r)  # (G, N, Hg*P)
                st += (entering[i].view(G, N, Hg, P) * torch.exp(dA[i, r - 1]).view(G, 1, Hg, 1)).view(G, N, Hg * P)
                captured[k] = to_hpn(st)

        # y from the entering state: exp(dA_i) C_i . state
        yc = torch.matmul(Cg, entering).transpose(1, 2).reshape(nb, L, H, P)  # (nb, L, H, P)
        yc.mul_(torch.exp(dA)[..., None])

        # y within the chunk: (C_i . B_j) exp(dA_i - dA_j) dt_j x_j for j <= i
        CB = torch.matmul(Cg, Bg.permute(0, 2, 3, 1))  # (nb, G, L, L)
        dAh = dA.transpose(1, 2)  # (nb, H, L)
        seg = (dAh[..., :, None] - dAh[..., None, :]).masked_fill_(~causal, -math.inf).exp_()
        seg.mul_(dtg.transpose(1, 2)[..., None, :])
        seg.view(nb, G, Hg, L, L).mul_(CB[:, :, None])
        yc += torch.matmul(seg, xg.transpose(1, 2)).transpose(1, 2)
        if D32 is not None:
            yc += D32[:, None] * xg
        y[idx[valid]] = yc[valid].to(x.dtype)
    return SSDScanOutput(y, final, captured)


# ---------------------------------------------------------------------------------------------
# decode step
# ---------------------------------------------------------------------------------------------


def check_slot_idx(slot_idx, num_slots: int, count: int) -> None:
    """Slots in range and distinct. Reads slot_idx on the host: one sync, which a caller inside a
    CUDA graph skips with `check_slots=False`."""
    if count == 0:
        return
    lo, hi = int(slot_idx.min()), int(slot_idx.max())
    if lo < 0 or hi >= num_slots:
        _fail("slot_idx", f"slots must lie in 0 .. {num_slots - 1}, got {lo} .. {hi}")
    if torch.unique(slot_idx).numel() != count:
        _fail("slot_idx", "slots must be distinct (two sequences cannot update one state)")


def check_ssd_decode_args(x, dt, A, B, C, state_pool, slot_idx, D, dt_bias, dt_limit, slots_checked=True):
    S, H, P, G, N = _check_mixer_inputs(x, dt, A, B, C)
    dev = x.device
    _check_tensor("state_pool", state_pool, (None, H, P, N), (torch.float32,), dev)
    _check_tensor("slot_idx", slot_idx, (S,), (torch.int32, torch.int64), dev)
    if D is not None:
        _check_tensor("D", D, (H,), device=dev)
    if dt_bias is not None:
        _check_tensor("dt_bias", dt_bias, (H,), device=dev)
    limit = check_dt_limit(dt_limit)
    if slots_checked:
        check_slot_idx(slot_idx, state_pool.shape[0], S)
    return limit


def ssd_decode_step_ref(
    x, dt, A, B, C, *, state_pool, slot_idx, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    check_slots: bool = True,
) -> torch.Tensor:
    """One token per sequence: x (S,H,P), dt (S,H), B/C (S,G,N); state_pool[slot_idx] updated in place."""
    limit = check_ssd_decode_args(x, dt, A, B, C, state_pool, slot_idx, D, dt_bias, dt_limit, check_slots)
    S, H, P = x.shape
    G = B.shape[1]
    dtp = process_dt(dt, dt_bias, dt_softplus, limit)  # (S, H)
    Bh = B.float().repeat_interleave(H // G, dim=1)  # (S, H, N)
    Ch = C.float().repeat_interleave(H // G, dim=1)
    slots = slot_idx.long()
    state = state_pool[slots]  # (S, H, P, N)
    state = torch.exp(dtp * A.float())[..., None, None] * state + (dtp[..., None] * x.float())[..., None] * Bh[:, :, None, :]
    state_pool[slots] = state
    y = torch.einsum("shpn,shn->shp", state, Ch)
    if D is not None:
        y = y + D.float()[:, None] * x.float()
    return y.to(x.dtype)
