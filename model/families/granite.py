"""GraniteMoeHybrid (`model_type` "granitemoehybrid": IBM Granite-4.0-H, transformers'
`GraniteMoeHybridForCausalLM`).

Each layer is a Mamba-2 mixer or GQA attention (RoPE on the whole head, or none: NoPE), then a
feed-forward that is the shared SwiGLU `shared_mlp` alone (dense, num_local_experts 0) or plus
a top-k routed MoE `block_sparse_moe` (softmax over the top-k router logits). Granite's muP
scalings: embeddings * embedding_multiplier, every residual branch * residual_multiplier, the
attention softmax scale is attention_multiplier, logits / logits_scaling.

Field mapping: Granite's `shared_intermediate_size` is our dense MLP width (`intermediate_size`);
its `intermediate_size` is one routed expert's width (`moe.intermediate_size`).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from kernels.checks import require
from model.config import HybridConfig, MoEConfig
from model.families.base import (Family, FeedForward, check_common_fields, mamba_hf_fields, parse_int,
                                 parse_mamba_d_head, parse_time_step_limit, routed_feed_forward)
from model.mlp import FusedSwiGLU
from model.moe import SparseMoE

MODEL_TYPE = "granitemoehybrid"

# transformers' GraniteMoeHybridConfig defaults, for fields a config.json leaves out.
_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                 num_attention_heads=32, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                 embedding_multiplier=1.0, logits_scaling=1.0, residual_multiplier=1.0, attention_multiplier=1.0,
                 num_local_experts=8, num_experts_per_tok=2, shared_intermediate_size=1024, mamba_n_heads=128,
                 mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
                 mamba_conv_bias=True, mamba_proj_bias=False)
_READ = frozenset(_DEFAULTS) | {
    "model_type", "num_key_value_heads", "head_dim", "hidden_act", "layer_types", "layers_block_type",
    "position_embedding_type", "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor",
    "mamba_d_head", "time_step_limit", "quantization_config", "normalization_function",
}
# Granite-only fields that do not change an inference forward (training and init knobs).
_INERT = frozenset({"output_router_logits", "router_aux_loss_coef", "init_method", "num_logits_to_keep"})
# Layer names: transformers v5 writes the new ones, the published checkpoints the legacy ones.
_LAYER_TYPES = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                "full_attention": "attention"}


def _layer_types(hf: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    given = {k: hf[k] for k in ("layer_types", "layers_block_type") if hf.get(k) is not None}
    if not given:  # transformers' default: every layer a Mamba layer
        return ("mamba",) * num_layers
    field, raw = next(iter(given.items()))
    types = []
    for t in raw:
        require(t in _LAYER_TYPES, field, f"unknown layer type {t!r} (expected one of {sorted(_LAYER_TYPES)})")
        types.append(_LAYER_TYPES[t])
    if len(given) == 2:
        require([_LAYER_TYPES.get(t) for t in given["layers_block_type"]] == types, "layers_block_type",
                "disagrees with layer_types")
    require(len(types) == num_layers, field, f"{len(types)} entries for num_hidden_layers={num_layers}")
    return tuple(types)


def _rope(hf: dict[str, Any]) -> tuple[str, float]:
    """(position_embedding, rope_theta). transformers applies RoPE only for "rope", on the whole
    head (it ignores partial_rotary_factor), and NoPE for None or "nope"."""
    kind = hf.get("position_embedding_type")
    require(kind in (None, "nope", "rope"), "position_embedding_type",
            f"expected 'rope', 'nope' or null, got {kind!r}")
    rope = hf.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    if kind != "rope":
        return "none", theta
    require(hf.get("rope_scaling") is None, "rope_scaling", f"only plain RoPE is implemented, got {hf.get('rope_scaling')}")
    require(rope.get("rope_type", rope.get("type", "default")) == "default", "rope_parameters.rope_type",
            f"only 'default' RoPE is implemented, got {rope.get('rope_type', rope.get('type'))!r}")
    unknown = sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    require(not unknown, f"rope_parameters.{unknown[0]}" if unknown else "", f"RoPE field not supported: {unknown}")
    for where, value in (("partial_rotary_factor", hf.get("partial_rotary_factor")),
                         ("rope_parameters.partial_rotary_factor", rope.get("partial_rotary_factor"))):
        require(value in (None, 1.0), where, f"transformers' Granite rotates the whole head; got {value}")
    return "rope", theta


def _check_supported(hf: dict[str, Any]) -> None:
    """Refuse another model type, unknown fields, and activations, quantization or norms we lack."""
    check_common_fields(hf, MODEL_TYPE, _READ, _INERT, "GraniteMoeHybrid")
    require(hf.get("normalization_function", "rmsnorm") == "rmsnorm", "normalization_function",
            f"only 'rmsnorm' is implemented, got {hf.get('normalization_function')!r}")


def _moe(hf: dict[str, Any], get: dict[str, Any]) -> MoEConfig | None:
    """The routed experts beside the shared MLP; None for a dense model (num_local_experts 0)."""
    experts = parse_int(hf, "num_local_experts", get["num_local_experts"])
    require(experts >= 0, "num_local_experts", f"must be >= 0 (0: dense), got {experts}")
    if experts == 0:
        return None
    return MoEConfig(num_experts=experts, top_k=parse_int(hf, "num_experts_per_tok", get["num_experts_per_tok"]),
                     intermediate_size=parse_int(hf, "intermediate_size", get["intermediate_size"]))


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """Map a GraniteMoeHybrid `config.json` dict; unsupported fields or values raise naming the field."""
    _check_supported(hf)
    get = {k: hf.get(k, v) for k, v in _DEFAULTS.items()}
    position, theta = _rope(hf)
    hidden, heads = parse_int(hf, "hidden_size", get["hidden_size"]), parse_int(hf, "num_attention_heads",
                                                                               get["num_attention_heads"])
    kv_heads = hf.get("num_key_value_heads")
    expand = parse_int(hf, "mamba_expand", get["mamba_expand"])
    m_heads = parse_int(hf, "mamba_n_heads", get["mamba_n_heads"])
    d_head = parse_mamba_d_head(hf, expand, hidden, m_heads)
    moe = _moe(hf, get)
    num_layers = parse_int(hf, "num_hidden_layers", get["num_hidden_layers"])
    return HybridConfig(
        model_type=MODEL_TYPE,
        vocab_size=parse_int(hf, "vocab_size", get["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=parse_int(hf, "shared_intermediate_size", get["shared_intermediate_size"]),
        num_hidden_layers=num_layers,
        layer_types=_layer_types(hf, num_layers),
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads) if kv_heads is not None else heads,
        head_dim=int(hf.get("head_dim") or hidden // heads),
        position_embedding=position,
        partial_rotary_factor=1.0,
        rope_theta=theta,
        attention_scale=float(get["attention_multiplier"]),
        attention_bias=bool(get["attention_bias"]),
        mlp_bias=False,
        mamba_n_heads=m_heads,
        mamba_d_head=d_head,
        mamba_n_groups=parse_int(hf, "mamba_n_groups", get["mamba_n_groups"]),
        mamba_d_state=parse_int(hf, "mamba_d_state", get["mamba_d_state"]),
        mamba_d_conv=parse_int(hf, "mamba_d_conv", get["mamba_d_conv"]),
        mamba_expand=expand,
        mamba_chunk_size=parse_int(hf, "mamba_chunk_size", get["mamba_chunk_size"]),
        mamba_conv_bias=bool(get["mamba_conv_bias"]),
        mamba_proj_bias=bool(get["mamba_proj_bias"]),
        time_step_limit=parse_time_step_limit(hf.get("time_step_limit")),
        moe=moe,
        embedding_multiplier=float(get["embedding_multiplier"]),
        residual_multiplier=float(get["residual_multiplier"]),
        logits_scaling=float(get["logits_scaling"]),
        rms_norm_eps=float(get["rms_norm_eps"]),
        tie_word_embeddings=bool(get["tie_word_embeddings"]),
    )


def config_to_hf(c: HybridConfig) -> dict[str, Any]:
    """The `GraniteMoeHybridConfig(**kwargs)` that builds the same model in transformers."""
    require(set(c.layer_types) <= {"mamba", "attention"}, "layer_types",
            f"Granite layers are 'mamba' or 'attention', got {sorted(set(c.layer_types))}")
    require(c.position_embedding == "none" or c.partial_rotary_factor == 1.0, "partial_rotary_factor",
            "transformers' Granite rotates the whole head")
    require(not c.mlp_bias and (c.moe is None or c.moe.router == "softmax_topk"), "moe",
            "Granite's MLPs have no bias and route by softmax over the top-k logits")
    hf = {
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.moe.intermediate_size if c.moe else c.intermediate_size,
        "shared_intermediate_size": c.intermediate_size,
        "num_local_experts": c.moe.num_experts if c.moe else 0,
        "num_experts_per_tok": c.moe.top_k if c.moe else 0,
        "num_hidden_layers": c.num_hidden_layers,
        "layer_types": list(c.layer_types),
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "position_embedding_type": "rope" if c.position_embedding == "rope" else "nope",
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "attention_multiplier": c.softmax_scale,
        "attention_bias": c.attention_bias,
        "embedding_multiplier": c.embedding_multiplier,
        "residual_multiplier": c.residual_multiplier,
        "logits_scaling": c.logits_scaling,
        **mamba_hf_fields(c),
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
    }
    if c.head_dim != c.hidden_size // c.num_attention_heads:
        hf["head_dim"] = c.head_dim
    return hf


class GraniteFeedForward(nn.Module):
    """shared_mlp(x), plus block_sparse_moe(x) when the model has routed experts."""

    def __init__(self, c: HybridConfig):
        super().__init__()
        self.block_sparse_moe = SparseMoE(c.hidden_size, c.moe) if c.moe is not None else None
        self.shared_mlp = FusedSwiGLU(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shared_mlp(x)
        return out if self.block_sparse_moe is None else self.block_sparse_moe(x) + out


def feed_forward(c: HybridConfig, layer_index: int) -> GraniteFeedForward:
    return GraniteFeedForward(c)


def feed_forward_cost(c: HybridConfig, kind: str) -> FeedForward:
    """`shared_mlp` (fused SwiGLU: 2I x H + H x I) after every layer, plus routed SwiGLU experts."""
    shared = 3 * c.hidden_size * c.intermediate_size
    return FeedForward(dense=shared) if c.moe is None else routed_feed_forward(c, shared, 3)


# our name -> the checkpoint's (transformers writes the published names: `input_linear`, `router.layer`)
_RENAMES = [
    (re.compile(r"^final_layernorm\."), "model.norm."),
    (re.compile(r"^layers\.(\d+)\.pre_ff_layernorm\."), r"model.layers.\1.post_attention_layernorm."),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.block_sparse_moe\.router\.weight$"),
     r"model.layers.\1.block_sparse_moe.router.layer.weight"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.block_sparse_moe\.experts\.gate_up_proj$"),
     r"model.layers.\1.block_sparse_moe.input_linear.weight"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\.block_sparse_moe\.experts\.down_proj$"),
     r"model.layers.\1.block_sparse_moe.output_linear.weight"),
    (re.compile(r"^layers\.(\d+)\.feed_forward\."), r"model.layers.\1."),
]


def checkpoint_name(c: HybridConfig, name: str) -> str:
    for pattern, replacement in _RENAMES:
        if pattern.search(name):
            return pattern.sub(replacement, name)
    return name if name.startswith("lm_head.") else f"model.{name}"


# ---- presets ------------------------------------------------------------------------------------
# Granite-4.0-H layer pattern (ibm-granite/granite-4.0-h-tiny config.json, also reported for -small):
# 40 layers, attention at 5, 15, 25, 35, Mamba-2 elsewhere (9:1).
_GRANITE_4_H_LAYERS = tuple("attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40))
# Shared by the Granite-4.0-H configs: NoPE, tied embeddings, vocab 100352, Mamba P = 64,
# N = 128, one group, d_conv 4, chunk 256, rms eps 1e-5, muP embedding 12 / residual 0.22 /
# attention 1/128 (= 1/head_dim). logits_scaling differs per model and is given with each.
_GRANITE_4_H = dict(
    model_type=MODEL_TYPE, vocab_size=100352, num_hidden_layers=40, layer_types=_GRANITE_4_H_LAYERS,
    position_embedding="none", partial_rotary_factor=1.0, head_dim=128, mamba_d_head=64, mamba_n_groups=1,
    mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256, rms_norm_eps=1e-5,
    tie_word_embeddings=True, embedding_multiplier=12.0, residual_multiplier=0.22, attention_scale=0.0078125,
)
# The reduced CPU layouts: Granite's ratios at hidden 256 in six layers (MMMAMM, as "small"),
# head_dim 64 (attention scale 1/64), the same multipliers.
_GRANITE_CPU = dict(
    model_type=MODEL_TYPE, vocab_size=16384, hidden_size=256, num_hidden_layers=6,
    layer_types=("mamba", "mamba", "mamba", "attention", "mamba", "mamba"), num_attention_heads=4,
    num_key_value_heads=1, head_dim=64, position_embedding="none", partial_rotary_factor=1.0,
    mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=256, rms_norm_eps=1e-5, tie_word_embeddings=True, embedding_multiplier=12.0,
    residual_multiplier=0.22, attention_scale=0.015625, logits_scaling=6.0,
)

PRESETS: dict[str, HybridConfig] = {
    # Tests (as "tiny"): MoE with 4 experts, top 2, beside the shared MLP; full-head RoPE so the
    # chunked paths see rotated keys (the real models are NoPE, covered by the parity tests);
    # non-trivial multipliers so a dropped one shows.
    "granite-tiny": HybridConfig(
        model_type="granitemoehybrid", vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        layer_types=("mamba", "attention", "mamba"), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        position_embedding="rope", partial_rotary_factor=1.0, attention_scale=0.125,
        moe=MoEConfig(num_experts=4, top_k=2, intermediate_size=32),
        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=16, embedding_multiplier=4.0, residual_multiplier=0.5, logits_scaling=2.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    # CPU experiments, MoE layout: Granite-4.0-H-Tiny's ratios (64 experts of width H/3, top 6,
    # shared MLP 2H/3) scaled to 32 experts of width 96, top 6, shared 192. 21.8 M parameters
    # (4.2 M of them the tied embedding), 10.3 M active per token.
    "granite-small-cpu": HybridConfig(
        **_GRANITE_CPU, intermediate_size=192, moe=MoEConfig(num_experts=32, top_k=6, intermediate_size=96),
    ),
    # CPU experiments, dense layout (as granite-4.0-h-micro): shared MLP 4H, no experts. 11.4 M parameters.
    "granite-dense-cpu": HybridConfig(**_GRANITE_CPU, intermediate_size=1024),
    # The published shapes, random weights: GPU timing only. Totals here: micro 3.19 B, tiny 6.94 B
    # (1.47 B active), small 32.2 B (8.8 B active), as published (3 B; 7 B / 1 B; 32 B / 9 B).
    # ibm-granite/granite-4.0-h-micro config.json (3B dense): hidden 2048, 16 heads of 128, 4 KV heads,
    # 64 Mamba heads, shared MLP 8192, no experts. From memory of the published file, not confirmed
    # here: hidden/heads/KV heads, shared width, logits_scaling 8.
    "granite-4.0-h-micro": HybridConfig(
        **_GRANITE_4_H, hidden_size=2048, intermediate_size=8192, num_attention_heads=16, num_key_value_heads=4,
        mamba_n_heads=64, logits_scaling=8.0,
    ),
    # ibm-granite/granite-4.0-h-tiny config.json (7B, 1B active): hidden 1536, 12 heads, 4 KV heads,
    # 48 Mamba heads, 64 experts of 512, top 6, shared MLP 1024 (confirmed against a copy of the
    # published file). logits_scaling 6: from memory, not confirmed here.
    "granite-4.0-h-tiny": HybridConfig(
        **_GRANITE_4_H, hidden_size=1536, intermediate_size=1024, num_attention_heads=12, num_key_value_heads=4,
        mamba_n_heads=48, moe=MoEConfig(num_experts=64, top_k=6, intermediate_size=512), logits_scaling=6.0,
    ),
    # ibm-granite/granite-4.0-h-small config.json (32B, 9B active): hidden 4096, 32 heads, 8 KV heads,
    # 72 experts of 768, top 10, shared MLP 1536 (confirmed against a copy of the published file);
    # 128 Mamba heads follow from expand 2 and P = 64. logits_scaling 8: not confirmed here.
    "granite-4.0-h-small": HybridConfig(
        **_GRANITE_4_H, hidden_size=4096, intermediate_size=1536, num_attention_heads=32, num_key_value_heads=8,
        mamba_n_heads=128, moe=MoEConfig(num_experts=72, top_k=10, intermediate_size=768), logits_scaling=8.0,
    ),
}


FAMILY = Family(model_type=MODEL_TYPE, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                feed_forward=feed_forward, checkpoint_name=checkpoint_name, feed_forward_cost=feed_forward_cost,
                presets=PRESETS, architecture="GraniteMoeHybridForCausalLM")
