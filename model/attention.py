"""GQA self-attention with partial RoPE (or none): a plain causal path (SDPA) and a paged-KV path.

Tokens are packed: x is (T, hidden) for one sequence (plain path) or for several rows of a
batch (paged path, varlen through `cu_seqlens_q`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from model.config import HybridConfig
from model.linear import Linear
from model.rope import apply_rope


@dataclass
class PagedAttentionInputs:
    """Batch-wide metadata shared by every attention layer of one `forward_batch` call."""

    slot_mapping: torch.Tensor  # (T,) int64: where token t's K/V go, -1 = already cached, skip
    block_tables: torch.Tensor  # (S, max_blocks) int32
    seq_lens: torch.Tensor  # (S,) int32: cached prefix + new tokens
    cu_seqlens_q: torch.Tensor  # (S+1,) int32
    plan: Any = None  # the backend's host-built attention plan for the step (None: the op reads the tensors)


class Attention(nn.Module):
    """One attention layer (GQA, optional RoPE and bias): `forward` over a whole sequence (the
    reference path) and `forward_paged` over a batch of rows whose K/V live in the paged cache
    (prefill chunks over a cached prefix and decode rows, one kernel launch each)."""

    def __init__(self, config: HybridConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.softmax_scale  # head_dim ** -0.5 unless the family sets it (Granite's attention_multiplier)
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=bias)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None):
        """cos/sin None: no position embedding (NoPE)."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(T, self.num_kv_heads, self.head_dim)
        if cos is None:
            return q, k, v
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One sequence from position 0, no cache: causal SDPA (the reference path)."""
        T = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        group = self.num_heads // self.num_kv_heads  # query head h reads KV head h // group, as HF's repeat_kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, scale=self.scale)
        return self.o_proj(out.transpose(0, 1).reshape(T, self.num_heads * self.head_dim))

    def forward_paged(self, x, cos, sin, key_cache, value_cache, meta: PagedAttentionInputs, ops) -> torch.Tensor:
        """Packed rows at any position: write the new K/V into the paged cache, then one varlen call."""
        T = x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        # the slots were built and checked on the host (`model.batch.validate_rows`): no device read
        ops.write_kv_cache(k, v, key_cache, value_cache, meta.slot_mapping, check_slots=False)
        planned = {} if meta.plan is None else {"plan": meta.plan}
        out = ops.paged_attention(q, key_cache, value_cache, meta.block_tables, meta.seq_lens, meta.cu_seqlens_q,
                                  scale=self.scale, **planned)
        return self.o_proj(out.reshape(T, self.num_heads * self.head_dim))
