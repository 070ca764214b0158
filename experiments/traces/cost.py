"""What a forward, a snapshot save and a restore cost at a real model's shapes, on a roofline.

Counts (bf16 weights, KV and states, 2 bytes each; a multiply-add is 2 FLOPs):
* a token through the weights: 2 x active parameters (Mamba in/out projections and conv taps,
  attention q/k/v/o, the dense MLP, or for MoE the top-k experts plus the shared one; the LM head
  runs once per row, on its last token);
* the SSD scan per Mamba layer and token: 4 H P N (B^T x and C h) + Q (G N + H P) (the intra-chunk
  C B^T and its product with x, Q the kernel chunk), as `planner.eviction`;
* attention per layer: 4 x (heads x head_dim) x the keys a token attends to (Q K^T and P V);
* bytes of one forward: every weight once (MoE: all experts, a batch touches most of them), each
  row's KV prefix read once and its new KV written, each row's SSM state read and written;
* a snapshot save or restore copies one state: read + write, 2 x its bytes; an in-launch capture
  writes it once.

Time = max(FLOPs / peak FLOP/s, bytes / copy bandwidth) per forward (a roofline; no overlap of
separate copies). The H200 figures are the brief's (section 4): dense bf16 ~790 TFLOP/s measured
on random data, ~4.3 TB/s measured by a large copy. No GPU result of this codebase exists, so
every time is labelled simulated.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from kernels.checks import require
from model.config import PRESETS, HybridConfig
from planner.placements import vllm_hybrid_block

DTYPE_BYTES = 2  # bf16
SHAPES = {"bamba-9b": "bamba-9b", "granite-4.0-h-small": "granite-4.0-h-small", "nemotron-h-8b": "nemotron-h-8b"}


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A device as two ceilings."""

    name: str
    flops_per_s: float
    bytes_per_s: float


H200 = Roofline("H200 (brief section 4: 790 TFLOP/s bf16 dense, 4.3 TB/s copy), simulated", 790e12, 4.3e12)


def _mlp_params(c: HybridConfig, gated: bool) -> tuple[float, float]:
    """(active, total) parameters of one feed-forward: dense, or routed experts + a shared one."""
    per = 3 if gated else 2
    if c.moe is None:
        n = per * c.hidden_size * c.intermediate_size
        return n, n
    expert = per * c.hidden_size * c.moe.intermediate_size
    shared = per * c.hidden_size * (c.moe.shared_expert_intermediate_size or 0)
    router = c.hidden_size * c.moe.num_experts
    return c.moe.top_k * expert + shared + router, c.moe.num_experts * expert + shared + router


@dataclasses.dataclass(frozen=True)
class ShapeCost:
    """Per-token and per-forward costs of one model shape (module docstring)."""

    name: str
    weight_bytes: float
    flops_per_token: float  # weights + SSD scan, attention excluded
    head_flops: float  # the LM head, once per row
    attention_layers: int
    attention_width: int  # heads x head_dim of the queries
    kv_bytes_per_token: int  # all attention layers, K and V
    kv_bytes_per_token_layer: int
    state_bytes: int  # one snapshot: every Mamba layer's conv + SSM state
    state_bytes_layer: int
    kernel_chunk: int
    roofline: Roofline = H200

    @classmethod
    def from_preset(cls, name: str, roofline: Roofline = H200) -> "ShapeCost":
        require(name in SHAPES, "shape", f"must be one of {sorted(SHAPES)}, got {name!r}")
        return cls.from_config(name, PRESETS[SHAPES[name]], roofline)

    @classmethod
    def from_config(cls, name: str, c: HybridConfig, roofline: Roofline = H200) -> "ShapeCost":
        d_inner, conv_dim, heads = c.mamba_d_inner, c.conv_dim, c.mamba_n_heads
        mamba = c.hidden_size * (2 * d_inner + 2 * c.mamba_n_groups * c.mamba_d_state + heads) \
            + conv_dim * c.mamba_d_conv + d_inner * c.hidden_size
        q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        attention = c.hidden_size * (q_width + 2 * kv_width) + q_width * c.hidden_size
        ssd = 4 * heads * c.mamba_d_head * c.mamba_d_state \
            + c.mamba_chunk_size * (c.mamba_n_groups * c.mamba_d_state + heads * c.mamba_d_head)
        nemotron = c.model_type == "nemotron_h"
        active = total = 0.0
        ssd_flops = 0.0
        n_attn = n_mamba = 0
        for kind in c.layer_types:
            if kind == "mamba":
                active += mamba
                total += mamba
                ssd_flops += ssd
                n_mamba += 1
            elif kind == "attention":
                active += attention
                total += attention
                n_attn += 1
            if kind in ("mlp", "moe") or not nemotron:  # Bamba/Granite: every layer has its feed-forward
                if kind == "moe" or (not nemotron and c.moe is not None):
                    a, t = _mlp_params(c, gated=not nemotron)
                else:
                    a = t = (2 if nemotron else 3) * c.hidden_size * c.intermediate_size
                active += a
                total += t
        embed = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
        state_layer = (conv_dim * (c.mamba_d_conv - 1) + heads * c.mamba_d_head * c.mamba_d_state) * DTYPE_BYTES
        kv_layer = 2 * kv_width * DTYPE_BYTES
        return cls(name=name, weight_bytes=(total + embed) * DTYPE_BYTES, flops_per_token=2 * active + ssd_flops,
                   head_flops=2.0 * c.vocab_size * c.hidden_size, attention_layers=n_attn, attention_width=q_width,
                   kv_bytes_per_token=n_attn * kv_layer, kv_bytes_per_token_layer=kv_layer,
                   state_bytes=n_mamba * state_layer, state_bytes_layer=state_layer,
                   kernel_chunk=c.mamba_chunk_size, roofline=roofline)

    @property
    def vllm_block(self) -> int:
        """vLLM 0.32's padded hybrid block for this shape (16-token attention kernel block)."""
        return vllm_hybrid_block(self.state_bytes_layer, self.kv_bytes_per_token_layer)

    def row_flops(self, start: int, n: int) -> float:
        """FLOPs of a row running tokens [start, start + n): weights, scan, attention to its prefix."""
        keys = n * start + n * (n + 1) / 2  # token start + i attends to start + i + 1 keys
        return self.flops_per_token * n + self.head_flops + 4.0 * self.attention_layers * self.attention_width * keys

    def row_bytes(self, start: int, n: int) -> float:
        """Bytes a row moves besides the weights: its KV prefix read, new KV written, state read + written."""
        return self.kv_bytes_per_token * (start + n) + 2.0 * self.state_bytes

    def forward_s(self, rows: Sequence[tuple[int, int]]) -> float:
        """Simulated seconds of one batched forward over rows (start, n)."""
        flops = sum(self.row_flops(s, n) for s, n in rows)
        moved = self.weight_bytes + sum(self.row_bytes(s, n) for s, n in rows)
        return max(flops / self.roofline.flops_per_s, moved / self.roofline.bytes_per_s)

    @property
    def copy_s(self) -> float:
        """A snapshot save or restore: one state read and written."""
        return 2.0 * self.state_bytes / self.roofline.bytes_per_s

    @property
    def capture_s(self) -> float:
        """An in-launch capture: one state written."""
        return self.state_bytes / self.roofline.bytes_per_s

    def summary(self) -> dict:
        return {"shape": self.name, "weight_bytes": self.weight_bytes, "flops_per_token": self.flops_per_token,
                "state_bytes": self.state_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "vllm_block": self.vllm_block, "kernel_chunk": self.kernel_chunk, "roofline": self.roofline.name,
                "save_or_restore_s": self.copy_s, "capture_s": self.capture_s}
