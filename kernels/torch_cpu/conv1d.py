"""Causal depthwise conv1d and its decode step in PyTorch, as the model's `torch` backend runs them.

Contract: `kernels.contracts.conv1d`; the oracles they are tested against: `kernels.reference.conv1d`.
The scan is W shifted multiply-adds per tile of rows in fp32 (any W); the decode step
shifts every sequence's window at once through `slot_idx`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.contracts.conv1d import Conv1dOutput, check_conv1d_args, check_conv1d_decode_args


TILE_ROWS = 256  # output rows a pass: the tile's fp32 input and accumulator (2 x 256 x D floats, 1.5 MB
# at D = 768) stay in a 2 MB L2 across the W taps, the bias, the SiLU and the cast. Whole-sequence
# passes streamed 8192 x 768 fp32 tensors through memory ~8 times: a 16K-token granite-small-cpu
# prefill in bf16 spent 0.36 s of 3.3 s in the conv, one thread.


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
        # the sequence's window u = [init | x] (u[W-1+i] is token i), read without building it: tap k
        # of output i reads u[i+k], token i - (W-1-k) from i = W-1-k on and init[i+k] before. In
        # place (addcmul_, silu_), a tile of rows at a time with its W-1 rows of history.
        for t0 in range(0, n, TILE_ROWS):
            t1 = min(n, t0 + TILE_ROWS)
            lo = max(0, t0 - (W - 1))
            xt = x[tok + lo:tok + t1].float()  # tokens lo .. t1-1
            out = y[tok + t0:tok + t1]
            acc = out if out.dtype == torch.float32 else torch.empty(t1 - t0, D, device=x.device)
            torch.mul(xt[t0 - lo:], wk[W - 1], out=acc)
            for k in range(W - 1):
                shift = W - 1 - k
                a = max(t0, shift)  # rows from here read a token, rows before read init
                if t1 > a:
                    acc[a - t0:].addcmul_(xt[a - shift - lo:t1 - shift - lo], wk[k])
                e = min(t1, shift)
                if init is not None and e > t0:
                    acc[:e - t0].addcmul_(init[k + t0:k + e], wk[k])
            if b32 is not None:
                acc += b32
            if activation == "silu":
                F.silu(acc, inplace=True)
            if acc is not out:
                out.copy_(acc)

        def window(end: int) -> torch.Tensor:  # u[end : end + W-1] as (D, W-1): the state after `end` tokens
            if end >= W - 1:
                rows = x[tok + end - (W - 1):tok + end].float()
            else:
                head = init[end:] if init is not None else x.new_zeros(W - 1 - end, D, dtype=torch.float32)
                rows = torch.cat([head, x[tok:tok + end].float()])
            return rows.t().to(x.dtype)

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
