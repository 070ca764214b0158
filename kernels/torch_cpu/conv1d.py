"""Causal depthwise conv1d and its decode step in PyTorch, as the model's `torch` backend runs them.

Contract: `kernels.contracts.conv1d`; the oracles they are tested against: `kernels.reference.conv1d`.
The scan is one pass of W shifted multiply-adds per sequence in fp32 (any W); the decode step
shifts every sequence's window at once through `slot_idx`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.contracts.conv1d import Conv1dOutput, check_conv1d_args, check_conv1d_decode_args


def causal_conv1d_cpu(
    x, weight, bias=None, *, cu_seqlens, initial_states=None, capture_offsets=None, activation="silu",
) -> Conv1dOutput:
    """x (T, D), weight (D, W), bias (D,) -> Conv1dOutput(y (T,D), final (S,D,W-1), captured (K,D,W-1))."""
    seqlens, offsets = check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets, activation)
    T, D = x.shape
    W = weight.shape[1]
    S = len(seqlens)
    wk = weight.float().t().contiguous()  # (W, D): each tap's weights one contiguous row (fast broadcast)
    b32 = bias.float() if bias is not None else None
    y = torch.empty(T, D, dtype=x.dtype, device=x.device)
    final = torch.empty(S, D, W - 1, dtype=x.dtype, device=x.device)
    captured = []
    tok = 0
    for s, n in enumerate(seqlens):
        init = initial_states[s].float().t() if initial_states is not None else None  # (W-1, D)
        xs = x[tok:tok + n].float()
        # the sequence's window u = [init | xs] (u[W-1+i] is token i), read without building it:
        # tap k of output i reads u[i+k], a row of xs from i = W-1-k on and of init before.
        # In place (addcmul_, silu_) and no concatenated copy: a third of the time at T=8192.
        acc = xs * wk[W - 1]
        for k in range(W - 1):
            shift = W - 1 - k
            if n > shift:
                acc[shift:].addcmul_(xs[:n - shift], wk[k])
            if init is not None:
                m = min(shift, n)
                acc[:m].addcmul_(init[k:k + m], wk[k])

        def window(end: int) -> torch.Tensor:  # u[end : end + W-1] as (D, W-1): the state after `end` tokens
            if end >= W - 1:
                rows = xs[end - (W - 1):end]
            else:
                head = init[end:] if init is not None else xs.new_zeros(W - 1 - end, D)
                rows = torch.cat([head, xs[:end]])
            return rows.t().to(x.dtype)

        if b32 is not None:
            acc += b32
        if activation == "silu":
            F.silu(acc, inplace=True)
        if S == 1 and acc.dtype == x.dtype:
            y = acc  # one sequence: the accumulator is the output, no copy
        else:
            y[tok:tok + n] = acc.to(x.dtype)
        final[s] = window(n)
        for o in offsets[s]:
            captured.append(window(o))
        tok += n
    cap = torch.stack(captured) if captured else x.new_zeros(0, D, W - 1)
    return Conv1dOutput(y, final, cap)


def causal_conv1d_decode_step_cpu(
    x, *, conv_state_pool, weight, bias=None, slot_idx, activation="silu", check_slots: bool = True,
) -> torch.Tensor:
    """One token per sequence: x (S, D); conv_state_pool[slot_idx] (D, W-1) shifted in place."""
    check_conv1d_decode_args(x, conv_state_pool, weight, bias, slot_idx, activation, check_slots)
    slots = slot_idx.long()
    window = torch.cat([conv_state_pool[slots].float(), x.float()[:, :, None]], dim=-1)  # (S, D, W)
    acc = (window * weight.float()).sum(-1)
    if bias is not None:
        acc = acc + bias.float()
    if activation == "silu":
        acc = F.silu(acc)
    conv_state_pool[slots] = window[..., 1:].to(conv_state_pool.dtype)
    return acc.to(x.dtype)
