"""Gated delta rule scan and decode step in PyTorch, as a model's `torch` backend runs them on CPU.

Contract and math: `kernels.contracts.gated_delta`; the oracles they are tested against:
`kernels.reference.gated_delta`.

* `gated_delta_rule_chunked`: the WY/UT form over *logical chunks* that never span a sequence
  boundary and start every `chunk_size` tokens from their sequence's start (HF's
  `torch_chunk_gated_delta_rule` per sequence, packed): per chunk, A = beta k k^T decayed and
  strictly lower, (w, u) = (I + A)^-1 (beta k exp(g_cs), beta v) in one triangular solve, then
  sequentially v_new = u - w S, o = q exp(g_cs) S + (q k^T decayed) v_new,
  S = exp(g_last) S + (k exp(g_last - g_cs))^T v_new. Chunks are processed in groups sized so
  the (chunks, HV, L, L) decay tensor stays near 512K elements (2 MB), as in
  `kernels.torch_cpu.ssd`: memory bounded for any T. A capture at offset o is made from the state
  entering the chunk that holds token o-1: the first r rows of v_new depend only on the first r
  tokens (T is lower triangular), so with r tokens of that chunk consumed,
  S_o = exp(g_cs[r-1]) S_in + (k_{<r} exp(g_cs[r-1] - g_cs_{<r}))^T v_new_{<r}, a (K x r) @ (r x V)
  product a head; on a chunk boundary it is the state after the chunk, free. Captures do not
  change the chunking, so o and the final states are bit-identical with and without them.
* `gated_delta_decode_step_cpu`: one token per sequence, every sequence at once, the pool rows
  gathered and written back.
"""

from __future__ import annotations

import math

import torch

from kernels.checks import require
from kernels.contracts.gated_delta import (
    GatedDeltaOutput, check_gated_delta_args, check_gated_delta_decode_args, l2norm,
)
from kernels.contracts.varlen import build_chunk_table

_GROUP_ELEMS = 1 << 19  # (chunks, HV, L, L) fp32 decay tensor per group: 2 MB


def _heads(x: torch.Tensor, rep: int, norm: bool) -> torch.Tensor:
    """(..., HK, K) -> fp32 (..., HV, K), normalised if asked (before the repeat: HK rows, not HV)."""
    x = x.float()
    if norm:
        x = l2norm(x)
    return x.repeat_interleave(rep, dim=-2) if rep > 1 else x


def gated_delta_rule_chunked(
    q, k, v, g, beta, *, cu_seqlens, initial_states=None, capture_offsets=None, scale=None, use_qk_l2norm=True,
    chunk_size: int = 64,
) -> GatedDeltaOutput:
    """The WY form over logical chunks, fp32 inside; same signature/outputs as `gated_delta_rule`."""
    seqlens, offsets, scale = check_gated_delta_args(q, k, v, g, beta, cu_seqlens, initial_states, capture_offsets,
                                                     scale)
    require(isinstance(chunk_size, int) and chunk_size >= 1, "chunk_size", f"must be an int >= 1, got {chunk_size}")
    T, HK, K = q.shape
    HV, V = v.shape[1:]
    S, L, rep, dev = len(seqlens), chunk_size, HV // HK, q.device
    table = build_chunk_table(seqlens, [[] for _ in seqlens], L)  # no cuts: captures never move chunks
    nc = len(table.start)
    at_end: dict[int, list[int]] = {}  # chunk -> captures equal to the state after it
    partial: dict[int, list[tuple[int, int]]] = {}  # chunk -> (r tokens consumed, capture) with r < its length
    n_cap = 0
    for s, offs in enumerate(offsets):
        for o in offs:
            c = table.seq_chunks[s] + (o - 1) // L
            r = o - (c - table.seq_chunks[s]) * L
            (at_end.setdefault(c, []).append(n_cap) if r == table.length[c]
             else partial.setdefault(c, []).append((r, n_cap)))
            n_cap += 1

    out = torch.empty(T, HV, V, dtype=v.dtype, device=dev)
    final = torch.empty(S, HV, K, V, dtype=torch.float32, device=dev)
    captured = torch.empty(n_cap, HV, K, V, dtype=torch.float32, device=dev)
    for s in range(S):  # sequences without chunks (length 0) end where they start
        if table.seq_chunks[s] == table.seq_chunks[s + 1]:
            final[s] = initial_states[s] if initial_states is not None else 0.0
    if nc == 0:
        return GatedDeltaOutput(out, final, captured)

    starts = torch.tensor(table.start, device=dev)
    lens = torch.tensor(table.length, device=dev)
    ar = torch.arange(L, device=dev)
    causal = ar[:, None] >= ar[None, :]
    per_group = max(1, _GROUP_ELEMS // (HV * L * L))
    norm = bool(use_qk_l2norm)
    state = None
    for c0 in range(0, nc, per_group):
        c1 = min(nc, c0 + per_group)
        valid = ar[None, :] < lens[c0:c1, None]  # (nb, L)
        idx = (starts[c0:c1, None] + ar[None, :]).clamp(max=T - 1)  # pad rows read a real row, then are zeroed
        vmask = valid[..., None].float()  # (nb, L, 1)
        # head-major (nb, HV, L, .): pads get beta = 0, g = 0 and k = 0 (no write, decay 1, no read)
        qh = (_heads(q[idx], rep, norm) * scale).transpose(1, 2)
        kh = (_heads(k[idx], rep, norm) * vmask[..., None]).transpose(1, 2)
        vh = v[idx].float().transpose(1, 2)
        gcs = (g[idx].float() * vmask).transpose(1, 2).cumsum(-1)  # (nb, HV, L)
        bh = (beta[idx].float() * vmask).transpose(1, 2)
        decay = (gcs[..., :, None] - gcs[..., None, :]).masked_fill_(~causal, -math.inf).exp_()  # (nb, HV, L, L)
        kb = kh * bh[..., None]
        A = torch.matmul(kb, kh.transpose(-1, -2)).mul_(decay).tril_(-1)
        rhs = torch.cat([kb * gcs.exp()[..., None], vh * bh[..., None]], dim=-1)
        wu = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)  # (I + A)^-1 rhs
        w, u = wu[..., :K], wu[..., K:]
        qk = torch.matmul(qh, kh.transpose(-1, -2)).mul_(decay)
        qdec = qh * gcs.exp()[..., None]
        kdec_t = (kh * (gcs[..., -1:] - gcs).exp()[..., None]).transpose(-1, -2)  # (nb, HV, K, L)
        chunk_decay = gcs[..., -1].exp()[..., None, None]  # (nb, HV, 1, 1)
        og = torch.empty(c1 - c0, HV, L, V, dtype=torch.float32, device=dev)
        for i in range(c1 - c0):
            c = c0 + i
            s = table.seq[c]
            if c == table.seq_chunks[s]:  # first chunk of a sequence
                state = (initial_states[s].clone() if initial_states is not None
                         else torch.zeros(HV, K, V, dtype=torch.float32, device=dev))
            v_new = u[i] - torch.matmul(w[i], state)
            og[i] = torch.matmul(qdec[i], state) + torch.matmul(qk[i], v_new)
            for r, kc in partial.get(c, ()):
                kr = kh[i, :, :r] * (gcs[i, :, r - 1:r] - gcs[i, :, :r]).exp()[..., None]  # (HV, r, K)
                captured[kc] = state * gcs[i, :, r - 1].exp()[:, None, None] + torch.matmul(kr.transpose(-1, -2),
                                                                                          v_new[:, :r])
            state = state * chunk_decay[i] + torch.matmul(kdec_t[i], v_new)
            for kc in at_end.get(c, ()):
                captured[kc] = state
            if c == table.seq_chunks[s + 1] - 1:
                final[s] = state
        out[idx[valid]] = og.transpose(1, 2)[valid].to(v.dtype)
    return GatedDeltaOutput(out, final, captured)


def gated_delta_decode_step_cpu(
    q, k, v, g, beta, *, state_pool, slot_idx, scale=None, use_qk_l2norm=True, check_slots: bool = True,
) -> torch.Tensor:
    """One token per sequence: q/k (S, HK, K), v (S, HV, V), g/beta (S, HV); state_pool[slot_idx]
    (fp32) updated in place."""
    scale = check_gated_delta_decode_args(q, k, v, g, beta, state_pool, slot_idx, scale, check_slots)
    rep = v.shape[1] // q.shape[1]
    norm = bool(use_qk_l2norm)
    qf, kf = _heads(q, rep, norm) * scale, _heads(k, rep, norm)  # (S, HV, K)
    slots = slot_idx.long()
    state = state_pool[slots] * g.float().exp()[..., None, None]  # (S, HV, K, V)
    predicted = torch.einsum("shkv,shk->shv", state, kf)
    delta = beta.float()[..., None] * (v.float() - predicted)
    state += kf[..., None] * delta[..., None, :]
    state_pool[slots] = state
    return torch.einsum("shkv,shk->shv", state, qf).to(v.dtype)
