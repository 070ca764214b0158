"""The Mamba-2 mixer of the Bamba layout.

    in_proj -> [gate z | xBC | dt];  xBC -> causal depthwise conv + silu -> [x | B | C]
    y = SSD(x, dt, A = -exp(A_log), B, C, D, dt_bias);  out_proj(gated_group_rmsnorm(y, z))

Per sequence the mixer carries two pieces of state: the conv state (the last d_conv - 1 inputs
of xBC, before the conv) and the SSM state (H, P, N) in fp32. Both come from and go to pools
indexed by a sequence's state slot; the kernels do the gathering, so nothing here loops over
sequences.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from model.config import HybridConfig
from model.linear import Linear
from model.norms import GatedRMSNorm


class MixerStates(NamedTuple):
    """One Mamba layer's recurrent state: the causal conv's last d_conv - 1 inputs and the SSD state."""

    conv: torch.Tensor  # (S or K, conv_dim, d_conv - 1)
    ssm: torch.Tensor  # (S or K, H, P, N) fp32


class Mamba2Mixer(nn.Module):
    """One Mamba-2 mixer: in-projection, causal conv, SSD scan, gated RMSNorm, out-projection.
    `forward` runs packed prefill chunks from given initial states and returns the final states
    plus any captured at requested offsets; `forward_decode` steps one token per row against the
    state pools in place."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        self.num_heads = config.mamba_n_heads
        self.head_dim = config.mamba_d_head
        self.n_groups = config.mamba_n_groups
        self.d_state = config.mamba_d_state
        self.d_inner = config.mamba_d_inner
        self.conv_dim = config.conv_dim
        self.dt_limit = config.time_step_limit
        self.chunk_size = config.mamba_chunk_size
        self.in_proj = Linear(config.hidden_size, self.d_inner + self.conv_dim + self.num_heads,
                              bias=config.mamba_proj_bias)
        # nn.Conv1d only to hold HF's parameter shapes ((conv_dim, 1, d_conv) weight); the conv runs in the backend.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, config.mamba_d_conv, groups=self.conv_dim,
                                bias=config.mamba_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.D = nn.Parameter(torch.ones(self.num_heads))
        self.norm = GatedRMSNorm(self.d_inner, group_size=self.d_inner // self.n_groups, eps=config.rms_norm_eps)
        self.out_proj = Linear(self.d_inner, config.hidden_size, bias=config.mamba_proj_bias)

    # pieces shared by the sequence and decode paths ---------------------------------------------
    def _split_projection(self, hidden: torch.Tensor):
        return self.in_proj(hidden).split([self.d_inner, self.conv_dim, self.num_heads], dim=-1)

    def _ssm_inputs(self, xbc: torch.Tensor):
        """Post-conv xBC (T, conv_dim) -> x (T, H, P), B and C (T, G, N)."""
        T = xbc.shape[0]
        gn = self.n_groups * self.d_state
        x, B, C = xbc.split([self.d_inner, gn, gn], dim=-1)
        return (x.reshape(T, self.num_heads, self.head_dim), B.reshape(T, self.n_groups, self.d_state),
                C.reshape(T, self.n_groups, self.d_state))

    def _ssm_kwargs(self) -> dict:
        return dict(D=self.D, dt_bias=self.dt_bias, dt_softplus=True, dt_limit=self.dt_limit)

    def _A(self) -> torch.Tensor:
        return -torch.exp(self.A_log.float())

    def _output(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.norm(y.reshape(y.shape[0], self.d_inner), gate).to(gate.dtype))

    # paths -----------------------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, ops, *, cu_seqlens: torch.Tensor, initial: MixerStates | None = None,
                capture_offsets: list[list[int]] | None = None, conv_plan=None, ssd_plan=None, ssm_pool=None,
                ssm_slots=None, conv_pool=None, conv_slots=None):
        """Packed sequences (T, hidden) -> (out (T, hidden), final MixerStates (S, ...), captured MixerStates (K, ...)).

        `initial` None means every sequence starts from zero state; captured states are packed by
        sequence, then offset, in the order the kernels return them. `conv_plan`/`ssd_plan`: the
        step's host-built kernel plans (`model.batch.pack_rows`), None to let the ops plan.
        `ssm_pool`/`ssm_slots` (backends with `capabilities.scan_state_pool`): the SSM states are read from and
        written back to the pool by the scan itself; `initial.ssm` is then unused and the final
        MixerStates' ssm is the pool. `conv_pool`/`conv_slots` (backends with `capabilities.conv_state_pool`):
        the same for the conv states, `initial.conv` unused and the final conv the pool.
        """
        gate, xbc, dt = self._split_projection(hidden)
        conv = {} if conv_plan is None else {"plan": conv_plan}
        if conv_pool is not None:
            conv.update(state_pool=conv_pool, state_slots=conv_slots)
        xbc, conv_final, conv_captured = ops.causal_conv1d(
            xbc, self.conv1d.weight.squeeze(1), self.conv1d.bias, cu_seqlens=cu_seqlens,
            initial_states=None if initial is None or conv_pool is not None else initial.conv,
            capture_offsets=capture_offsets, activation="silu", **conv)
        x, B, C = self._ssm_inputs(xbc)
        chunk = {"chunk_size": self.chunk_size} if ops.capabilities.scan_chunk_from_config else {}
        if ssd_plan is not None:
            chunk["plan"] = ssd_plan
        if ssm_pool is not None:
            chunk.update(state_pool=ssm_pool, state_slots=ssm_slots)
        y, ssm_final, ssm_captured = ops.ssd_scan(
            x, dt, self._A(), B, C, cu_seqlens=cu_seqlens,
            initial_states=None if initial is None or ssm_pool is not None else initial.ssm,
            capture_offsets=capture_offsets, **self._ssm_kwargs(), **chunk)
        return self._output(y, gate), MixerStates(conv_final, ssm_final), MixerStates(conv_captured, ssm_captured)

    def forward_decode(self, hidden: torch.Tensor, ops, *, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                       slot_idx: torch.Tensor, check_slots: bool = True, **pad) -> torch.Tensor:
        """One token per sequence (S, hidden); conv_pool/ssm_pool rows `slot_idx` are advanced in place.
        `check_slots=False`: the slots were checked on the host (no device read); `pad_slots=True`
        (triton backend): -1 marks a pad row."""
        gate, xbc, dt = self._split_projection(hidden)
        xbc = ops.conv1d_decode_step(xbc, conv_state_pool=conv_pool, weight=self.conv1d.weight.squeeze(1),
                                     bias=self.conv1d.bias, slot_idx=slot_idx, activation="silu",
                                     check_slots=check_slots, **pad)
        x, B, C = self._ssm_inputs(xbc)
        y = ops.ssd_decode_step(x, dt, self._A(), B, C, state_pool=ssm_pool, slot_idx=slot_idx,
                                check_slots=check_slots, **self._ssm_kwargs(), **pad)
        return self._output(y, gate)
