"""Nemotron-H's sparse feed-forward (its "E" layers), computed as transformers' `NemotronHMoE`:

    weights, experts = router(x)                       sigmoid scores, grouped top-k (fp32)
    y = sum_k weights[k] * expert_k(x) + shared(x)     experts: down(relu(up(x))^2), no gate

Routing (`SigmoidGroupedTopKRouter`, DeepSeek-V3 style) repeats transformers' ops one for one,
dtype casts and `torch.topk` calls included, so tied router scores pick the same experts.
The routed experts (`ReluSquaredExperts`) run by sorted token dispatch: the (token, expert)
pairs are sorted by expert, each expert multiplies its contiguous slice in one matmul (a loop
over experts, none over tokens; on a GPU in bf16 one `torch._grouped_mm` a projection, with no
host sync: `model.moe.grouped_expert_mlps`), and each token sums its k weighted outputs in its top-k order
in fp32, as transformers' default `grouped_mm` experts do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels.checks import require
from model.config import HybridConfig, MoEConfig
from model.mlp import ReluSquaredMLP, relu_squared, relu_squared_
from model.moe import grouped_expert_mlps, use_grouped_mm, weighted_expert_rows


class SigmoidGroupedTopKRouter(nn.Module):
    """(T, hidden) -> top-k weights (T, k) fp32 and expert ids (T, k).

    Scores are sigmoid(router logits) in fp32. The selection adds `e_score_correction_bias`
    (load balancing; it never enters the weights), keeps the topk_group groups whose two best
    biased scores sum highest, and takes the top_k biased scores inside them. Weights are the
    unbiased scores of the picks, renormalized if norm_topk_prob, times routed_scaling_factor.
    """

    keep_in_fp32 = True  # model.loading keeps these weights fp32 in a bf16 model, as transformers does

    def __init__(self, hidden_size: int, moe: MoEConfig):
        super().__init__()
        require(moe.router == "sigmoid_grouped_topk", "router", f"expected 'sigmoid_grouped_topk', got {moe.router!r}")
        self.num_experts, self.top_k = moe.num_experts, moe.top_k
        self.n_group, self.topk_group = moe.n_group, moe.topk_group
        self.norm_topk_prob, self.routed_scaling_factor = moe.norm_topk_prob, moe.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(moe.num_experts, hidden_size))
        # A checkpoint tensor (transformers: a buffer); a frozen parameter so loading and saving see it.
        self.e_score_correction_bias = nn.Parameter(torch.zeros(moe.num_experts), requires_grad=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        E, G = self.num_experts, self.n_group
        logits = F.linear(x.float(), self.weight.float())
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias.float()
        group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        experts = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, experts


class ReluSquaredExperts(nn.Module):
    """`num_experts` ungated relu^2 MLPs, stacked: up_proj (E, I, hidden), down_proj (E, hidden, I)."""

    def __init__(self, hidden_size: int, num_experts: int, intermediate_size: int):
        super().__init__()
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x (T, hidden), weights (T, k) fp32, experts (T, k) -> (T, hidden) in x's dtype."""
        T, k = experts.shape
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (T*k,) pair ids grouped by expert
        token = order.div(k, rounding_mode="floor")
        sorted_experts, sorted_weights = flat[order], weights.reshape(-1)[order, None]
        grouped = use_grouped_mm(x, self.up_proj, self.down_proj)  # GPU bf16: offsets on the device, no sync
        if grouped:
            ys = grouped_expert_mlps(x.index_select(0, token), sorted_experts, self.up_proj, self.down_proj,
                                     relu_squared)
            weighted = ys * sorted_weights  # model dtype * fp32 -> fp32
        else:
            weighted = weighted_expert_rows(x, token, sorted_experts, sorted_weights, self.up_proj, self.down_proj,
                                            relu_squared_)
        # back to (token, k) order: pair t*k + j sits at row inverse[t, j] of the sorted ones; the k
        # rows are added in top-k order, the sum of a (T, k, hidden) view's dim 1, bit for bit
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        inverse = inverse.view(T, k)
        out = weighted.index_select(0, inverse[:, 0])
        for j in range(1, k):
            out += weighted.index_select(0, inverse[:, j])
        return out.to(x.dtype)


class NemotronHMoE(nn.Module):
    """Routed relu^2 experts plus one shared relu^2 MLP that every token passes through."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        moe = config.moe
        require(moe is not None, "moe", "a 'moe' layer needs a MoEConfig")
        require(moe.shared_expert_intermediate_size >= 1, "shared_expert_intermediate_size",
                "Nemotron-H's MoE has one shared expert; its width must be >= 1")
        self.gate = SigmoidGroupedTopKRouter(config.hidden_size, moe)
        self.experts = ReluSquaredExperts(config.hidden_size, moe.num_experts, moe.intermediate_size)
        self.shared_experts = ReluSquaredMLP(config.hidden_size, moe.shared_expert_intermediate_size, config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.gate(x)
        return self.experts(x, weights, experts) + self.shared_experts(x)
