"""What a forward, a snapshot save and a restore cost at a real model's shapes, on a roofline.

Counts: `model.cost.ModelCost` (weights, conv taps, SSD scan or chunked delta rule, attention to the
prefix, the LM head once per row on its last token; snapshot, KV and weight bytes), in bf16 (2 bytes
each, the recurrent states too: vLLM 0.32's default, `mamba_ssm_cache_dtype` "auto" = the model's
dtype, for Mamba-2 and Gated DeltaNet layers alike; this codebase's engine keeps them in fp32).
This module adds what moving them takes:
* bytes of one forward: every weight once (MoE: all experts, a batch touches most of them), each
  row's KV prefix read once and its new KV written, each row's recurrent state (every Mamba or
  Gated DeltaNet layer's) read and written;
* a snapshot save or restore copies one state: read + write, 2 x its bytes; an in-launch capture
  writes it once.

Time = max(FLOPs / peak FLOP/s, bytes / copy bandwidth) per forward (a roofline; no overlap of
separate copies). The H200 figures are the brief's (section 4): dense bf16 ~790 TFLOP/s measured
on random data, ~4.3 TB/s measured by a large copy. No GPU result of this codebase exists, so
every time is labelled simulated.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

from kernels.checks import require
from model.config import HybridConfig
from model.families import PRESETS
from model.cost import ModelCost
from model.engine.settings import ModelShape
from model.engine.snapshot_codec import DEFAULT_SNAPSHOT_DTYPE
from model.engine.snapshot_codec import snapshot_bytes as stored_snapshot_bytes

DTYPE_BYTES = 2  # bf16
# --model name -> preset. Qwen3-Next-80B-A3B: 36 Gated DeltaNet layers (a state of 32 value heads x
# 128 x 128 and a conv of 8,192 x 3 each) and 12 gated-attention layers (2 KV heads of 256).
SHAPES = {"bamba-9b": "bamba-9b", "granite-4.0-h-small": "granite-4.0-h-small", "nemotron-h-8b": "nemotron-h-8b",
          "qwen3-next-80b": "qwen3-next-80b-a3b"}


@dataclasses.dataclass(frozen=True)
class Roofline:
    """A device as two ceilings."""

    name: str
    flops_per_s: float
    bytes_per_s: float


H200 = Roofline("H200 (brief section 4: 790 TFLOP/s bf16 dense, 4.3 TB/s copy), simulated", 790e12, 4.3e12)


@dataclasses.dataclass(frozen=True)
class ShapeCost:
    """Per-token and per-forward costs of one model shape: the counts are `model.cost.ModelCost`'s
    (`counts`) in bf16 (each computed once), the times this module's roofline."""

    name: str
    counts: ModelCost
    roofline: Roofline = H200

    @classmethod
    def from_preset(cls, name: str, roofline: Roofline = H200) -> "ShapeCost":
        require(name in SHAPES, "shape", f"must be one of {sorted(SHAPES)}, got {name!r}")
        return cls.from_config(name, PRESETS[SHAPES[name]], roofline)

    @classmethod
    def from_config(cls, name: str, c: HybridConfig, roofline: Roofline = H200) -> "ShapeCost":
        return cls(name, ModelCost(c), roofline)

    # the counts, in bf16 --------------------------------------------------------------------------
    @functools.cached_property
    def weight_bytes(self) -> float:
        """Every matrix held (MoE: all experts), the embedding and an untied head."""
        return float(self.counts.weight_bytes(DTYPE_BYTES))

    @functools.cached_property
    def flops_per_token(self) -> float:
        """Weights, conv taps and SSD scan / delta rule of one token; attention and head apart."""
        return float(self.counts.flops_per_token)

    @functools.cached_property
    def head_flops(self) -> float:
        """The LM head, once per row."""
        return float(self.counts.head_flops)

    @property
    def attention_layers(self) -> int:
        return self.counts.attention_layers

    @property
    def attention_width(self) -> int:
        """Heads x head_dim of the queries."""
        return self.counts.attention_width

    @functools.cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V of every attention layer."""
        return self.counts.kv_bytes_per_token(DTYPE_BYTES)

    @functools.cached_property
    def kv_bytes_per_token_layer(self) -> int:
        return self.counts.kv_bytes_per_token_layer(DTYPE_BYTES)

    @functools.cached_property
    def state_bytes(self) -> int:
        """One snapshot: every Mamba layer's conv + SSM state, every Gated DeltaNet layer's conv +
        delta-rule state."""
        return self.counts.snapshot_bytes(DTYPE_BYTES)

    def snapshot_bytes(self, snapshot_dtype: str = DEFAULT_SNAPSHOT_DTYPE) -> int:
        """One snapshot as the store counts it when stored in `snapshot_dtype`
        (`model.engine.snapshot_codec`): the states here are bf16, so float32 and bfloat16 keep
        `state_bytes`; float8_e4m3fn halves it, plus a 4-byte scale per tensor (2 a layer)."""
        c = self.counts.config
        mamba = (c.conv_dim * (c.mamba_d_conv - 1), c.mamba_n_heads * c.mamba_d_head * c.mamba_d_state)
        delta = (c.linear_conv_dim * (c.linear_conv_kernel_dim - 1),
                 c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim)
        tensors = [(n, DTYPE_BYTES) for kind, per_layer in (("mamba", mamba), ("linear_attention", delta))
                   for _ in range(sum(t == kind for t in c.layer_types)) for n in per_layer]
        return stored_snapshot_bytes(tensors, snapshot_dtype)

    @functools.cached_property
    def state_bytes_layer(self) -> int:
        return self.counts.state_bytes_per_layer(DTYPE_BYTES)

    @property
    def kernel_chunk(self) -> int:
        """The recurrent scan's chunk (SSD: mamba_chunk_size; delta rule: 64 in bf16), `ModelShape.of`'s."""
        return self.model_shape.kernel_chunk

    def snapshot_flops(self, position: int) -> float:
        """What a hit on a snapshot at `position` spares (`ModelCost.snapshot_flops`): the engine's stamp."""
        return self.counts.snapshot_flops(position)

    # the roofline ---------------------------------------------------------------------------------
    @functools.cached_property
    def model_shape(self) -> ModelShape:
        """What the policies' engine defaults read of this shape (vLLM's block, the kernel chunk), in bf16."""
        return ModelShape.of(self.counts.config, DTYPE_BYTES)

    @property
    def vllm_block(self) -> int:
        """vLLM 0.32's padded hybrid block for this shape (16-token attention kernel block)."""
        return self.model_shape.vllm_block

    @functools.cached_property
    def _attention_per_key(self) -> float:
        return 4.0 * self.attention_layers * self.attention_width

    def row_flops(self, start: int, n: int) -> float:
        """FLOPs of a row running tokens [start, start + n): weights, scan, attention to its prefix,
        the head once. The value of `ModelCost.prefill_flops(n, start).total` (tests/test_cost_rules.py),
        as one expression over counts computed once: the simulator's hot path (a 64-row forward in
        ~80 us, ~380 us through the term-by-term breakdown)."""
        keys = n * start + n * (n + 1) / 2  # token start + i attends to start + i + 1 keys
        return self.flops_per_token * n + self.head_flops + self._attention_per_key * keys

    def row_bytes(self, start: int, n: int) -> float:
        """Bytes a row moves besides the weights: its KV prefix read, new KV written, state read + written."""
        return self.kv_bytes_per_token * (start + n) + 2.0 * self.state_bytes

    def forward_s(self, rows: Sequence[tuple[int, int]]) -> float:
        """Simulated seconds of one batched forward over rows (start, n): `row_flops` and `row_bytes`
        summed in row order, their expressions inlined (the same operations in the same order, so the
        same bits: a 52-row decode tick of the whole trace, 80 K of them)."""
        fpt, head, per_key = self.flops_per_token, self.head_flops, self._attention_per_key
        kv, state2 = self.kv_bytes_per_token, 2.0 * self.state_bytes
        flops = moved_rows = 0
        for s, n in rows:
            flops += fpt * n + head + per_key * (n * s + n * (n + 1) / 2)
            moved_rows += kv * (s + n) + state2
        moved = self.weight_bytes + moved_rows
        return max(flops / self.roofline.flops_per_s, moved / self.roofline.bytes_per_s)

    @property
    def copy_s(self) -> float:
        """A snapshot save or restore: one state read and written."""
        return 2.0 * self.state_bytes / self.roofline.bytes_per_s

    def kv_copy_s(self, rows: int) -> float:
        """A partial KV block copied (copy-on-write): `rows` tokens' K/V of every attention layer
        read and written."""
        return 2.0 * self.kv_bytes_per_token * rows / self.roofline.bytes_per_s

    @property
    def capture_s(self) -> float:
        """An in-launch capture: one state written."""
        return self.state_bytes / self.roofline.bytes_per_s

    def summary(self) -> dict:
        return {"shape": self.name, "weight_bytes": self.weight_bytes, "flops_per_token": self.flops_per_token,
                "state_bytes": self.state_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
                "vllm_block": self.vllm_block, "kernel_chunk": self.kernel_chunk, "roofline": self.roofline.name,
                "save_or_restore_s": self.copy_s, "capture_s": self.capture_s}
