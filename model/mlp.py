"""Dense feed-forwards: SwiGLU, down(silu(gate(x)) * up(x)), with separate or fused gate/up
projections (Bamba, Granite); and the ungated squared-ReLU MLP, down(relu(up(x))^2) (Nemotron-H's
"-" layers and its MoE experts)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.linear import Linear

CPU_ROW_TILE = 2048  # rows a dense MLP runs at a time on the CPU: its (rows, 2I) product and
# activation stay near the cache instead of streaming (T, 2I) tensors. An 8192-token chunk of
# granite-dense-cpu's MLP (256 -> 2 x 1024 -> 256), one thread, Intel Xeon (AMX): fp32 102 -> 86 ms,
# bf16 26 -> 22 ms; 512-1024 rows within 2% of it, 256 slower (bf16 32 ms); outputs equal there (max diff 0).


def by_row_tiles(f, x: torch.Tensor) -> torch.Tensor:
    """f(x) for a row-wise f, computed CPU_ROW_TILE rows at a time on the CPU."""
    if x.device.type != "cpu" or x.dim() != 2 or x.shape[0] <= CPU_ROW_TILE:
        return f(x)
    return torch.cat([f(x[t:t + CPU_ROW_TILE]) for t in range(0, x.shape[0], CPU_ROW_TILE)])


class SwiGLU(nn.Module):
    """Bamba's MLP: gate_proj, up_proj, down_proj."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return by_row_tiles(lambda t: self.down_proj(F.silu(self.gate_proj(t)) * self.up_proj(t)), x)


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
        return by_row_tiles(lambda t: self.output_linear(swiglu_halves(self.input_linear(t))), x)


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
        return by_row_tiles(lambda t: self.down_proj(relu_squared_(self.up_proj(t))), x)
