"""Causal depthwise conv1d references (varlen, with conv-state capture) and the decode step.

    y_t = act( sum_{k<W} weight[:, k] * u_{t - (W-1) + k} + bias )

where u is the sequence's input preceded by its initial conv state. The conv state of a sequence
is its last W-1 *inputs* (pre-conv, oldest first), zeros before the sequence start; the state
captured at offset o is the state after tokens [0, o): u_{o-W+1} .. u_{o-1}. `capture_offsets`
follows `ssd_scan`'s convention. These references accept any W; the Triton kernels need W = 4.

This is also the model's `torch` backend: one pass of W shifted multiply-adds per sequence, fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels.reference.ssd import _check_tensor, _fail, check_capture_offsets, check_seqlens, check_slot_idx

ACTIVATIONS = ("silu", None)


class Conv1dOutput(NamedTuple):
    y: torch.Tensor  # (T, D), x's dtype
    final_states: torch.Tensor  # (S, D, W-1), x's dtype (raw inputs: lossless, as in HF/vLLM conv caches)
    captured_states: torch.Tensor  # (K, D, W-1)


def check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        _fail("activation", f"must be one of {ACTIVATIONS}, got {activation!r}")


def _check_conv_inputs(x, weight):
    """x (L, D) and weight (D, W) with W >= 2; returns L, D, W."""
    _check_tensor("x", x, (None, None))
    L, D = x.shape
    _check_tensor("weight", weight, (D, None), device=x.device)
    W = weight.shape[1]
    if W < 2:
        _fail("weight", f"width W={W} must be >= 2")
    return L, D, W


def check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets, activation):
    """All checks of `causal_conv1d`; returns (seqlens, offsets)."""
    T, D, W = _check_conv_inputs(x, weight)
    dev = x.device
    if bias is not None:
        _check_tensor("bias", bias, (D,), device=dev)
    check_activation(activation)
    seqlens = check_seqlens(cu_seqlens, T, dev)
    if initial_states is not None:
        _check_tensor("initial_states", initial_states, (len(seqlens), D, W - 1), (x.dtype,), dev)
    return seqlens, check_capture_offsets(capture_offsets, seqlens)


def causal_conv1d_ref(
    x, weight, bias=None, *, cu_seqlens, initial_states=None, capture_offsets=None, activation="silu",
) -> Conv1dOutput:
    """x (T, D), weight (D, W), bias (D,) -> Conv1dOutput(y (T,D), final (S,D,W-1), captured (K,D,W-1))."""
    seqlens, offsets = check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets, activation)
    T, D = x.shape
    W = weight.shape[1]
    S = len(seqlens)
    w = weight.float()
    y = torch.empty(T, D, dtype=x.dtype, device=x.device)
    final = torch.empty(S, D, W - 1, dtype=x.dtype, device=x.device)
    captured = []
    tok = 0
    for s, n in enumerate(seqlens):
        init = (initial_states[s].float().t() if initial_states is not None
                else torch.zeros(W - 1, D, device=x.device))
        u = torch.cat([init, x[tok:tok + n].float()])  # (W-1+n, D); u[W-1+i] is token i
        acc = u[0:n] * w[:, 0]
        for k in range(1, W):
            acc += u[k:k + n] * w[:, k]
        if bias is not None:
            acc += bias.float()
        if activation == "silu":
            acc = F.silu(acc)
        y[tok:tok + n] = acc.to(x.dtype)
        final[s] = u[n:n + W - 1].t().to(x.dtype)
        for o in offsets[s]:
            captured.append(u[o:o + W - 1].t().to(x.dtype))
        tok += n
    cap = torch.stack(captured) if captured else x.new_zeros(0, D, W - 1)
    return Conv1dOutput(y, final, cap)


def check_conv1d_decode_args(x, conv_state_pool, weight, bias, slot_idx, activation, slots_checked=True):
    S, D, W = _check_conv_inputs(x, weight)
    dev = x.device
    _check_tensor("conv_state_pool", conv_state_pool, (None, D, W - 1), (x.dtype,), dev)
    if bias is not None:
        _check_tensor("bias", bias, (D,), device=dev)
    _check_tensor("slot_idx", slot_idx, (S,), (torch.int32, torch.int64), dev)
    check_activation(activation)
    if slots_checked:
        check_slot_idx(slot_idx, conv_state_pool.shape[0], S)


def causal_conv1d_decode_step_ref(
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
