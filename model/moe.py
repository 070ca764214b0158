"""Sparse mixture-of-experts feed-forward: a router picks `top_k` experts per token and weights
them; the experts run over the tokens sorted by expert.

Dispatch (`run_experts`): the T*k (token, expert) assignments are argsorted by expert, so each
expert's assignments form one contiguous slice: one matmul pair per expert, each gathering and
weighting its own rows (`weighted_expert_rows`: a loop over experts, never over tokens), or on a
GPU one `torch._grouped_mm` per projection for all experts at once over the gathered input, its
group offsets computed on the device (`grouped_expert_mlps`: no host sync, CUDA-graph capturable).
The weighted outputs are index_add-ed back onto their tokens.

A router and an experts module are separate so that families combine them: Granite's router is
`SoftmaxTopKRouter` with `GatedExperts`; another routing rule (sigmoid scores with a correction
bias and grouped top-k) or non-gated experts plug into `run_experts` the same way.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from model.config import MoEConfig
from model.linear import linear
from model.mlp import swiglu_halves


class SoftmaxTopKRouter(nn.Module):
    """Granite's routing, op for op as transformers' GraniteMoeHybridTopKRouter: logits = x W^T in
    x's dtype, then fp32; `torch.topk` over them; softmax over the k chosen logits, back in x's
    dtype. The same ops on the same values choose the same experts when logits tie."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (T, H) -> weights (T, k) in x's dtype, expert index (T, k) int64."""
        logits = linear(x, self.weight).float()
        top_logits, index = logits.topk(self.top_k, dim=-1)
        return torch.softmax(top_logits, dim=-1).type_as(x), index


ROUTERS: dict[str, type[nn.Module]] = {"softmax_topk": SoftmaxTopKRouter}


def _grouped_mm_fits(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """torch._grouped_mm needs 16-byte aligned rows in every operand."""
    per_16_bytes = 16 // x.element_size()
    return hasattr(torch, "_grouped_mm") and all(w.shape[1] % per_16_bytes == 0 and w.shape[2] % per_16_bytes == 0
                                                  for w in weights)


def use_grouped_mm(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Grouped matmuls where torch._grouped_mm's fast path runs: CUDA, bf16 (sm90+ in torch's
    GroupedBlas.cpp; elsewhere it falls back to one mm a group after copying offs to the host)."""
    return x.is_cuda and x.dtype == torch.bfloat16 and _grouped_mm_fits(x, *weights)


def expert_offsets(sorted_experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(E,) int32: the end of each expert's slice of the expert-sorted assignments, i.e.
    cumsum(bincount), as torch._grouped_mm takes it (`offs`: 1-D int32 on the device, in torch
    2.11 and 2.13 alike). Computed on the device without a host read: `torch.bincount` on CUDA
    reads the ids' min and max on the host to size its output (two syncs); a search of the sorted
    ids for every expert id has a fixed output size and can be captured in a CUDA graph."""
    ids = torch.arange(num_experts, device=sorted_experts.device, dtype=sorted_experts.dtype)
    return torch.searchsorted(sorted_experts, ids, right=True, out_int32=True)


def grouped_expert_mlps(xs: torch.Tensor, sorted_experts: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor,
                        activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """ys[i] = w_out[e] @ activation(w_in[e] @ xs[i]) with e = sorted_experts[i], for assignments
    sorted by expert: one torch._grouped_mm a projection, offsets on the device (no host sync).
    Without grouped matmuls, `weighted_expert_rows` runs one matmul pair an expert."""
    offsets = expert_offsets(sorted_experts, w_in.shape[0])
    hidden = activation(torch._grouped_mm(xs, w_in.transpose(1, 2), offs=offsets))
    return torch._grouped_mm(hidden, w_out.transpose(1, 2), offs=offsets)


def weighted_expert_rows(x: torch.Tensor, token: torch.Tensor, sorted_experts: torch.Tensor,
                         sorted_weights: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor,
                         activation: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Row i = sorted_weights[i] * w_out[e] @ activation(w_in[e] @ x[token[i]]), e = sorted_experts[i],
    for assignments sorted by expert, in the dtype x and the weights promote to: one matmul pair an
    expert, each expert gathering its own tokens and weighting its rows while they are in cache, so
    no (T*k, H) gathered input and no second pass to weight it. sorted_weights (T*k, 1). The same
    products as gathering all rows first, then weighting them; on a 16K-token
    granite-small-cpu prefill in bf16 (32 experts, top 6, T*k = 49,152 rows a chunk) the two
    (T*k, H) passes took 0.36 s of 3.7 s, one thread."""
    out = torch.empty(token.numel(), w_out.shape[1], device=x.device,
                      dtype=torch.promote_types(x.dtype, sorted_weights.dtype))
    pieces = [] if torch.is_grad_enabled() else None  # out= records no gradient: concatenate then
    start = 0
    # one host read a layer (free on the CPU; on a GPU only where grouped matmuls do not run)
    for e, n in enumerate(torch.bincount(sorted_experts, minlength=w_in.shape[0]).tolist()):
        if n:
            rows = slice(start, start + n)
            ye = linear(activation(linear(x.index_select(0, token[rows]), w_in[e])), w_out[e])
            if pieces is None:
                torch.mul(ye, sorted_weights[rows], out=out[rows])
            else:
                pieces.append(ye * sorted_weights[rows])
            start += n
    return out if pieces is None else torch.cat(pieces) if pieces else out


def run_experts(x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor, w_in: torch.Tensor,
                w_out: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor],
                grouped: bool | None = None) -> torch.Tensor:
    """sum_j weights[t, j] * expert_{index[t, j]}(x[t]) for every token t.

    x (T, H); weights, index (T, k); expert e is w_out[e] @ activation(w_in[e] @ x) with w_in
    (E, U, H), w_out (E, H, I) and activation (.., U) -> (.., I). `grouped` None: grouped matmuls
    where `use_grouped_mm` (no host sync then), the per-expert loop otherwise; True forces them
    (the CPU build has them too, which is how they are tested).
    """
    T, k = index.shape
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # assignments grouped by expert, token order within
    token = order.div(k, rounding_mode="floor")
    sorted_weights = weights.reshape(-1)[order].unsqueeze(-1)
    if grouped is None:
        grouped = use_grouped_mm(x, w_in, w_out)
    if grouped:
        ys = grouped_expert_mlps(x.index_select(0, token), flat[order], w_in, w_out, activation)
        ys = ys * sorted_weights
    else:
        ys = weighted_expert_rows(x, token, flat[order], sorted_weights, w_in, w_out, activation)
    return torch.zeros_like(x).index_add_(0, token, ys)


class GatedExperts(nn.Module):
    """num_experts SwiGLU MLPs stacked: gate_up_proj (E, 2I, H) with the gate rows first, down_proj (E, H, I)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return run_experts(x, weights, index, self.gate_up_proj, self.down_proj, swiglu_halves)


class SparseMoE(nn.Module):
    """Router + gated experts: (T, H) -> (T, H)."""

    def __init__(self, hidden_size: int, moe: MoEConfig):
        super().__init__()
        self.router = ROUTERS[moe.router](hidden_size, moe.num_experts, moe.top_k)
        self.experts = GatedExperts(hidden_size, moe.intermediate_size, moe.num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, index = self.router(x)
        return self.experts(x, weights, index)
