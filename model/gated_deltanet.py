"""The Gated DeltaNet mixer of Qwen3-Next ("linear_attention" layers), as transformers'
`Qwen3NextGatedDeltaNet` computes it:

    in_proj_qkvz -> per key head [q | k | v (HV/HK heads) | z (HV/HK heads)];  in_proj_ba -> [b | a]
    [q | k | v] -> causal depthwise conv (no bias) + silu
    beta = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)            (fp32 log decay)
    o = gated_delta_rule(q, k, v, g, beta)     (l2-normalised q and k, scale K^-0.5: kernels.contracts.gated_delta)
    out_proj(rmsnorm(o) * weight * silu(z))   per value head: normalise first, then gate

Per sequence the mixer carries two states, like the Mamba-2 mixer: the conv state (the last
kernel - 1 inputs of [q | k | v], before the conv) and the delta-rule state (HV, K, V) fp32. Both
come from and go to the model's state pools (`model.cache.ModelCache`, keyed by layer index), so
captures and snapshots hold them exactly as they hold a Mamba layer's (`MixerStates`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import HybridConfig
from model.linear import Linear
from model.mamba2 import MixerStates


class NormThenGateRMSNorm(nn.Module):
    """Qwen3-Next's gated norm: weight * rmsnorm(y) rounded to y's dtype, times silu(gate) in fp32
    (transformers' `Qwen3NextRMSNormGated`: the statistics of y alone, over one head's channels;
    Mamba-2's `GatedRMSNorm` gates first)."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        y32 = y.float()
        y32 = y32 * torch.rsqrt(y32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * y32.to(y.dtype)
        return (out * F.silu(gate.float())).to(y.dtype)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet mixer. `forward` runs packed prefill chunks from given initial states and
    returns the final states plus any captured at requested offsets; `forward_decode` steps one
    token per row against the state pools in place."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.rep = self.num_v_heads // self.num_k_heads
        self.conv_dim = config.linear_conv_dim
        self.in_proj_qkvz = Linear(config.hidden_size, 2 * self.key_dim + 2 * self.value_dim, bias=False)
        self.in_proj_ba = Linear(config.hidden_size, 2 * self.num_v_heads, bias=False)
        # nn.Conv1d only to hold HF's parameter shape ((conv_dim, 1, kernel) weight); the conv runs in the backend.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, config.linear_conv_kernel_dim, groups=self.conv_dim,
                                bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = NormThenGateRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, config.hidden_size, bias=False)

    # pieces shared by the sequence and decode paths ---------------------------------------------
    def _project(self, hidden: torch.Tensor):
        """(T, hidden) -> mixed [q | k | v] (T, conv_dim) for the conv, z (T, HV, V), b and a (T, HV).
        The projections are grouped by key head (transformers' `fix_query_key_value_ordering`)."""
        T, HK, K, V, r = hidden.shape[0], self.num_k_heads, self.head_k_dim, self.head_v_dim, self.rep
        qkvz = self.in_proj_qkvz(hidden).view(T, HK, 2 * K + 2 * r * V)
        q, k, v, z = qkvz.split([K, K, r * V, r * V], dim=-1)
        b, a = self.in_proj_ba(hidden).view(T, HK, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat((q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)), dim=-1)
        return (mixed, z.reshape(T, self.num_v_heads, V), b.reshape(T, self.num_v_heads),
                a.reshape(T, self.num_v_heads))

    def _rule_inputs(self, mixed: torch.Tensor, b: torch.Tensor, a: torch.Tensor):
        """Post-conv [q | k | v] -> q, k (T, HK, K), v (T, HV, V), g (T, HV) fp32, beta (T, HV)."""
        T = mixed.shape[0]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return (q.reshape(T, self.num_k_heads, self.head_k_dim), k.reshape(T, self.num_k_heads, self.head_k_dim),
                v.reshape(T, self.num_v_heads, self.head_v_dim), g, b.sigmoid())

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        T = o.shape[0]
        return self.out_proj(self.norm(o, z).reshape(T, self.value_dim))

    def _weight(self) -> torch.Tensor:
        return self.conv1d.weight.squeeze(1)

    # paths -----------------------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, ops, *, cu_seqlens: torch.Tensor, initial: MixerStates | None = None,
                capture_offsets: list[list[int]] | None = None, conv_plan=None, delta_plan=None):
        """Packed sequences (T, hidden) -> (out (T, hidden), final MixerStates (S, ...), captured MixerStates (K, ...)).

        `initial` None: every sequence starts from zero state; else gathered (S, ...) conv and
        delta-rule states. Captured states are packed by sequence, then offset. `conv_plan` and
        `delta_plan`: the step's plans for these lengths (a model step's, `model.batch`); None: each op
        reads `cu_seqlens` on the host itself (one sync a layer)."""
        mixed, z, b, a = self._project(hidden)
        conv = {} if conv_plan is None else {"plan": conv_plan}
        mixed, conv_final, conv_captured = ops.causal_conv1d(
            mixed, self._weight(), None, cu_seqlens=cu_seqlens, initial_states=None if initial is None else initial.conv,
            capture_offsets=capture_offsets, activation="silu", **conv)
        q, k, v, g, beta = self._rule_inputs(mixed, b, a)
        o, final, captured = ops.gated_delta_rule(
            q, k, v, g, beta, cu_seqlens=cu_seqlens, initial_states=None if initial is None else initial.ssm,
            capture_offsets=capture_offsets, **({} if delta_plan is None else {"plan": delta_plan}))
        return self._output(o, z), MixerStates(conv_final, final), MixerStates(conv_captured, captured)

    def forward_decode(self, hidden: torch.Tensor, ops, *, conv_pool: torch.Tensor, ssm_pool: torch.Tensor,
                       slot_idx: torch.Tensor, check_slots: bool = True, **pad) -> torch.Tensor:
        """One token per sequence (S, hidden); conv_pool/ssm_pool rows `slot_idx` are advanced in place.
        `pad_slots=True` (triton backend): -1 marks a pad row."""
        mixed, z, b, a = self._project(hidden)
        mixed = ops.conv1d_decode_step(mixed, conv_state_pool=conv_pool, weight=self._weight(), bias=None,
                                       slot_idx=slot_idx, activation="silu", check_slots=check_slots, **pad)
        q, k, v, g, beta = self._rule_inputs(mixed, b, a)
        o = ops.gated_delta_decode_step(q, k, v, g, beta, state_pool=ssm_pool, slot_idx=slot_idx,
                                        check_slots=check_slots, **pad)
        return self._output(o, z)
