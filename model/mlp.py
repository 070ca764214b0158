"""Dense feed-forwards: SwiGLU, down(silu(gate(x)) * up(x)), with separate or fused gate/up
projections (Bamba, Granite); and the ungated squared-ReLU MLP, down(relu(up(x))^2) (Nemotron-H's
"-" layers and its MoE experts)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.linear import Linear


class SwiGLU(nn.Module):
    """Bamba's MLP: gate_proj, up_proj, down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def swiglu_halves(gate_up: torch.Tensor) -> torch.Tensor:
    """(..., 2I) rows [gate | up] -> silu(gate) * up (..., I)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class FusedSwiGLU(nn.Module):
    """The same MLP with gate and up in one matrix (Granite's shared_mlp): input_linear (2I, H)
    holds the gate rows first, output_linear (H, I); no biases. One matmul instead of two."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.input_linear = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.output_linear = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output_linear(swiglu_halves(self.input_linear(x)))


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """transformers' "relu2" (ReLUSquaredActivation): square(relu(x)), in x's dtype."""
    return torch.square(F.relu(x))


def relu_squared_(x: torch.Tensor) -> torch.Tensor:
    """`relu_squared` in place, for a temporary (a projection's output): the same values, and no
    second (T, I) buffer, whose fresh pages cost as much as the two passes on a CPU. Out of place
    where autograd records (relu's saved output must stay)."""
    if x.requires_grad and torch.is_grad_enabled():
        return relu_squared(x)
    return F.relu_(x).square_()


class ReluSquaredMLP(nn.Module):
    """Nemotron-H's feed-forward: down(relu(up(x))^2), no gate."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(relu_squared_(self.up_proj(x)))
