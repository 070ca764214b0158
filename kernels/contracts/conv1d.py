"""The causal depthwise conv1d (varlen, with conv-state capture) and its decode step.

    y_t = act( sum_{k<W} weight[:, k] * u_{t - (W-1) + k} + bias )

where u is the sequence's input preceded by its initial conv state. The conv state of a sequence
is its last W-1 *inputs* (pre-conv, oldest first), zeros before the sequence start; the state
captured at offset o is the state after tokens [0, o): u_{o-W+1} .. u_{o-1}. Batches and
`capture_offsets` are packed as in `kernels.contracts.varlen`. These checks accept any W >= 2;
the Triton kernels add their own limit (W = 4).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.checks import require
from kernels.contracts.tensors import INDEX_DTYPES, check_tensor
from kernels.contracts.varlen import check_capture_offsets, check_seqlens, check_slot_idx

ACTIVATIONS = ("silu", None)


class Conv1dOutput(NamedTuple):
    y: torch.Tensor  # (T, D), x's dtype
    final_states: torch.Tensor  # (S, D, W-1), x's dtype (raw inputs: lossless, as in HF/vLLM conv caches)
    captured_states: torch.Tensor  # (K, D, W-1)


def check_activation(activation) -> None:
    if activation not in ACTIVATIONS:
        require(False, "activation", f"must be one of {ACTIVATIONS}, got {activation!r}")


def check_conv_inputs(x, weight):
    """x (L, D) and weight (D, W) with W >= 2; returns L, D, W."""
    check_tensor("x", x, (None, None))
    L, D = x.shape
    check_tensor("weight", weight, (D, None), device=x.device)
    W = weight.shape[1]
    require(W >= 2, "weight", f"width W={W} must be >= 2")
    return L, D, W


def check_conv1d_args(x, weight, bias, cu_seqlens, initial_states, capture_offsets, activation, seqlens=None):
    """All checks of `causal_conv1d`; returns (seqlens, offsets). `seqlens`: host lengths from a
    plan (no read of cu_seqlens, see `check_seqlens`)."""
    T, D, W = check_conv_inputs(x, weight)
    dev = x.device
    if bias is not None:
        check_tensor("bias", bias, (D,), device=dev)
    check_activation(activation)
    seqlens = check_seqlens(cu_seqlens, T, dev, seqlens)
    if initial_states is not None:
        check_tensor("initial_states", initial_states, (len(seqlens), D, W - 1), (x.dtype,), dev)
    return seqlens, check_capture_offsets(capture_offsets, seqlens)


def check_conv1d_decode_args(x, conv_state_pool, weight, bias, slot_idx, activation, slots_checked=True,
                             pad_slots=False):
    """All checks of `causal_conv1d_decode_step`."""
    S, D, W = check_conv_inputs(x, weight)
    dev = x.device
    check_tensor("conv_state_pool", conv_state_pool, (None, D, W - 1), (x.dtype,), dev)
    if bias is not None:
        check_tensor("bias", bias, (D,), device=dev)
    check_tensor("slot_idx", slot_idx, (S,), INDEX_DTYPES, dev)
    check_activation(activation)
    if slots_checked:
        check_slot_idx(slot_idx, conv_state_pool.shape[0], S, pad_slots)
