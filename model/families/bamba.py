"""Bamba (`model_type` "bamba", transformers' `BambaForCausalLM`): every layer is a Mamba-2 mixer
or GQA attention with partial RoPE, followed by a SwiGLU MLP. Tensor names are transformers'
own with the decoder's `model.` prefix."""

from __future__ import annotations

from typing import Any

from kernels.checks import require
from model.config import HybridConfig
from model.families.base import (Family, FeedForward, check_common_fields, mamba_hf_fields, parse_int,
                                 parse_mamba_d_head, parse_time_step_limit)
from model.mlp import SwiGLU

MODEL_TYPE = "bamba"

# Fields of BambaConfig that the shared config reads (all of them change the forward pass).
_READ = frozenset({
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "attn_layer_indices",
    "num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters", "rope_theta", "rope_scaling",
    "partial_rotary_factor", "attn_rotary_emb", "attention_bias", "mlp_bias", "hidden_act", "mamba_n_heads",
    "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_chunk_size",
    "mamba_conv_bias", "mamba_proj_bias", "time_step_limit", "rms_norm_eps", "tie_word_embeddings",
    "quantization_config",
})
# Bamba-only fields that do not change an inference forward (`mamba_dt_rank` and
# `use_mamba_kernels` are leftovers of the original conversion).
_INERT = frozenset({"z_loss_coefficient", "num_logits_to_keep", "mamba_dt_rank", "use_mamba_kernels"})


def _check_supported(hf: dict[str, Any]) -> None:
    """Refuse another model type, unknown fields, and activations, quantization or RoPE scaling we lack."""
    check_common_fields(hf, MODEL_TYPE, _READ, _INERT, "Bamba")
    require(hf.get("rope_scaling") is None, "rope_scaling", f"only plain RoPE is implemented, got {hf.get('rope_scaling')}")


def _rope(hf: dict[str, Any]) -> tuple[float, float]:
    """(partial_rotary_factor, rope_theta). transformers v5 keeps `rope_parameters`; v4 files carry a
    top-level rope_theta. Both versions hardcode partial_rotary_factor = 0.5 unless rope_parameters
    says otherwise."""
    rope = hf.get("rope_parameters") or {}
    require(rope.get("rope_type", rope.get("type", "default")) == "default", "rope_parameters.rope_type",
            f"only 'default' RoPE is implemented, got {rope.get('rope_type', rope.get('type'))!r}")
    unknown_rope = sorted(set(rope) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    require(not unknown_rope, f"rope_parameters.{unknown_rope[0]}" if unknown_rope else "",
            f"RoPE field not supported: {unknown_rope}")
    top_partial = hf.get("partial_rotary_factor", 0.5)
    require(top_partial == 0.5, "partial_rotary_factor", "transformers' Bamba ignores a top-level value and uses "
            f"0.5; put another value in rope_parameters (got {top_partial})")
    return float(rope.get("partial_rotary_factor", 0.5)), float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _check_rotary_emb(hf: dict[str, Any], rotary_dim: int) -> None:
    """`attn_rotary_emb`, written by the original Bamba conversion, must agree with the rotary dim."""
    if "attn_rotary_emb" in hf:
        require(int(hf["attn_rotary_emb"]) == rotary_dim, "attn_rotary_emb",
                f"{hf['attn_rotary_emb']} disagrees with head_dim * partial_rotary_factor = {rotary_dim}")


def config_from_hf(hf: dict[str, Any]) -> HybridConfig:
    """Map an HF Bamba `config.json` dict; unsupported fields or values raise naming the field."""
    _check_supported(hf)
    partial, rope_theta = _rope(hf)
    d = HybridConfig()  # transformers' defaults for absent fields
    hidden = int(hf.get("hidden_size", d.hidden_size))
    heads = int(hf.get("num_attention_heads", d.num_attention_heads))
    kv_heads = hf.get("num_key_value_heads", d.num_key_value_heads)
    head_dim = int(hf.get("head_dim") or hidden // heads)
    expand = parse_int(hf, "mamba_expand", d.mamba_expand)
    m_heads = int(hf.get("mamba_n_heads", d.mamba_n_heads))
    d_head = parse_mamba_d_head(hf, expand, hidden, m_heads)
    _check_rotary_emb(hf, int(head_dim * partial))
    return HybridConfig(
        model_type=MODEL_TYPE,
        vocab_size=int(hf.get("vocab_size", d.vocab_size)),
        hidden_size=hidden,
        intermediate_size=int(hf.get("intermediate_size", d.intermediate_size)),
        num_hidden_layers=int(hf.get("num_hidden_layers", d.num_hidden_layers)),
        attn_layer_indices=tuple(hf.get("attn_layer_indices") or ()),
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads if kv_heads is not None else heads),
        head_dim=head_dim,
        partial_rotary_factor=partial,
        rope_theta=rope_theta,
        attention_bias=bool(hf.get("attention_bias", d.attention_bias)),
        mlp_bias=bool(hf.get("mlp_bias", d.mlp_bias)),
        mamba_n_heads=m_heads,
        mamba_d_head=d_head,
        mamba_n_groups=int(hf.get("mamba_n_groups", d.mamba_n_groups)),
        mamba_d_state=int(hf.get("mamba_d_state", d.mamba_d_state)),
        mamba_d_conv=int(hf.get("mamba_d_conv", d.mamba_d_conv)),
        mamba_expand=expand,
        mamba_chunk_size=int(hf.get("mamba_chunk_size", d.mamba_chunk_size)),
        mamba_conv_bias=bool(hf.get("mamba_conv_bias", d.mamba_conv_bias)),
        mamba_proj_bias=bool(hf.get("mamba_proj_bias", d.mamba_proj_bias)),
        time_step_limit=parse_time_step_limit(hf.get("time_step_limit", d.time_step_limit)),
        rms_norm_eps=float(hf.get("rms_norm_eps", d.rms_norm_eps)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", d.tie_word_embeddings)),
    )


def config_to_hf(c: HybridConfig) -> dict[str, Any]:
    """The `BambaConfig(**kwargs)` that builds the same model in transformers."""
    require(set(c.layer_types) <= {"mamba", "attention"} and c.moe is None and c.position_embedding == "rope"
            and c.attention_scale is None and not c.rms_norm_weight_in_fp32
            and (c.embedding_multiplier, c.residual_multiplier, c.logits_scaling) == (1.0, 1.0, 1.0), "model_type",
            "this config uses features transformers' Bamba does not have")
    return {
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "attn_layer_indices": list(c.attn_layer_indices),
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta,
                            "partial_rotary_factor": c.partial_rotary_factor},
        "attention_bias": c.attention_bias,
        "mlp_bias": c.mlp_bias,
        **mamba_hf_fields(c),
        "rms_norm_eps": c.rms_norm_eps,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
    }


def feed_forward(c: HybridConfig, layer_index: int) -> SwiGLU:
    return SwiGLU(c.hidden_size, c.intermediate_size, c.mlp_bias)


def feed_forward_cost(c: HybridConfig, kind: str) -> FeedForward:
    """SwiGLU gate, up, down after every layer (`model.mlp.SwiGLU`)."""
    return FeedForward(dense=3 * c.hidden_size * c.intermediate_size)


def checkpoint_name(c: HybridConfig, name: str) -> str:
    """`layers.3.mamba.A_log` -> `model.layers.3.mamba.A_log`; the head keeps its name."""
    return name if name.startswith("lm_head.") else f"model.{name}"


PRESETS: dict[str, HybridConfig] = {
    # Tests: small enough for the Triton interpreter (a 40-token forward in ~1 s); two groups, a
    # 16-token scan chunk and 2:1 GQA keep every kernel path (multi-chunk, grouped B/C, GQA) live.
    "tiny": HybridConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, attn_layer_indices=(1,),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=16,
    ),
    # The main experiment's default on 2 CPU cores: Bamba's ratios at hidden 256 (attention
    # heads x head_dim = hidden, 4:1 GQA, Mamba P = 64, N = 128, d_conv 4, chunk 256, MLP 3x),
    # one attention layer in six (Bamba-9B: 3 in 32). 14.4 M parameters (8.4 M of them embedding
    # and head). A cold 32772-token prefill in 8192-token chunks took 24 s (2 threads) and 28 s
    # (1 thread) on the shared 2-core CPU; attention grows with the cached prefix, so the last
    # chunk (32K keys) costs 3x the first, which is why there is one attention layer.
    "small": HybridConfig(
        vocab_size=16384, hidden_size=256, intermediate_size=768, num_hidden_layers=6, attn_layer_indices=(3,),
        num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=256,
    ),
    # Bamba-9B's shapes (ibm-fms/Bamba-9B config.json), random weights: GPU timing only.
    "bamba-9b": HybridConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        attn_layer_indices=(9, 18, 27), num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        mamba_n_heads=128, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
}


FAMILY = Family(model_type=MODEL_TYPE, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                feed_forward=feed_forward, checkpoint_name=checkpoint_name, feed_forward_cost=feed_forward_cost,
                presets=PRESETS, architecture="BambaForCausalLM")
