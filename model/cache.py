"""The model's inference memory: a paged KV cache per attention layer and SSM/conv state pools per Mamba layer.

KV is paged (blocks of `block_size` tokens, shared between sequences by the engine's block
tables). SSM state is not pageable: a sequence owns one *state slot*, a row of every Mamba
layer's pools, and a snapshot is a copy of that row (`read_state`), restorable into any slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.config import HybridConfig


@dataclass
class SSMState:
    """One sequence's recurrent state at one position: per Mamba layer (in layer order) its
    conv state (conv_dim, d_conv - 1) and SSM state (H, P, N) fp32."""

    conv: list[torch.Tensor]
    ssm: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.ssm))

    def clone(self) -> "SSMState":
        return SSMState([t.clone() for t in self.conv], [t.clone() for t in self.ssm])


class ModelCache:
    def __init__(self, config: HybridConfig, num_blocks: int, block_size: int, num_state_slots: int,
                 dtype: torch.dtype, device: torch.device | str):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_state_slots", num_state_slots)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        self.config = config
        self.num_blocks, self.block_size, self.num_state_slots = num_blocks, block_size, num_state_slots
        self.dtype, self.device = dtype, torch.device(device)
        kv_shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        # Keyed by model layer index, so a layer finds its own tensors without a second numbering.
        self.key_cache = {i: torch.zeros(kv_shape, dtype=dtype, device=device) for i in config.attn_layer_indices}
        self.value_cache = {i: torch.zeros(kv_shape, dtype=dtype, device=device) for i in config.attn_layer_indices}
        conv_shape = (num_state_slots, config.conv_dim, config.mamba_d_conv - 1)
        ssm_shape = (num_state_slots, config.mamba_n_heads, config.mamba_d_head, config.mamba_d_state)
        self.conv_pool = {i: torch.zeros(conv_shape, dtype=dtype, device=device) for i in config.mamba_layer_indices}
        self.ssm_pool = {i: torch.zeros(ssm_shape, dtype=torch.float32, device=device)
                         for i in config.mamba_layer_indices}

    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.num_state_slots:
            raise ValueError(f"state_slot: must be an int in 0 .. {self.num_state_slots - 1}, got {slot!r}")

    def read_state(self, slot: int) -> SSMState:
        """A detached copy of every Mamba layer's (conv, ssm) state at `slot`."""
        self._check_slot(slot)
        layers = self.config.mamba_layer_indices
        return SSMState([self.conv_pool[i][slot].clone() for i in layers], [self.ssm_pool[i][slot].clone() for i in layers])

    def write_state(self, slot: int, state: SSMState) -> None:
        """Restore a snapshot into `slot` (copies; the snapshot stays usable)."""
        self._check_slot(slot)
        layers = self.config.mamba_layer_indices
        if len(state.conv) != len(layers) or len(state.ssm) != len(layers):
            raise ValueError(f"state: expected {len(layers)} Mamba layers, got {len(state.conv)} conv / "
                             f"{len(state.ssm)} ssm tensors")
        for i, conv, ssm in zip(layers, state.conv, state.ssm):
            if conv.shape != self.conv_pool[i].shape[1:] or ssm.shape != self.ssm_pool[i].shape[1:]:
                raise ValueError(f"state: layer {i} shapes {tuple(conv.shape)}/{tuple(ssm.shape)} do not match the "
                                 f"pools {tuple(self.conv_pool[i].shape[1:])}/{tuple(self.ssm_pool[i].shape[1:])}")
            self.conv_pool[i][slot].copy_(conv)
            self.ssm_pool[i][slot].copy_(ssm)

    def reset_state(self, slot: int) -> None:
        """Zero state: a sequence starting at position 0."""
        self._check_slot(slot)
        for i in self.config.mamba_layer_indices:
            self.conv_pool[i][slot].zero_()
            self.ssm_pool[i][slot].zero_()

    @property
    def state_bytes_per_slot(self) -> int:
        """Bytes of one snapshot (what `read_state` copies)."""
        return sum(self.conv_pool[i][0].nbytes + self.ssm_pool[i][0].nbytes for i in self.config.mamba_layer_indices)
