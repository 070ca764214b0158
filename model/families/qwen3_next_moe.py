"""Qwen3-Next's sparse feed-forward, computed as transformers' `Qwen3NextSparseMoeBlock`:

    p = softmax(x W_router^T) over every expert (fp32);  top-k of p, divided by their sum if norm_topk_prob
    y = sum_k p_k * expert_k(x) + sigmoid(x w_gate) * shared_expert(x)

The experts are SwiGLU MLPs stacked as the checkpoints store them, one tensor per expert and
projection (`SeparateGatedExperts`: gate_proj, up_proj (E, I, H), down_proj (E, H, I)), run by
sorted token dispatch (one matmul triple an expert, none per token); the shared expert is a SwiGLU
MLP (gate_proj, up_proj, down_proj) with a one-output sigmoid gate.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.checks import require
from model.config import HybridConfig, MoEConfig
from model.linear import Linear, linear
from model.mlp import SwiGLU


class SoftmaxAllTopKRouter(nn.Module):
    """x (T, H) -> weights (T, k) in x's dtype, expert ids (T, k): the top-k of the softmax over all
    experts' logits, in fp32, renormalized if norm_topk_prob (transformers' `Qwen3NextTopKRouter`)."""

    def __init__(self, hidden_size: int, moe: MoEConfig):
        super().__init__()
        require(moe.router == "softmax_all_topk", "router", f"expected 'softmax_all_topk', got {moe.router!r}")
        self.top_k, self.norm_topk_prob = moe.top_k, moe.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = linear(x, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype), experts


class SeparateGatedExperts(nn.Module):
    """num_experts SwiGLU MLPs, down(silu(gate x) * up x), with gate and up stacked apart (the
    checkpoint's experts.{e}.gate_proj / up_proj / down_proj, each a stack along dim 0)."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """x (T, H), weights and index (T, k) -> sum_j weights[t, j] * expert_{index[t, j]}(x[t])."""
        k = index.shape[1]
        flat = index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # assignments grouped by expert, token order within
        token = order.div(k, rounding_mode="floor")
        xs = x.index_select(0, token)
        ys = xs.new_empty(xs.shape[0], x.shape[1])
        start = 0
        # one host read a layer (free on the CPU)
        for e, n in enumerate(torch.bincount(flat, minlength=self.gate_proj.shape[0]).tolist()):
            if n:
                xe = xs[start:start + n]
                ys[start:start + n] = linear(F.silu(linear(xe, self.gate_proj[e])) * linear(xe, self.up_proj[e]),
                                             self.down_proj[e])
                start += n
        ys = ys * weights.reshape(-1)[order].unsqueeze(-1)
        return torch.zeros_like(x).index_add_(0, token, ys)


class SharedExpertMoE(nn.Module):
    """Routed SwiGLU experts plus one sigmoid-gated shared SwiGLU expert every token passes through."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        moe = config.moe
        require(moe is not None, "moe", "a Qwen3-Next MoE layer needs a MoEConfig")
        require(moe.shared_expert_intermediate_size >= 1, "shared_expert_intermediate_size",
                "Qwen3-Next's MoE has one shared expert; its width must be >= 1")
        self.gate = SoftmaxAllTopKRouter(config.hidden_size, moe)
        self.experts = SeparateGatedExperts(config.hidden_size, moe.intermediate_size, moe.num_experts)
        self.shared_expert = SwiGLU(config.hidden_size, moe.shared_expert_intermediate_size, bias=False)
        self.shared_expert_gate = Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.gate(x)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.experts(x, weights, experts) + shared
