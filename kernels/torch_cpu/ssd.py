"""Mamba-2 SSD scan and decode step in PyTorch, as the model's `torch` backend runs them on CPU.

Contract and math: `kernels.contracts.ssd`; the oracles they are tested against:
`kernels.reference.ssd`.

* `ssd_scan_chunked`: the SSD matmul form over *logical chunks* that never span a sequence
  boundary and start every `chunk_size` tokens from their sequence's start. Chunks are processed
  in groups sized so that the (chunks, H, L, L) decay tensor stays near 512K elements (2 MB): that
  bounds memory for any T and keeps a group's elementwise passes in cache (at T=8192, H=8, one
  thread, 64 MB groups were 5-15% slower, and 1.3-1.7x with the earlier layout below: each pass
  went to DRAM, and glibc maps and unmaps every buffer over 32 MB, page faults included). Layouts:
  x dt is written head-major (H, L, P) for the intra-chunk product in one pass (dt on x, not on
  the L x L matrix), x w straight into the (G, L, Hg*P) layout of the chunk-state product, and y
  is assembled head-major and written back once, D x added on the way; a group of full
  back-to-back chunks (a sequence whose length is a multiple of L) reads its inputs as views and
  writes y through one, with no gather and no masked scatter. A capture at offset o is made from
  the state entering the chunk that holds token o-1: with r tokens of that chunk consumed,
  state_o = exp(dA_cs[r-1]) state_in + sum_{j<r} exp(dA_cs[r-1] - dA_cs[j]) dt'_j x_j (outer) B_j,
  one (N x r) @ (r x H*P) product, at most a chunk-state's work and no L x L term (on a chunk
  boundary it is the state after the chunk, free). Captures do not change the chunking, so y and the final
  states are bit-identical with and without them. (A padded CPU chunk costs its full L x L work
  even when a cut leaves it with a few tokens: cutting measured +18% at T=1024, H=32; this
  measured +1.5%, best of 15.)
* `ssd_decode_step_cpu`: one token per sequence, every sequence at once, states updated in place
  through `slot_idx`.
"""

from __future__ import annotations

import math

import torch

from kernels.checks import require
from kernels.contracts.ssd import NO_LIMIT, SSDScanOutput, check_ssd_decode_args, check_ssd_scan_args, process_dt
from kernels.contracts.varlen import build_chunk_table

_GROUP_ELEMS = 1 << 19  # (chunks, H, L, L) fp32 decay tensor per group: 2 MB


def ssd_scan_chunked(
    x, dt, A, B, C, *, cu_seqlens, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    initial_states=None, capture_offsets=None, chunk_size: int = 64,
) -> SSDScanOutput:
    """The SSD matmul form over logical chunks, fp32 inside; same signature/outputs as `ssd_scan`.

    Default chunk 64: the intra-chunk (L x L) work grows with L, the per-chunk state work with
    T/L. On the AMD EPYC (AVX-512) of issue 35, one thread, a 16384-token scan at H=8, P=64, N=128
    (every CPU preset's Mamba shape) took 0.16 s at 64, 0.21 s at 128, 0.35 s at 256 (median of 4,
    CPU time), and 0.28 / 0.38 / 0.67 s at T=8192, H=32; on the 2-core laptop of the earlier
    records 64 was ~25% faster than 128 at T=8192, H=8, and 64-256 within noise at H=32, T=32772.
    A capture's extra partial chunk costs at most one chunk state. `tests/test_cost_model.py` pins
    the chunk: the cost model's torch scan term. Memory is bounded by the chunk groups, not by T.
    """
    seqlens, offsets, limit = check_ssd_scan_args(
        x, dt, A, B, C, cu_seqlens, D, dt_bias, dt_limit, initial_states, capture_offsets)
    require(chunk_size >= 1, "chunk_size", f"must be >= 1, got {chunk_size}")
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
        t0 = table.start[c0]
        # Full chunks back to back (every chunk of a sequence whose length is a multiple of L):
        # the group is a view of the inputs, no gather, and y is written through a view.
        dense = table.start[c1 - 1] - t0 == (nb - 1) * L and all(n == L for n in table.length[c0:c1])
        if dense:
            tokens = slice(t0, t0 + nb * L)
            xg = x[tokens].reshape(nb, L, H, P).float()
            Bg = B[tokens].reshape(nb, L, G, N).float()
            Cg = C[tokens].reshape(nb, L, G, N).float().permute(0, 2, 1, 3)  # (nb, G, L, N)
            dtg = process_dt(dt[tokens].reshape(nb, L, H), bias32, dt_softplus, limit)
        else:
            valid = ar[None, :] < lens[c0:c1, None]  # (nb, L)
            idx = (starts[c0:c1, None] + ar[None, :]).clamp(max=T - 1)  # pad rows read a real row, dt' = 0
            xg = x[idx].float()  # (nb, L, H, P)
            Bg = B[idx].float()  # (nb, L, G, N)
            Cg = C[idx].float().permute(0, 2, 1, 3)  # (nb, G, L, N)
            dtg = process_dt(dt[idx], bias32, dt_softplus, limit).mul_(valid[..., None])  # (nb, L, H); pads: decay 1, no input
        dA = torch.cumsum(dtg * A32, dim=1)  # (nb, L, H)
        xg5 = xg.view(nb, L, G, Hg, P)

        # chunk states: sum_j exp(dA_last - dA_j) dt_j B_j (outer) x_j, one bmm per group of heads;
        # the weighted x is written straight into the (G, L, Hg*P) layout the bmm reads
        w = torch.exp(dA[:, -1:] - dA).mul_(dtg)  # (nb, L, H)
        xw = torch.empty(nb, G, L, Hg * P, dtype=torch.float32, device=dev)
        torch.mul(xg5.transpose(1, 2), w.view(nb, L, G, Hg, 1).transpose(1, 2), out=xw.view(nb, G, L, Hg, P))
        chunk_states = torch.matmul(Bg.permute(0, 2, 3, 1), xw)  # (nb, G, N, Hg*P)

        # inter-chunk recurrence: sequential over chunks, elementwise on one state. The state after
        # chunk i is written straight into entering[i + 1] (row nb: after the group's last chunk),
        # two passes over it a chunk instead of a copy, a product into a new tensor and an add:
        # 10 scans of a 16K-token granite-small-cpu prefill ran 1,280 chunks of 256 KB states.
        decay_chunk = torch.exp(dA[:, -1]).reshape(nb, G, 1, Hg, 1)
        entering = torch.empty(nb + 1, G, N, Hg * P, dtype=torch.float32, device=dev)
        for i in range(nb):
            c = c0 + i
            s = table.seq[c]
            if c == table.seq_chunks[s]:  # first chunk of a sequence
                if initial_states is not None:
                    entering[i] = to_np(initial_states[s])
                else:
                    entering[i].zero_()
            elif i == 0:
                entering[0] = state  # carried over from the previous group
            state = entering[i + 1]
            torch.mul(entering[i].view(G, N, Hg, P), decay_chunk[i], out=state.view(G, N, Hg, P))
            state.add_(chunk_states[i])
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

        # y from the entering state, exp(dA_i) C_i . state, scaled into head-major (nb, H, L, P)
        yoff = torch.matmul(Cg, entering[:nb]).view(nb, G, L, Hg, P)
        yh = torch.empty(nb, G, Hg, L, P, dtype=torch.float32, device=dev)
        torch.mul(yoff.transpose(2, 3), torch.exp(dA).view(nb, L, G, Hg, 1).permute(0, 2, 3, 1, 4), out=yh)

        # y within the chunk: (C_i . B_j) exp(dA_i - dA_j) dt_j x_j for j <= i, accumulated onto yh;
        # dt_j goes onto x (nb*H*L*P) rather than onto the (nb*H*L*L) decay matrix
        CB = torch.matmul(Cg, Bg.permute(0, 2, 3, 1))  # (nb, G, L, L)
        dAh = dA.transpose(1, 2).contiguous()  # (nb, H, L): seg below comes out contiguous
        seg = (dAh[..., :, None] - dAh[..., None, :]).masked_fill_(~causal, -math.inf).exp_()
        seg.view(nb, G, Hg, L, L).mul_(CB[:, :, None])
        xdt = torch.empty(nb, H, L, P, dtype=torch.float32, device=dev)
        torch.mul(xg.transpose(1, 2), dtg.transpose(1, 2)[..., None], out=xdt)
        # (bmm, then add: FlopCounterMode's count, tests/test_cost_model.py, sees bmm only)
        yh = yh.view(nb, H, L, P)
        yh += torch.bmm(seg.view(nb * H, L, L), xdt.view(nb * H, L, P)).view(nb, H, L, P)

        # back to token-major, plus D x
        yt = yh.transpose(1, 2)  # (nb, L, H, P)
        if dense and y.dtype == torch.float32:
            out = y[tokens].view(nb, L, H, P)
            if D32 is not None:
                torch.addcmul(yt, xg, D32[:, None], out=out)
            else:
                out.copy_(yt)
            continue
        yc = yt + D32[:, None] * xg if D32 is not None else yt
        if dense:
            y[tokens] = yc.reshape(nb * L, H, P).to(x.dtype)
        else:
            y[idx[valid]] = yc[valid].to(x.dtype)
    return SSDScanOutput(y, final, captured)


def ssd_decode_step_cpu(
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
    decay = torch.exp(dtp * A.float())  # (S, H)
    dtx = dtp[..., None] * x.float()  # (S, H, P)
    y = x.new_empty((S, H, P), dtype=torch.float32)
    for s, slot in enumerate(slot_idx.tolist()):
        # in place on the pool row: a gather and a scatter of the (H, P, N) state cost 2 of the 3
        # passes over it (granite-dense-cpu: 256 KB a layer, 322 -> 198 us a step on one core)
        state = state_pool[slot]
        state.mul_(decay[s][:, None, None]).addcmul_(dtx[s][:, :, None], Bh[s][:, None, :])
        torch.sum(state * Ch[s][:, None, :], dim=-1, out=y[s])  # 22 us; bmm of (H,P,N)@(H,N,1) 82 us
    if D is not None:
        y = y + D.float()[:, None] * x.float()
    return y.to(x.dtype)
