"""Dense feed-forwards: SwiGLU, down(silu(gate(x)) * up(x)) (Bamba, Granite); and the ungated
squared-ReLU MLP, down(relu(up(x))^2) (Nemotron-H's "-" layers and its MoE experts)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """transformers' "relu2" (ReLUSquaredActivation): square(relu(x)), in x's dtype."""
    return torch.square(F.relu(x))


class ReluSquaredMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(relu_squared(self.up_proj(x)))
