"""Qwen3-Next's gated attention: GQA attention (`model.attention.Attention`, both paths) with

    q_proj -> per head [query (head_dim) | gate (head_dim)]
    q, k   -> zero-centred RMSNorm over each head's channels (q_norm, k_norm), then partial RoPE
    out    =  o_proj(attention(q, k, v) * sigmoid(gate))

as transformers' `Qwen3NextAttention`. Only the projections and the output differ from the shared
layer, so the paged cache, the kernels and the plans are the shared ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.attention import Attention, PagedAttentionInputs
from model.config import HybridConfig
from model.linear import Linear
from model.norms import RMSNorm
from model.rope import apply_rope


class GatedAttention(Attention):
    """`Attention` with an output gate and per-head q/k norms (see the module docstring)."""

    def __init__(self, config: HybridConfig):
        super().__init__(config)
        self.q_proj = Linear(config.hidden_size, 2 * self.num_heads * self.head_dim, bias=config.attention_bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centred=config.rms_norm_zero_centred)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, zero_centred=config.rms_norm_zero_centred)

    def _gated_qkv(self, x: torch.Tensor, cos, sin):
        T = x.shape[0]
        q, gate = self.q_proj(x).view(T, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(T, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return q, k, v, gate.reshape(T, self.num_heads * self.head_dim)

    def _gated_output(self, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.o_proj(out.reshape(gate.shape) * torch.sigmoid(gate))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v, gate = self._gated_qkv(x, cos, sin)
        group = self.num_heads // self.num_kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=self.scale)
        return self._gated_output(out.transpose(0, 1), gate)

    def forward_paged(self, x, cos, sin, key_cache, value_cache, meta: PagedAttentionInputs, ops) -> torch.Tensor:
        q, k, v, gate = self._gated_qkv(x, cos, sin)
        ops.write_kv_cache(k, v, key_cache, value_cache, meta.slot_mapping, check_slots=False)
        planned = {} if meta.plan is None else {"plan": meta.plan}
        out = ops.paged_attention(q, key_cache, value_cache, meta.block_tables, meta.seq_lens, meta.cu_seqlens_q,
                                  scale=self.scale, **planned)
        return self._gated_output(out, gate)
