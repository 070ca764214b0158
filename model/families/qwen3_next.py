"""Qwen3-Next (`model_type` "qwen3_next": Qwen3-Next-80B-A3B, transformers' `Qwen3NextForCausalLM`).

Each layer is a Gated DeltaNet mixer ("linear_attention": `model.gated_deltanet`) or gated
attention ("full_attention": `model.gated_attention`: an output gate, zero-centred q/k norms,
RoPE on the first partial_rotary_factor of each head), then a feed-forward: the MoE with its
sigmoid-gated shared expert (`model.families.qwen3_next_moe`) when the model has experts, else a
dense SwiGLU MLP. Every RMSNorm but the DeltaNet's gated one is zero-centred (x * (1 + w)).

Field mapping: `layer_types` names ours ("linear_attention" stays, "full_attention" is
"attention"); absent, transformers' pattern: full attention every `full_attention_interval`
(4) layers. The MoE's `moe_intermediate_size` is one expert's width (`moe.intermediate_size`);
`intermediate_size` is the dense MLP's. Mixed dense/MoE stacks (`mlp_only_layers`,
`decoder_sparse_step` > 1) are refused, naming the field.
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from kernels.checks import require
from model.config import HybridConfig, MoEConfig
from model.families.base import Family, FeedForward, check_common_fields, parse_int, routed_feed_forward
from model.families.qwen3_next_moe import SharedExpertMoE
from model.mlp import SwiGLU

MODEL_TYPE = "qwen3_next"

# transformers' Qwen3NextConfig defaults (those of Qwen3-Next-80B-A3B), for fields a config.json leaves out.
_DEFAULTS = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                 num_attention_heads=16, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
                 tie_word_embeddings=False, attention_bias=False, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                 linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                 decoder_sparse_step=1, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                 num_experts_per_tok=10, num_experts=512, norm_topk_prob=True)
_READ = frozenset(_DEFAULTS) | {
    "model_type", "hidden_act", "layer_types", "full_attention_interval", "mlp_only_layers", "rope_parameters",
    "rope_theta", "rope_scaling", "partial_rotary_factor", "quantization_config",
}
# Qwen3-Next-only fields that do not change an inference forward: training knobs, and the
# multi-token-prediction head (transformers drops its `mtp.*` weights on load).
_INERT = frozenset({"output_router_logits", "router_aux_loss_coef", "mtp_num_hidden_layers",
                    "mtp_use_dedicated_embeddings"})
_LAYER_TYPES = {"linear_attention": "linear_attention", "full_attention": "attention"}
_HF_LAYER_TYPES = {v: k for k, v in _LAYER_TYPES.items()}


def _layer_types(hf: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    raw = hf.get("layer_types")
    if raw is None:  # transformers' default: full attention at every interval-th layer
        interval = parse_int(hf, "full_attention_interval", 4)
        require(interval >= 1, "full_attention_interval", f"must be >= 1, got {interval}")
        return tuple("attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))
    types = []
    for t in raw:
        require(t in _LAYER_TYPES, "layer_types", f"unknown layer type {t!r} (expected one of {sorted(_LAYER_TYPES)})")
        types.append(_LAYER_TYPES[t])
    require(len(types) == num_layers, "layer_types", f"{len(types)} entries for num_hidden_layers={num_layers}")
    return tuple(types)


def _rope(hf: dict[str, Any]) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor): plain RoPE only (transformers v5 writes rope_parameters,
    v4 top-level rope_theta / partial_rotary_factor)."""
    require(hf.get("rope_scaling") is None, "rope_scaling", f"only plain RoPE is implemented, got {hf.get('rope_scaling')}")
    rope = hf.get("rope_parameters") or {}
    require(rope.get("rope_type", rope.get("type", "default")) == "default", "rope_parameters.rope_type",
            f"only 'default' RoPE is implemented, got {rope.get('rope_type', rope.get('type'))!r}")
    unknown = sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    require(not unknown, f"rope_parameters.{unknown[0]}" if unknown else "", f"RoPE field not supported: {unknown}")
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    factor = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))
    return theta, factor


def _moe(hf: dict[str, Any], get: dict[str, Any]) -> MoEConfig | None:
    """Routed experts on every layer (None: num_experts 0, every layer a dense MLP)."""
    experts = parse_int(hf, "num_experts", get["num_experts"])
    require(experts >= 0, "num_experts", f"must be >= 0 (0: dense), got {experts}")
    if experts == 0:
        return None
    require(not hf.get("mlp_only_layers"), "mlp_only_layers",
            f"dense layers among MoE ones are not implemented, got {hf.get('mlp_only_layers')}")
    require(parse_int(hf, "decoder_sparse_step", get["decoder_sparse_step"]) == 1, "decoder_sparse_step",
            f"only 1 (every layer MoE) is implemented, got {hf.get('decoder_sparse_step')}")
    return MoEConfig(num_experts=experts, top_k=parse_int(hf, "num_experts_per_tok", get["num_experts_per_tok"]),
                     intermediate_size=parse_int(hf, "moe_intermediate_size", get["moe_intermediate_size"]),
                     router="softmax_all_topk", norm_topk_prob=bool(get["norm_topk_prob"]),
                     shared_expert_intermediate_size=parse_int(hf, "shared_expert_intermediate_size",
                                                               get["shared_expert_intermediate_size"]))


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """Map a Qwen3-Next `config.json` dict; unsupported fields or values raise naming the field."""
    check_common_fields(hf, MODEL_TYPE, _READ, _INERT, "Qwen3Next")
    get = {k: hf.get(k, v) for k, v in _DEFAULTS.items()}
    theta, factor = _rope(hf)
    num_layers = parse_int(hf, "num_hidden_layers", get["num_hidden_layers"])
    heads = parse_int(hf, "num_attention_heads", get["num_attention_heads"])
    return HybridConfig(
        model_type=MODEL_TYPE,
        vocab_size=parse_int(hf, "vocab_size", get["vocab_size"]),
        hidden_size=parse_int(hf, "hidden_size", get["hidden_size"]),
        intermediate_size=parse_int(hf, "intermediate_size", get["intermediate_size"]),
        num_hidden_layers=num_layers,
        layer_types=_layer_types(hf, num_layers),
        num_attention_heads=heads,
        num_key_value_heads=parse_int(hf, "num_key_value_heads", get["num_key_value_heads"]),
        head_dim=parse_int(hf, "head_dim", get["head_dim"]),
        position_embedding="rope",
        partial_rotary_factor=factor,
        rope_theta=theta,
        attention_bias=bool(get["attention_bias"]),
        attention_qk_norm=True,
        attention_output_gate=True,
        linear_num_key_heads=parse_int(hf, "linear_num_key_heads", get["linear_num_key_heads"]),
        linear_num_value_heads=parse_int(hf, "linear_num_value_heads", get["linear_num_value_heads"]),
        linear_key_head_dim=parse_int(hf, "linear_key_head_dim", get["linear_key_head_dim"]),
        linear_value_head_dim=parse_int(hf, "linear_value_head_dim", get["linear_value_head_dim"]),
        linear_conv_kernel_dim=parse_int(hf, "linear_conv_kernel_dim", get["linear_conv_kernel_dim"]),
        moe=_moe(hf, get),
        rms_norm_eps=float(get["rms_norm_eps"]),
        rms_norm_zero_centred=True,
        tie_word_embeddings=bool(get["tie_word_embeddings"]),
    )


def config_to_hf(c: HybridConfig) -> dict[str, Any]:
    """The `Qwen3NextConfig(**kwargs)` that builds the same model in transformers."""
    require(set(c.layer_types) <= set(_HF_LAYER_TYPES), "layer_types",
            f"Qwen3-Next layers are 'linear_attention' or 'attention', got {sorted(set(c.layer_types))}")
    require(c.position_embedding == "rope" and c.attention_qk_norm and c.attention_output_gate
            and c.rms_norm_zero_centred and c.attention_scale is None and not c.mlp_bias, "model_type",
            "a Qwen3-Next config has RoPE, gated attention with q/k norms, zero-centred norms, no MLP bias")
    require(c.moe is None or (c.moe.router == "softmax_all_topk" and c.moe.shared_expert_intermediate_size >= 1),
            "moe", "Qwen3-Next's MoE routes by softmax over every expert and has a shared expert")
    m = c.moe
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "layer_types": [_HF_LAYER_TYPES[t] for t in c.layer_types],
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta,
                            "partial_rotary_factor": c.partial_rotary_factor},
        "attention_bias": c.attention_bias,
        "linear_num_key_heads": c.linear_num_key_heads,
        "linear_num_value_heads": c.linear_num_value_heads,
        "linear_key_head_dim": c.linear_key_head_dim,
        "linear_value_head_dim": c.linear_value_head_dim,
        "linear_conv_kernel_dim": c.linear_conv_kernel_dim,
        "num_experts": m.num_experts if m else 0,
        "num_experts_per_tok": m.top_k if m else 1,
        "moe_intermediate_size": m.intermediate_size if m else 1,
        "shared_expert_intermediate_size": m.shared_expert_intermediate_size if m else 1,
        "norm_topk_prob": m.norm_topk_prob if m else True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
    }


def feed_forward(c: HybridConfig, layer_index: int) -> nn.Module:
    return SwiGLU(c.hidden_size, c.intermediate_size, bias=False) if c.moe is None else SharedExpertMoE(c)


def feed_forward_cost(c: HybridConfig, kind: str) -> FeedForward:
    """Dense: SwiGLU (3 H x I). MoE: the shared SwiGLU expert (3 H x I_s) and its gate (H x 1) plus the
    router and the routed SwiGLU experts."""
    if c.moe is None:
        return FeedForward(dense=3 * c.hidden_size * c.intermediate_size)
    shared = 3 * c.hidden_size * c.moe.shared_expert_intermediate_size + c.hidden_size
    return routed_feed_forward(c, shared, 3)


_EXPERTS = re.compile(r"^layers\.(\d+)\.feed_forward\.experts\.(gate_proj|up_proj|down_proj)$")
_RENAMES = [
    (re.compile(r"^final_layernorm\."), "model.norm."),
    (re.compile(r"^layers\.(\d+)\.pre_ff_layernorm\."), r"model.layers.\1.post_attention_layernorm."),
    (re.compile(r"^layers\.(\d+)\.feed_forward\."), r"model.layers.\1.mlp."),
]


def checkpoint_name(c: HybridConfig, name: str) -> str | tuple[str, ...]:
    """Our parameter name -> the checkpoint's; the stacked experts -> one tensor per expert."""
    experts = _EXPERTS.match(name)
    if experts:
        layer, proj = experts.groups()
        return tuple(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" for e in range(c.moe.num_experts))
    for pattern, replacement in _RENAMES:
        if pattern.search(name):
            return pattern.sub(replacement, name)
    return name if name.startswith("lm_head.") else f"model.{name}"


# ---- presets ------------------------------------------------------------------------------------
# Three Gated DeltaNet layers, then one gated-attention layer (full_attention_interval 4).
def _pattern(num_layers: int) -> tuple[str, ...]:
    return tuple("attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers))


PRESETS: dict[str, HybridConfig] = {
    # Tests (interpreter-fast): hidden 64, one period of the pattern (DDDA), 2 key / 4 value
    # DeltaNet heads of 16 (GQA-style), 4 attention heads of 16 over 2 KV heads with RoPE on a
    # quarter of each (4 channels), 4 experts top 2 renormalized, a shared expert of 32.
    "qwen3-next-tiny": HybridConfig(
        model_type=MODEL_TYPE, vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4,
        layer_types=_pattern(4), num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        position_embedding="rope", partial_rotary_factor=0.25, rope_theta=10000.0, attention_qk_norm=True,
        attention_output_gate=True, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4,
        moe=MoEConfig(num_experts=4, top_k=2, intermediate_size=32, router="softmax_all_topk", norm_topk_prob=True,
                      shared_expert_intermediate_size=32),
        rms_norm_eps=1e-6, rms_norm_zero_centred=True,
    ),
    # Qwen3-Next-80B-A3B: transformers' Qwen3NextConfig() defaults, which its docstring gives as
    # those of Qwen/Qwen3-Next-80B-A3B-Instruct (configuration_qwen3_next.py, transformers 5.24):
    # vocab 151936, hidden 2048, 48 layers (36 DeltaNet + 12 attention), 16 attention heads of 256
    # over 2 KV heads, partial rotary 0.25, DeltaNet 16 key / 32 value heads of 128, conv 4, 512
    # experts of 512, top 10 renormalized, shared expert 512, rms eps 1e-6, untied. Not confirmed
    # here against the published config.json: rope_theta (transformers' default 10000; the
    # published file is recalled as 1e7) and intermediate_size (unused: every layer is MoE).
    "qwen3-next-80b-a3b": HybridConfig(
        model_type=MODEL_TYPE, vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
        layer_types=_pattern(48), num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        position_embedding="rope", partial_rotary_factor=0.25, rope_theta=10000.0, attention_qk_norm=True,
        attention_output_gate=True, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4,
        moe=MoEConfig(num_experts=512, top_k=10, intermediate_size=512, router="softmax_all_topk",
                      norm_topk_prob=True, shared_expert_intermediate_size=512),
        rms_norm_eps=1e-6, rms_norm_zero_centred=True,
    ),
}


FAMILY = Family(model_type=MODEL_TYPE, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                feed_forward=feed_forward, checkpoint_name=checkpoint_name, feed_forward_cost=feed_forward_cost,
                presets=PRESETS, architecture="Qwen3NextForCausalLM")
