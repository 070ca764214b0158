"""Gated delta rule oracles: the token-by-token recurrence, and the decode step as a one-token scan.

Plain PyTorch in fp64 (a Python loop over tokens, nothing clever): the executable spec the Triton
kernels (`kernels.gated_delta_rule`, `kernels.gated_delta_decode`) and the CPU path
(`kernels.torch_cpu.gated_delta`) are tested against. fp64 rather than the other oracles' fp32:
the chunked forms under test reorder a K x V state update per token, and an fp32 oracle's own
rounding would be a sizeable share of the fp32 tolerance. Math and argument contract:
`kernels.contracts.gated_delta`.
"""

from __future__ import annotations

import torch

from kernels.contracts.gated_delta import (
    GatedDeltaOutput, check_gated_delta_args, check_gated_delta_decode_args, l2norm,
)

F64 = torch.float64


def gated_delta_rule_sequential(
    q, k, v, g, beta, *, cu_seqlens, initial_states=None, capture_offsets=None, scale=None, use_qk_l2norm=True,
) -> GatedDeltaOutput:
    """Token-by-token fp64 recurrence: q/k (T, HK, K), v (T, HV, V), g/beta (T, HV) -> GatedDeltaOutput."""
    seqlens, offsets, scale = check_gated_delta_args(q, k, v, g, beta, cu_seqlens, initial_states, capture_offsets,
                                                     scale)
    T, HK, K = q.shape
    HV, V = v.shape[1:]
    rep = HV // HK
    qf, kf = q.to(F64).repeat_interleave(rep, dim=1), k.to(F64).repeat_interleave(rep, dim=1)  # (T, HV, K)
    if use_qk_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    qf = qf * scale
    vf, gf, bf = v.to(F64), g.to(F64), beta.to(F64)

    o = torch.empty(T, HV, V, dtype=F64, device=q.device)
    final = torch.empty(len(seqlens), HV, K, V, dtype=F64, device=q.device)
    captured = []
    tok = 0
    for s, n in enumerate(seqlens):
        state = (initial_states[s].to(F64).clone() if initial_states is not None
                 else torch.zeros(HV, K, V, dtype=F64, device=q.device))
        wanted = set(offsets[s])
        for i in range(n):
            if i in wanted:
                captured.append(state.clone())  # the state after tokens [0, i)
            t = tok + i
            state = state * torch.exp(gf[t])[:, None, None]
            predicted = torch.einsum("hkv,hk->hv", state, kf[t])
            delta = bf[t][:, None] * (vf[t] - predicted)
            state = state + kf[t][:, :, None] * delta[:, None, :]
            o[t] = torch.einsum("hkv,hk->hv", state, qf[t])
        final[s] = state
        tok += n
    cap = torch.stack(captured) if captured else final.new_zeros(0, HV, K, V)
    return GatedDeltaOutput(o.to(v.dtype), final.float(), cap.float())


def gated_delta_decode_step_ref(
    q, k, v, g, beta, *, state_pool, slot_idx, scale=None, use_qk_l2norm=True, check_slots: bool = True,
) -> torch.Tensor:
    """One token per sequence, as `gated_delta_rule_sequential` over S one-token sequences that start
    from their pool states: q/k (S, HK, K), v (S, HV, V), g/beta (S, HV); state_pool[slot_idx] updated in place."""
    check_gated_delta_decode_args(q, k, v, g, beta, state_pool, slot_idx, scale, check_slots)
    S = q.shape[0]
    if S == 0:
        return v.new_empty(v.shape)
    slots = slot_idx.long()
    one_token_each = torch.arange(S + 1, dtype=torch.int32, device=q.device)
    out = gated_delta_rule_sequential(q, k, v, g, beta, cu_seqlens=one_token_each, initial_states=state_pool[slots],
                                      scale=scale, use_qk_l2norm=use_qk_l2norm)
    state_pool[slots] = out.final_states
    return out.o
