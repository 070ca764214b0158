"""Mamba-2 SSD oracles: the token-by-token scan, and the decode step defined as a one-token scan.

Plain fp32 PyTorch, a Python loop over tokens, nothing clever: the executable spec the Triton
kernels and the CPU paths (`kernels.torch_cpu.ssd`) are tested against. Math and argument
contract: `kernels.contracts.ssd`.
"""

from __future__ import annotations

import torch

from kernels.contracts.ssd import NO_LIMIT, SSDScanOutput, check_ssd_decode_args, check_ssd_scan_args, process_dt


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


def ssd_decode_step_ref(
    x, dt, A, B, C, *, state_pool, slot_idx, D=None, dt_bias=None, dt_softplus=True, dt_limit=NO_LIMIT,
    check_slots: bool = True,
) -> torch.Tensor:
    """One token per sequence, as `ssd_scan_sequential` over S one-token sequences that start from
    their pool states: x (S,H,P), dt (S,H), B/C (S,G,N); state_pool[slot_idx] updated in place."""
    check_ssd_decode_args(x, dt, A, B, C, state_pool, slot_idx, D, dt_bias, dt_limit, check_slots)
    S = x.shape[0]
    if S == 0:
        return x.new_empty(x.shape)
    slots = slot_idx.long()
    one_token_each = torch.arange(S + 1, dtype=torch.int32, device=x.device)
    out = ssd_scan_sequential(x, dt, A, B, C, cu_seqlens=one_token_each, D=D, dt_bias=dt_bias,
                              dt_softplus=dt_softplus, dt_limit=dt_limit, initial_states=state_pool[slots])
    state_pool[slots] = out.final_states
    return out.y
