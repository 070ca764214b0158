"""The model's inference memory: a paged KV cache per attention layer and recurrent/conv state pools
per state layer (Mamba-2: conv (conv_dim, d_conv - 1) and SSM (H, P, N); Gated DeltaNet: conv
(linear_conv_dim, kernel - 1) and delta-rule state (HV, K, V); both in the same two dicts).

KV is paged (blocks of `block_size` tokens, shared between sequences by the engine's block
tables). SSM state is not pageable: a sequence owns one *state slot*, a row of every Mamba
layer's pools, and a snapshot is a copy of that row (`read_state`), restorable into any slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.checks import require
from model.config import HybridConfig


@dataclass
class SSMState:
    """One sequence's recurrent state at one position: per state layer (Mamba-2 or Gated DeltaNet,
    in layer order) its conv state and its recurrent state (Mamba: (H, P, N); DeltaNet: (HV, K, V)) fp32."""

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.ssm))

    def clone(self) -> "SSMState":
        return SSMState([t.clone() for t in self.conv], [t.clone() for t in self.ssm])


class ModelCache:
    """Paged KV blocks per attention layer and one state slot per sequence in every Mamba layer's pools."""

    def __init__(self, config: HybridConfig, num_blocks: int, block_size: int, num_state_slots: int,
                 dtype: torch.dtype, device: torch.device | str):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_state_slots", num_state_slots)):
            require(isinstance(value, int) and value >= 1, name, f"must be a positive int, got {value!r}")
        self.config = config
        self.num_blocks, self.block_size, self.num_state_slots = num_blocks, block_size, num_state_slots
        self.dtype, self.device = dtype, torch.device(device)
        kv_shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        # Keyed by model layer index, so a layer finds its own tensors without a second numbering.
        self.key_cache = {i: torch.zeros(kv_shape, dtype=dtype, device=device) for i in config.attn_layer_indices}
        self.value_cache = {i: torch.zeros(kv_shape, dtype=dtype, device=device) for i in config.attn_layer_indices}
        shapes = {  # layer kind -> (conv state, recurrent state) of one slot
            "mamba": ((config.conv_dim, config.mamba_d_conv - 1),
                      (config.mamba_n_heads, config.mamba_d_head, config.mamba_d_state)),
            "linear_attention": ((config.linear_conv_dim, config.linear_conv_kernel_dim - 1),
                                 (config.linear_num_value_heads, config.linear_key_head_dim,
                                  config.linear_value_head_dim)),
        }
        self.conv_pool, self.ssm_pool = {}, {}
        for i in config.state_layer_indices:
            conv_shape, ssm_shape = shapes[config.layer_types[i]]
            self.conv_pool[i] = torch.zeros((num_state_slots, *conv_shape), dtype=dtype, device=device)
            self.ssm_pool[i] = torch.zeros((num_state_slots, *ssm_shape), dtype=torch.float32, device=device)

    def read_state(self, slot: int) -> SSMState:
        """A detached copy of every state layer's (conv, ssm) state at `slot`."""
        require(isinstance(slot, int) and 0 <= slot < self.num_state_slots, "state_slot",
                f"must be an int in 0 .. {self.num_state_slots - 1}, got {slot!r}")
        layers = self.config.state_layer_indices
        return SSMState([self.conv_pool[i][slot].clone() for i in layers], [self.ssm_pool[i][slot].clone() for i in layers])

    def write_state(self, slot: int, state: SSMState) -> None:
        """Restore a snapshot into `slot` (copies; the snapshot stays usable)."""
        require(isinstance(slot, int) and 0 <= slot < self.num_state_slots, "state_slot",
                f"must be an int in 0 .. {self.num_state_slots - 1}, got {slot!r}")
        layers = self.config.state_layer_indices
        require(len(state.conv) == len(layers) and len(state.ssm) == len(layers), "state",
                f"expected {len(layers)} state layers, got {len(state.conv)} conv / {len(state.ssm)} ssm tensors")
        for i, conv, ssm in zip(layers, state.conv, state.ssm):
            require(conv.shape == self.conv_pool[i].shape[1:] and ssm.shape == self.ssm_pool[i].shape[1:], "state",
                    f"layer {i} shapes {tuple(conv.shape)}/{tuple(ssm.shape)} do not match the "
                    f"pools {tuple(self.conv_pool[i].shape[1:])}/{tuple(self.ssm_pool[i].shape[1:])}")
            self.conv_pool[i][slot].copy_(conv)
            self.ssm_pool[i][slot].copy_(ssm)

    def reset_state(self, slot: int) -> None:
        """Zero state: a sequence starting at position 0."""
        require(isinstance(slot, int) and 0 <= slot < self.num_state_slots, "state_slot",
                f"must be an int in 0 .. {self.num_state_slots - 1}, got {slot!r}")
        for i in self.config.state_layer_indices:
            self.conv_pool[i][slot].zero_()
            self.ssm_pool[i][slot].zero_()

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes of one snapshot (what `read_state` copies)."""
        return sum(self.conv_pool[i][0].nbytes + self.ssm_pool[i][0].nbytes for i in self.config.state_layer_indices)
