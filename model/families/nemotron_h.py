"""NemotronH (`model_type` "nemotron_h", transformers' `NemotronHForCausalLM`: NVIDIA Nemotron-H
and Nemotron 3 Nano).

Every layer is one block, `h + mixer(norm(h))`, of one of four kinds, named per layer by
`hybrid_override_pattern` (or `layers_block_type`):

    M  Mamba-2 mixer ("linear_attention")     *  GQA attention without RoPE ("full_attention")
    -  relu^2 MLP, no gate ("mlp")            E  sigmoid-routed relu^2 experts + one shared expert ("moe")

so a Mamba or attention layer carries no MLP (its feed-forward is None) and an MLP or MoE layer
is a feed-forward-only layer of the shared model. RMSNorms multiply their weight in fp32.
Tensor names are the published checkpoints' (`backbone.` prefix, one tensor per expert), which
is also what transformers' `save_pretrained` writes.

Where transformers' modeling ignores a config field that NVIDIA's original code or another
engine reads (`attention_bias`, `n_shared_experts`, `time_step_limit`, `attention_head_dim`,
`residual_in_fp32`, `tie_word_embeddings`, ...), a value that could mean something else than
what transformers computes is refused, naming the field.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from kernels.checks import require
from model.config import HybridConfig, MoEConfig
from model.families.base import (Family, FeedForward, parse_int, parse_time_step_limit, reject_unknown_fields,
                                 require_model_type, routed_feed_forward)
from model.families.nemotron_h_moe import NemotronHMoE
from model.mlp import ReluSquaredMLP

MODEL_TYPE = "nemotron_h"

# transformers' layers_block_type names -> our layer types ("mamba"/"attention": legacy names it remaps).
BLOCK_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
               "mlp": "mlp", "moe": "moe"}
PATTERN_SYMBOLS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}  # our layer type -> pattern symbol


def layer_types_from_pattern(pattern: str) -> tuple[str, ...]:
    """Nemotron-H's `hybrid_override_pattern`: M Mamba-2, * attention, - MLP, E MoE, one symbol per layer."""
    symbols = {symbol: kind for kind, symbol in PATTERN_SYMBOLS.items()}
    require(isinstance(pattern, str) and pattern, "hybrid_override_pattern", f"expected a non-empty string, "
            f"got {pattern!r}")
    bad = sorted(set(pattern) - set(symbols))
    require(not bad, "hybrid_override_pattern", f"unknown layer symbol(s) {bad} in {pattern!r} (supported: "
            f"{', '.join(f'{k} {v}' for k, v in symbols.items())})")
    return tuple(symbols[ch] for ch in pattern)


# transformers' NemotronHConfig defaults (v5.24), used for absent fields.
DEFAULT_BLOCK_TYPES = ("linear_attention", "moe", "full_attention", "mlp")  # neither pattern nor list given
DEFAULTS: dict[str, Any] = dict(
    vocab_size=131072, hidden_size=4096, tie_word_embeddings=False, num_attention_heads=32, num_key_value_heads=8,
    head_dim=128, attention_bias=False, intermediate_size=21504, mlp_hidden_act="relu2", mlp_bias=False,
    ssm_state_size=128, mamba_num_heads=128, mamba_head_dim=64, mamba_hidden_act="silu", n_groups=8, conv_kernel=4,
    expand=2, time_step_min=0.001, use_conv_bias=True, chunk_size=128, mamba_proj_bias=False,
    mamba_ssm_cache_dtype="float32", n_routed_experts=8, n_shared_experts=1, moe_intermediate_size=7688,
    moe_shared_expert_intermediate_size=7688, moe_latent_size=None, num_experts_per_tok=2, routed_scaling_factor=1.0,
    n_group=1, topk_group=1, norm_topk_prob=True, num_nextn_predict_layers=0, use_bias=False, layer_norm_epsilon=1e-5,
    residual_in_fp32=False, sliding_window=None,
)
# Other names transformers' NemotronHConfig accepts (older configs; `num_local_experts` is an alias).
# transformers lets the old name win when both are given; here both must agree.
LEGACY_NAMES = {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel", "mamba_expand": "expand",
                "mamba_dt_min": "time_step_min", "mamba_dt_limit": "time_step_limit",
                "mamba_conv_bias": "use_conv_bias", "mamba_chunk_size": "chunk_size",
                "num_local_experts": "n_routed_experts"}

_READ = frozenset(DEFAULTS) | frozenset(LEGACY_NAMES) | {
    "model_type", "hybrid_override_pattern", "layers_block_type", "num_hidden_layers", "attention_head_dim",
    "time_step_limit", "rms_norm_eps", "norm_eps", "quantization_config",
}
# Fields that do not change transformers' inference forward: initialization, dropout, kernel
# choice, training outputs, Megatron scheduling, multi-token-prediction layers (refused when
# present: num_nextn_predict_layers), and RoPE leftovers (the attention has no position embedding).
_INERT = frozenset({
    "time_step_max", "time_step_floor", "mamba_dt_max", "mamba_dt_init_floor", "rescale_prenorm_residual",
    "hidden_dropout", "num_logits_to_keep", "use_mamba_kernels", "output_router_logits", "moe_shared_expert_overlap",
    "mtp_layers_block_type", "mtp_hybrid_override_pattern", "auto_map", "rope_theta", "partial_rotary_factor",
})


def _normalized(hf: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in and legacy names mapped onto the current ones."""
    out = dict(DEFAULTS)
    out.update({k: v for k, v in hf.items() if k not in LEGACY_NAMES})
    for old, new in LEGACY_NAMES.items():
        if old in hf:
            require(new not in hf or hf[new] == hf[old], old, f"{hf[old]!r} disagrees with {new}={hf.get(new)!r}")
            out[new] = hf[old]
    return out


def layer_types_from_hf(hf: dict[str, Any]) -> tuple[str, ...]:
    """Per layer "mamba" / "attention" / "mlp" / "moe" from layers_block_type or hybrid_override_pattern."""
    pattern = hf.get("hybrid_override_pattern")
    from_pattern = None if pattern is None else layer_types_from_pattern(pattern)
    blocks = hf.get("layers_block_type")
    if blocks is None:
        return from_pattern if pattern is not None else tuple(BLOCK_TYPES[b] for b in DEFAULT_BLOCK_TYPES)
    require(isinstance(blocks, (list, tuple)) and blocks, "layers_block_type", f"expected a non-empty list, "
            f"got {blocks!r}")
    bad = sorted({str(b) for b in blocks} - set(BLOCK_TYPES))
    require(not bad, "layers_block_type", f"unknown block type(s) {bad}; supported: {sorted(BLOCK_TYPES)}")
    types = tuple(BLOCK_TYPES[b] for b in blocks)
    # transformers keeps layers_block_type when both are given; they must agree
    require(from_pattern is None or types == from_pattern, "hybrid_override_pattern",
            f"{pattern!r} disagrees with layers_block_type {list(blocks)}")
    return types


def _check_refused(h: dict[str, Any], head_dim: int) -> None:
    """Values transformers' NemotronH does not compute (or computes unlike the field's meaning)."""
    require(h.get("quantization_config") is None, "quantization_config", "quantized checkpoints are not supported")
    require(h["mlp_hidden_act"] == "relu2", "mlp_hidden_act",
            f"only 'relu2' is implemented, got {h['mlp_hidden_act']!r}")
    require(h["mamba_hidden_act"] == "silu", "mamba_hidden_act",
            f"only 'silu' is implemented (the conv activation), got {h['mamba_hidden_act']!r}")
    require(not h["attention_bias"], "attention_bias", "transformers' NemotronH attention has no biases "
            "whatever this says; a true value is ambiguous")
    require(not h["residual_in_fp32"], "residual_in_fp32", "transformers' NemotronH ignores it (residuals "
            "stay in the model dtype); a true value is ambiguous")
    require(not h["tie_word_embeddings"], "tie_word_embeddings", "transformers' NemotronH never ties lm_head "
            "to the embedding; a true value is ambiguous")
    require(h["sliding_window"] is None, "sliding_window", f"only full attention is implemented, got "
            f"{h['sliding_window']!r}")
    require(h["mamba_ssm_cache_dtype"] == "float32", "mamba_ssm_cache_dtype",
            f"the SSM state pools are fp32, got {h['mamba_ssm_cache_dtype']!r}")
    require(h["mamba_proj_bias"] == h["use_bias"], "mamba_proj_bias", f"{h['mamba_proj_bias']} disagrees with "
            f"use_bias={h['use_bias']} (transformers gives the Mamba projections a bias iff use_bias)")
    require(h["moe_latent_size"] is None, "moe_latent_size", f"latent MoE projections are not implemented, got "
            f"{h['moe_latent_size']!r}")
    require(parse_int(h, "num_nextn_predict_layers", 0) == 0, "num_nextn_predict_layers",
            "multi-token-prediction layers are not supported")
    if h.get("attention_head_dim") is not None:  # the original configs' name; transformers reads head_dim
        require(h["attention_head_dim"] == head_dim, "attention_head_dim",
                f"{h['attention_head_dim']} disagrees with head_dim={head_dim}, which transformers uses")
    for name in ("rms_norm_eps", "norm_eps"):  # written by some exports; transformers reads layer_norm_epsilon
        if h.get(name) is not None:
            require(float(h[name]) == float(h["layer_norm_epsilon"]), name,
                    f"{h[name]} disagrees with layer_norm_epsilon={h['layer_norm_epsilon']}, which transformers uses")


def _dt_limit(h: dict[str, Any]) -> tuple[float, float]:
    """transformers' NemotronH clamps dt to (time_step_min, inf) and never reads time_step_limit."""
    lo = float(h["time_step_min"])
    require(math.isfinite(lo) and lo >= 0, "time_step_min", f"must be a finite float >= 0, got {lo}")
    given = parse_time_step_limit(h.get("time_step_limit"))
    require(given in ((0.0, math.inf), (lo, math.inf)), "time_step_limit",
            f"{list(given)}: transformers' NemotronH ignores time_step_limit and clamps dt to (time_step_min, inf) = "
            f"({lo}, inf); only [0, inf] or [time_step_min, inf] is unambiguous")
    return (lo, math.inf)


def _moe_from_hf(h: dict[str, Any]) -> MoEConfig:
    require(parse_int(h, "n_shared_experts", 1) == 1, "n_shared_experts",
            f"transformers' NemotronH builds exactly one shared expert, got {h['n_shared_experts']}")
    shared = parse_int(h, "moe_shared_expert_intermediate_size", 0)
    require(shared >= 1, "moe_shared_expert_intermediate_size", f"must be >= 1, got {shared}")
    require(isinstance(h["norm_topk_prob"], bool), "norm_topk_prob", f"must be a bool, got {h['norm_topk_prob']!r}")
    return MoEConfig(
        num_experts=parse_int(h, "n_routed_experts", 0), top_k=parse_int(h, "num_experts_per_tok", 0),
        intermediate_size=parse_int(h, "moe_intermediate_size", 0), router="sigmoid_grouped_topk",
        n_group=parse_int(h, "n_group", 1), topk_group=parse_int(h, "topk_group", 1),
        norm_topk_prob=h["norm_topk_prob"], routed_scaling_factor=float(h["routed_scaling_factor"]),
        shared_expert_intermediate_size=shared)


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """Map an HF NemotronH `config.json` dict; unsupported fields or values raise naming the field."""
    require_model_type(hf, MODEL_TYPE)
    reject_unknown_fields(hf, _READ, _INERT, "NemotronH")
    h = _normalized(hf)
    types = layer_types_from_hf(h)
    if h.get("num_hidden_layers") is not None:  # transformers only warns and follows the layer list
        require(h["num_hidden_layers"] == len(types), "num_hidden_layers",
                f"{h['num_hidden_layers']} disagrees with the {len(types)} layers of the layer pattern")
    head_dim = parse_int(h, "head_dim", 128)
    _check_refused(h, head_dim)
    heads = parse_int(h, "num_attention_heads", 32)
    kv_heads = heads if h["num_key_value_heads"] is None else parse_int(h, "num_key_value_heads", 8)
    require(heads % kv_heads == 0, "num_key_value_heads", f"{kv_heads} must divide num_attention_heads={heads}")
    m_heads, groups = parse_int(h, "mamba_num_heads", 128), parse_int(h, "n_groups", 8)
    require(m_heads % groups == 0, "n_groups", f"{groups} must divide mamba_num_heads={m_heads}")
    return HybridConfig(
        model_type=MODEL_TYPE,
        vocab_size=parse_int(h, "vocab_size", 0),
        hidden_size=parse_int(h, "hidden_size", 0),
        intermediate_size=parse_int(h, "intermediate_size", 0),
        num_hidden_layers=len(types),
        layer_types=types,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        position_embedding="none",
        attention_bias=False,
        mlp_bias=bool(h["mlp_bias"]),
        mamba_n_heads=m_heads,
        mamba_d_head=parse_int(h, "mamba_head_dim", 64),
        mamba_n_groups=groups,
        mamba_d_state=parse_int(h, "ssm_state_size", 128),
        mamba_d_conv=parse_int(h, "conv_kernel", 4),
        mamba_expand=parse_int(h, "expand", 2),  # not used by the math: d_inner = mamba_num_heads * mamba_head_dim
        mamba_chunk_size=parse_int(h, "chunk_size", 128),
        mamba_conv_bias=bool(h["use_conv_bias"]),
        mamba_proj_bias=bool(h["use_bias"]),
        time_step_limit=_dt_limit(h),
        moe=_moe_from_hf(h) if "moe" in types else None,
        rms_norm_eps=float(h["layer_norm_epsilon"]),
        rms_norm_weight_in_fp32=True,
        tie_word_embeddings=False,
    )


def config_to_hf(c: HybridConfig) -> dict[str, Any]:
    """The `NemotronHConfig(**kwargs)` that builds the same model in transformers."""
    require(c.position_embedding == "none" and c.attention_scale is None and not c.attention_bias
            and c.rms_norm_weight_in_fp32 and not c.tie_word_embeddings and c.time_step_limit[1] == math.inf
            and (c.embedding_multiplier, c.residual_multiplier, c.logits_scaling) == (1.0, 1.0, 1.0), "model_type",
            "this config uses features transformers' NemotronH does not have")
    hf = {
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "hybrid_override_pattern": "".join(PATTERN_SYMBOLS[t] for t in c.layer_types),
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "attention_bias": False,
        "intermediate_size": c.intermediate_size,
        "mlp_hidden_act": "relu2",
        "mlp_bias": c.mlp_bias,
        "mamba_num_heads": c.mamba_n_heads,
        "mamba_head_dim": c.mamba_d_head,
        "n_groups": c.mamba_n_groups,
        "ssm_state_size": c.mamba_d_state,
        "conv_kernel": c.mamba_d_conv,
        "expand": c.mamba_expand,
        "chunk_size": c.mamba_chunk_size,
        "use_conv_bias": c.mamba_conv_bias,
        "use_bias": c.mamba_proj_bias,
        "mamba_proj_bias": c.mamba_proj_bias,
        "mamba_hidden_act": "silu",
        "time_step_min": c.time_step_limit[0],
        "layer_norm_epsilon": c.rms_norm_eps,
        "residual_in_fp32": False,
        "tie_word_embeddings": False,
    }
    if c.moe is not None:
        m = c.moe
        require(m.router == "sigmoid_grouped_topk" and m.shared_expert_intermediate_size >= 1, "moe",
                "NemotronH's MoE routes by sigmoid_grouped_topk and has one shared expert")
        hf.update(n_routed_experts=m.num_experts, num_experts_per_tok=m.top_k,
                  moe_intermediate_size=m.intermediate_size,
                  moe_shared_expert_intermediate_size=m.shared_expert_intermediate_size, n_shared_experts=1,
                  n_group=m.n_group, topk_group=m.topk_group, norm_topk_prob=m.norm_topk_prob,
                  routed_scaling_factor=m.routed_scaling_factor)
    return hf


def feed_forward(c: HybridConfig, layer_index: int) -> nn.Module | None:
    """The "-" and "E" layers' module; Mamba and attention layers carry none."""
    kind = c.layer_types[layer_index]
    if kind == "mlp":
        return ReluSquaredMLP(c.hidden_size, c.intermediate_size, c.mlp_bias)
    if kind == "moe":
        return NemotronHMoE(c)
    return None


def feed_forward_cost(c: HybridConfig, kind: str) -> FeedForward:
    """relu^2 MLP (up, down) as a "-" layer; relu^2 experts + one shared relu^2 expert as "E"."""
    if kind == "mlp":
        return FeedForward(dense=2 * c.hidden_size * c.intermediate_size)
    if kind == "moe":
        return routed_feed_forward(c, 2 * c.hidden_size * c.moe.shared_expert_intermediate_size, 2)
    return FeedForward()  # a mixer layer carries no feed-forward


_SUBMODULES = ("input_layernorm", "pre_ff_layernorm", "mamba", "self_attn", "feed_forward")


def checkpoint_name(c: HybridConfig, name: str) -> str | tuple[str, ...]:
    """`layers.3.mamba.A_log` -> `backbone.layers.3.mixer.A_log`; both layer norms -> `...norm.weight`;
    stacked experts -> one `...mixer.experts.{j}.up_proj.weight` per expert."""
    top = {"embed_tokens.weight": "backbone.embeddings.weight", "final_layernorm.weight": "backbone.norm_f.weight",
           "lm_head.weight": "lm_head.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    require(len(parts) >= 4 and parts[0] == "layers" and parts[2] in _SUBMODULES, "name",
            f"no NemotronH checkpoint tensor for parameter {name!r}")
    prefix = f"backbone.layers.{parts[1]}"
    if parts[2].endswith("layernorm"):
        return f"{prefix}.norm.{'.'.join(parts[3:])}"
    rest = ".".join(parts[3:])
    if parts[2] == "feed_forward" and rest in ("experts.up_proj", "experts.down_proj"):
        proj = parts[4]
        return tuple(f"{prefix}.mixer.experts.{j}.{proj}.weight" for j in range(c.moe.num_experts))
    return f"{prefix}.mixer.{rest}"


# ---- presets ------------------------------------------------------------------------------------
def _nemotron_h(pattern: str, **shapes) -> HybridConfig:
    """What every Nemotron-H shares: NoPE attention, no biases, relu^2 MLPs (set by the family), fp32
    norm-weight multiply, eps 1e-5, dt clamped below at time_step_min = 0.001, untied head."""
    fixed = dict(model_type=MODEL_TYPE, num_hidden_layers=len(pattern), layer_types=layer_types_from_pattern(pattern),
                 position_embedding="none", time_step_limit=(0.001, math.inf), rms_norm_eps=1e-5,
                 rms_norm_weight_in_fp32=True, tie_word_embeddings=False)
    return HybridConfig(**fixed, **shapes)


PRESETS: dict[str, HybridConfig] = {
    # Tests: every layer kind ("ME*M-E": Mamba, MoE, attention, Mamba, MLP, MoE) at interpreter-fast
    # shapes. head_dim 24 != hidden / heads and Mamba d_inner 4 x 16 = 64 != expand * hidden, as
    # Nemotron-H allows; 8 experts in 4 groups, 2 groups and 2 experts per token, so the grouped
    # routing is live (the published models use one group).
    "nemotron-h-tiny": _nemotron_h(
        "ME*M-E", vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=24, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16,
        moe=MoEConfig(num_experts=8, top_k=2, intermediate_size=32, router="sigmoid_grouped_topk", n_group=4,
                      topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, shared_expert_intermediate_size=48),
    ),
    # The CPU experiment size of the Nemotron-H layout (15.6 M parameters, 8.4 M of them embedding and
    # head), at the "small" preset's hidden 256 and vocabulary: Nemotron 3 Nano's alternation of
    # Mamba and MoE layers plus Nemotron-H-8B's dense relu^2 MLP layers, one attention layer in ten.
    # Nemotron's Mamba shapes scaled down (head dim 64, N = 128, d_conv 4, chunk 128, grouped B/C),
    # Nano's routing (one group, sigmoid, normalized top-k times 2.5) over 16 experts, top 4.
    "nemotron-h-small-cpu": _nemotron_h(
        "MEM-M*MEM-", vocab_size=16384, hidden_size=256, intermediate_size=768, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=2, mamba_d_state=128,
        mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=128,
        moe=MoEConfig(num_experts=16, top_k=4, intermediate_size=192, router="sigmoid_grouped_topk",
                      norm_topk_prob=True, routed_scaling_factor=2.5, shared_expert_intermediate_size=384),
    ),
    # nvidia/Nemotron-H-8B-Base-8K, random weights (GPU timing only). Shapes are transformers'
    # NemotronHConfig defaults, which are this model's (hidden 4096, MLP 21504, 32/8 heads of 128,
    # Mamba 128 heads x 64, 8 groups, N = 128), and the 52-layer pattern of NVIDIA's configuration
    # file (24 Mamba-2, 24 MLP, 4 attention, as the Nemotron-H paper, arXiv 2504.03624, lists).
    # Not confirmed against the config.json itself (no network here): the pattern, the 131072
    # vocabulary and chunk 128; the parameter count, 8,100,852,736, matches a published
    # per-tensor breakdown of the checkpoint.
    "nemotron-h-8b": _nemotron_h(
        "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-", vocab_size=131072, hidden_size=4096,
        intermediate_size=21504, num_attention_heads=32, num_key_value_heads=8, head_dim=128, mamba_n_heads=128,
        mamba_d_head=64, mamba_n_groups=8, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=128,
    ),
    # nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 config.json (as quoted in public code; the model
    # card: 52 layers = 23 Mamba-2 + 23 MoE + 6 attention, 128 experts + 1 shared, 6 per token,
    # 31.6 B total / ~3.5 B active parameters: this preset has 31.58 B / 3.58 B). Random weights:
    # GPU timing only. Mamba d_inner = 64 x 64 = 4096, not expand * hidden.
    "nemotron-3-nano": _nemotron_h(
        "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", vocab_size=131072, hidden_size=2688,
        intermediate_size=1856, num_attention_heads=32, num_key_value_heads=2, head_dim=128, mamba_n_heads=64,
        mamba_d_head=64, mamba_n_groups=8, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=128,
        moe=MoEConfig(num_experts=128, top_k=6, intermediate_size=1856, router="sigmoid_grouped_topk", n_group=1,
                      topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                      shared_expert_intermediate_size=3712),
    ),
}


FAMILY = Family(model_type=MODEL_TYPE, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                feed_forward=feed_forward, checkpoint_name=checkpoint_name, feed_forward_cost=feed_forward_cost,
                presets=PRESETS, architecture="NemotronHForCausalLM")
