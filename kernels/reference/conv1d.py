"""Causal depthwise conv1d oracles: the conv token by token, and the decode step as a one-token conv.

Plain fp32 PyTorch, any width W: the executable spec the Triton kernels and the CPU paths
(`kernels.torch_cpu.conv1d`) are tested against. Math and argument contract:
`kernels.contracts.conv1d`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.contracts.conv1d import Conv1dOutput, check_conv1d_args, check_conv1d_decode_args


def causal_conv1d_ref(
    x, weight, bias=None, *, cu_seqlens, initial_states=None, capture_offsets=None, activation="silu",
) -> Conv1dOutput:
    """x (T, D), weight (D, W), bias (D,) -> Conv1dOutput(y (T,D), final (S,D,W-1), captured (K,D,W-1)).

    Token t of a sequence: y_t = act(sum_k weight[:, k] u[t + k] + bias), where u lists the
    sequence's W-1 initial-state columns and then its inputs, so u[W-1+t] is token t. The conv
    state after tokens [0, o) is u[o : o+W-1]: copies of inputs, in x's dtype.
    """
    seqlens, offsets = check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets, activation)
    T, D = x.shape
    W = weight.shape[1]
    w = weight.float()
    b = bias.float() if bias is not None else torch.zeros(D, device=x.device)
    y = torch.empty(T, D, dtype=x.dtype, device=x.device)
    final, captured = [], []
    tok = 0
    for s, n in enumerate(seqlens):
        init = initial_states[s] if initial_states is not None else x.new_zeros(D, W - 1)
        u = [init[:, j] for j in range(W - 1)] + [x[tok + t] for t in range(n)]
        for t in range(n):
            acc = b.clone()
            for k in range(W):
                acc += w[:, k] * u[t + k].float()
            y[tok + t] = (F.silu(acc) if activation == "silu" else acc).to(x.dtype)
        final.append(torch.stack(u[n:n + W - 1], dim=1))
        captured += [torch.stack(u[o:o + W - 1], dim=1) for o in offsets[s]]
        tok += n
    cap = torch.stack(captured) if captured else x.new_zeros(0, D, W - 1)
    return Conv1dOutput(y, torch.stack(final), cap)


def causal_conv1d_decode_step_ref(
    x, *, conv_state_pool, weight, bias=None, slot_idx, activation="silu", check_slots: bool = True,
) -> torch.Tensor:
    """One token per sequence, as `causal_conv1d_ref` over S one-token sequences that start from
    their pool states: x (S, D); conv_state_pool[slot_idx] (D, W-1) shifted in place."""
    check_conv1d_decode_args(x, conv_state_pool, weight, bias, slot_idx, activation, check_slots)
    S = x.shape[0]
    if S == 0:
        return x.new_empty(x.shape)
    slots = slot_idx.long()
    one_token_each = torch.arange(S + 1, dtype=torch.int32, device=x.device)
    out = causal_conv1d_ref(x, weight, bias, cu_seqlens=one_token_each, initial_states=conv_state_pool[slots],
                            activation=activation)
    conv_state_pool[slots] = out.final_states
    return out.y
